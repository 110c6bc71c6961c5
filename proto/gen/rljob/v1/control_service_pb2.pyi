from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_PHASE_UNSPECIFIED: _ClassVar[RunPhase]
    RUN_PHASE_STARTING: _ClassVar[RunPhase]
    RUN_PHASE_RUNNING: _ClassVar[RunPhase]
    RUN_PHASE_STOPPING: _ClassVar[RunPhase]
    RUN_PHASE_SUCCEEDED: _ClassVar[RunPhase]
    RUN_PHASE_FAILED: _ClassVar[RunPhase]

class FailureReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_REASON_UNSPECIFIED: _ClassVar[FailureReason]
    FAILURE_REASON_PROGRESS_DEADLINE: _ClassVar[FailureReason]
    FAILURE_REASON_ACTIVE_DEADLINE: _ClassVar[FailureReason]
RUN_PHASE_UNSPECIFIED: RunPhase
RUN_PHASE_STARTING: RunPhase
RUN_PHASE_RUNNING: RunPhase
RUN_PHASE_STOPPING: RunPhase
RUN_PHASE_SUCCEEDED: RunPhase
RUN_PHASE_FAILED: RunPhase
FAILURE_REASON_UNSPECIFIED: FailureReason
FAILURE_REASON_PROGRESS_DEADLINE: FailureReason
FAILURE_REASON_ACTIVE_DEADLINE: FailureReason

class PoolStatus(_message.Message):
    __slots__ = ("desired", "ready", "drained", "idle_fraction")
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    IDLE_FRACTION_FIELD_NUMBER: _ClassVar[int]
    desired: int
    ready: int
    drained: _containers.RepeatedScalarFieldContainer[str]
    idle_fraction: float
    def __init__(self, desired: _Optional[int] = ..., ready: _Optional[int] = ..., drained: _Optional[_Iterable[str]] = ..., idle_fraction: _Optional[float] = ...) -> None: ...

class SampleCounts(_message.Message):
    __slots__ = ("generated", "scored", "trained", "discarded_stale", "excluded_reward_error", "lost_replica", "reward_retries", "waiting_for_reward", "filtered", "filtered_groups", "masked_truncated", "episodes", "turns", "episode_restarts", "environment_errors", "excluded_environment_error", "episodes_in_flight", "failed_prompts", "failed_samples")
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    SCORED_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_STALE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_REWARD_ERROR_FIELD_NUMBER: _ClassVar[int]
    LOST_REPLICA_FIELD_NUMBER: _ClassVar[int]
    REWARD_RETRIES_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_REWARD_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    FILTERED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    MASKED_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_ENVIRONMENT_ERROR_FIELD_NUMBER: _ClassVar[int]
    EPISODES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    FAILED_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    generated: int
    scored: int
    trained: int
    discarded_stale: int
    excluded_reward_error: int
    lost_replica: int
    reward_retries: int
    waiting_for_reward: int
    filtered: int
    filtered_groups: int
    masked_truncated: int
    episodes: int
    turns: int
    episode_restarts: int
    environment_errors: int
    excluded_environment_error: int
    episodes_in_flight: int
    failed_prompts: int
    failed_samples: int
    def __init__(self, generated: _Optional[int] = ..., scored: _Optional[int] = ..., trained: _Optional[int] = ..., discarded_stale: _Optional[int] = ..., excluded_reward_error: _Optional[int] = ..., lost_replica: _Optional[int] = ..., reward_retries: _Optional[int] = ..., waiting_for_reward: _Optional[int] = ..., filtered: _Optional[int] = ..., filtered_groups: _Optional[int] = ..., masked_truncated: _Optional[int] = ..., episodes: _Optional[int] = ..., turns: _Optional[int] = ..., episode_restarts: _Optional[int] = ..., environment_errors: _Optional[int] = ..., excluded_environment_error: _Optional[int] = ..., episodes_in_flight: _Optional[int] = ..., failed_prompts: _Optional[int] = ..., failed_samples: _Optional[int] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("phase", "step", "total_steps", "policy_version", "reward_mean", "reward_std", "staleness_mean", "staleness_max", "samples_per_second", "rollout", "trainer", "reward", "samples", "checkpoint", "message", "elapsed_seconds", "reward_wait_reason", "run_id", "restarts", "eval", "environment", "seconds_since_step", "failure_reason", "loop_blocked")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARD_STD_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MEAN_FIELD_NUMBER: _ClassVar[int]
    STALENESS_MAX_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    TRAINER_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REWARD_WAIT_REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    EVAL_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_STEP_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    LOOP_BLOCKED_FIELD_NUMBER: _ClassVar[int]
    phase: RunPhase
    step: int
    total_steps: int
    policy_version: int
    reward_mean: float
    reward_std: float
    staleness_mean: float
    staleness_max: int
    samples_per_second: float
    rollout: PoolStatus
    trainer: PoolStatus
    reward: PoolStatus
    samples: SampleCounts
    checkpoint: str
    message: str
    elapsed_seconds: float
    reward_wait_reason: str
    run_id: str
    restarts: _containers.RepeatedCompositeFieldContainer[Restart]
    eval: EvalResult
    environment: PoolStatus
    seconds_since_step: float
    failure_reason: FailureReason
    loop_blocked: str
    def __init__(self, phase: _Optional[_Union[RunPhase, str]] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., reward_mean: _Optional[float] = ..., reward_std: _Optional[float] = ..., staleness_mean: _Optional[float] = ..., staleness_max: _Optional[int] = ..., samples_per_second: _Optional[float] = ..., rollout: _Optional[_Union[PoolStatus, _Mapping]] = ..., trainer: _Optional[_Union[PoolStatus, _Mapping]] = ..., reward: _Optional[_Union[PoolStatus, _Mapping]] = ..., samples: _Optional[_Union[SampleCounts, _Mapping]] = ..., checkpoint: _Optional[str] = ..., message: _Optional[str] = ..., elapsed_seconds: _Optional[float] = ..., reward_wait_reason: _Optional[str] = ..., run_id: _Optional[str] = ..., restarts: _Optional[_Iterable[_Union[Restart, _Mapping]]] = ..., eval: _Optional[_Union[EvalResult, _Mapping]] = ..., environment: _Optional[_Union[PoolStatus, _Mapping]] = ..., seconds_since_step: _Optional[float] = ..., failure_reason: _Optional[_Union[FailureReason, str]] = ..., loop_blocked: _Optional[str] = ...) -> None: ...

class EvalResult(_message.Message):
    __slots__ = ("step", "policy_version", "reward_mean", "rewards", "pass_at_k")
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class PassAtKEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    PASS_AT_K_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    reward_mean: float
    rewards: _containers.ScalarMap[str, float]
    pass_at_k: _containers.ScalarMap[int, float]
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., reward_mean: _Optional[float] = ..., rewards: _Optional[_Mapping[str, float]] = ..., pass_at_k: _Optional[_Mapping[int, float]] = ...) -> None: ...

class Restart(_message.Message):
    __slots__ = ("pool", "replica", "cause", "replacement", "seconds", "step")
    POOL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    pool: str
    replica: str
    cause: str
    replacement: str
    seconds: float
    step: int
    def __init__(self, pool: _Optional[str] = ..., replica: _Optional[str] = ..., cause: _Optional[str] = ..., replacement: _Optional[str] = ..., seconds: _Optional[float] = ..., step: _Optional[int] = ...) -> None: ...

class GetJobStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetJobStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    def __init__(self, status: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class WatchJobStatusRequest(_message.Message):
    __slots__ = ("interval_seconds",)
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    interval_seconds: float
    def __init__(self, interval_seconds: _Optional[float] = ...) -> None: ...

class WatchJobStatusResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: JobStatus
    def __init__(self, status: _Optional[_Union[JobStatus, _Mapping]] = ...) -> None: ...

class StopRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class StopResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    def __init__(self, accepted: _Optional[bool] = ...) -> None: ...
