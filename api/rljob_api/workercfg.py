"""Each worker's config, derived from the RLJob spec by one function.

The driver derives them once per run (its run plan) and hands each pool its part; the operator
derives them once per reconcile, for the ports it renders. Both call `derive_worker_configs`, so a
cluster run and a local run of the same file configure their workers identically.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import Field

from .algorithm import Algorithm, resolve_algorithm
from .base import Model
from .environment import EnvironmentSpec
from .pools import Engine, SamplingSpec, WeightUpdate
from .reward import OnError, ReplicaRange, RewardDispatch, RewardFunction, ScalingSpec
from .spec import CheckpointSpec, DataSpec, RLJob, RLJobSpec, WeightSyncSpec
from .tracking import LoggingSpec

Pool = Literal["rollout", "trainer", "reward", "environment"]
POOLS: tuple[Pool, ...] = ("rollout", "trainer", "reward", "environment")
# The pools the elastic policy sizes (the controller decides, the operator applies on a cluster).
ELASTIC_POOLS: tuple[Pool, ...] = ("reward", "environment")
# The file the driver writes its last JobStatus to (JSON) as it exits: in a driver pod, the container's
# termination message, which the operator reads once the ControlService is gone.
TERMINATION_LOG_ENV = "RLJOB_TERMINATION_LOG"
# The file holding the job's token, which every internal gRPC call carries (rljob_workers.common.auth).
TOKEN_FILE_ENV = "RLJOB_TOKEN_FILE"
# Ray's system config for every Ray node of a job, local or in a pod. The raylet connects to its own
# object store right after starting it, from another thread; when the store is not listening yet, Ray's
# socket connect sleeps raylet_client_connect_timeout_milliseconds (1 s by default) before its next try: a
# whole second added to a start that often finds the store not listening yet. The same 10 s in all, in 20 ms
# steps.
# Read-only: ray.init adds its own settings to the dict it is given (pass a copy).
RAY_SYSTEM_CONFIG: Mapping[str, int] = MappingProxyType(
    {"raylet_client_connect_timeout_milliseconds": 20, "raylet_client_num_connect_attempts": 500}
)


# The environment of a local Ray node's processes and of the driver that starts it. Ray's metric exporters
# (OpenTelemetry's periodic reader, OpenCensus's harvester) run on native threads that ray.shutdown() does
# not stop: each start in a process leaves one more of each. One exporting while the interpreter destroys
# its statics crashes the process at exit (pytest's SIGSEGV after its summary: the exporter logs through
# spdlog's registry, already gone). A local node's metrics have no reader (it runs no dashboard); with
# OpenTelemetry off, no exporter thread outlives ray.shutdown().
RAY_LOCAL_NODE_ENV = {"RAY_enable_open_telemetry": "0"}


def ray_system_config_env() -> dict[str, str]:
    """RAY_SYSTEM_CONFIG as the environment variables each of Ray's processes reads it from (RAY_<name>):
    how a Ray pod, started by KubeRay's `ray start`, gets it."""
    return {f"RAY_{name}": str(value) for name, value in RAY_SYSTEM_CONFIG.items()}


def scores_with_functions(spec: RLJobSpec) -> bool:
    """Whether the reward pool scores samples: a function that is not judgeOnly (else the environment's
    return alone is the reward, and the job has no reward pool)."""
    return any(not function.judge_only for function in spec.reward.functions)


def cluster_pools(spec: RLJobSpec) -> tuple[Pool, ...]:
    """The pools a cluster renders a worker group of: rollout and trainer; reward when functions score
    samples; environment for a `kind: python` or `kind: image` environment (a remote one is an endpoint outside
    the job)."""
    pools: list[Pool] = ["rollout", "trainer"]
    if scores_with_functions(spec):
        pools.append("reward")
    if spec.environment is not None and spec.environment.kind in ("python", "image"):
        pools.append("environment")
    return tuple(pools)


def pool_resource(pool: Pool) -> str:
    """The Ray custom resource that marks a node of a pool; actors of the pool require it."""
    return f"rljob.io/{pool}"


class Ports(Model):
    """Ports the workers listen on (in their pods; locally each server picks a free one)."""

    control: int = Field(50051, description="Controller's ControlService.")
    reward: int = Field(50052, description="Reward replicas' RewardService.")
    rollout: int = Field(50053, description="Rollout replicas' RolloutService.")
    weights: int = Field(50054, description="Trainer's WeightService and weight-group rendezvous base.")
    metrics: int = Field(9400, description="Prometheus metrics of the controller.")


class RolloutWorkerConfig(Model):
    """What a rollout replica needs."""

    model_path: str
    dtype: str
    engine: Engine
    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    weight_update: WeightUpdate = "drain"
    max_concurrent_prompts: int
    gpu_memory_utilization: float
    seed: int
    # Generate calls a replica serves at once, a backstop (see rljob_workers.common.limits): a call per prompt
    # group, or per episode (each plays its turns on one replica, outside maxConcurrentPrompts), every group the
    # staleness bound lets be in flight, four times over.
    max_calls: int = 1024


class RewardWorkerConfig(Model):
    """What a reward replica needs."""

    functions: list[RewardFunction]
    timeout_seconds: float
    max_in_flight: int
    gpus: int


class EnvironmentWorkerConfig(Model):
    """What an environment replica needs: its class (kind python), or the port of its pod's own container that
    serves the environment (kind image)."""

    class_ref: str | None = None
    container_port: int | None = None
    args: dict[str, Any] = {}
    max_episodes: int
    step_timeout_seconds: float
    gpus: int = 0


class TrainerWorkerConfig(Model):
    """What a trainer rank needs."""

    model_path: str
    dtype: str
    algorithm: Algorithm
    temperature: float = Field(description="Sampling temperature; log-probs are recomputed at it.")
    strategy: Literal["ddp", "fsdp"]
    world_size: int
    gpus_per_node: int
    micro_batch_size: int
    gradient_checkpointing: bool
    freeze: list[str] = Field(default_factory=list, description="Patterns of the parameters kept as loaded.")
    checkpoint: CheckpointSpec
    weight_sync: WeightSyncSpec


class ControllerConfig(Model):
    """What the controller (the RL loop's driver) needs."""

    job_name: str
    namespace: str
    model_path: str  # the policy's folder: its tokenizer's chat template renders the prompts
    data: DataSpec
    algorithm: Algorithm
    sampling: SamplingSpec
    rollout_replicas: int
    rollout_retries: int
    reward_replicas: ReplicaRange
    reward_scaling: ScalingSpec
    reward_timeout_seconds: float
    reward_retries: int
    reward_on_error: OnError
    reward_wait_timeout: float | None  # seconds one sample may wait under onError: wait; None: no limit
    reward_max_in_flight: int
    reward_dispatch: RewardDispatch
    weight_sync: WeightSyncSpec
    checkpoint: CheckpointSpec
    logging: LoggingSpec
    max_restarts: dict[Pool, int]  # per pool: replicas replaced in one run before it fails
    hung_after_seconds: float  # a replica answering no ping this long is lost (spec.supervision)
    rollout_request_timeout: float  # a Generate call's deadline (spec.rollout.requestTimeoutSeconds)
    reward_answer_deadline: float  # a sample unanswered this long after it was sent: its replica is hung
    progress_deadline_seconds: float  # no step this long: the run fails (spec.progressDeadlineSeconds)
    active_deadline_seconds: float | None = None  # the whole run's limit (spec.activeDeadlineSeconds)
    reward_functions: bool = True  # the reward pool scores samples (False: the environment's return alone)
    environment: EnvironmentSpec | None = None  # episodes against it instead of one completion per sample


class WorkerConfigs(Model):
    """Every worker's config."""

    rollout: RolloutWorkerConfig
    reward: RewardWorkerConfig
    trainer: TrainerWorkerConfig
    controller: ControllerConfig
    environment: EnvironmentWorkerConfig | None = None
    ports: Ports = Field(default_factory=Ports)
    colocate: bool = Field(False, description="Each GPU holds a rollout replica and a trainer rank (spec.colocate).")


def _with_batch_size(function: RewardFunction, group_size: int) -> RewardFunction:
    """A rule's batchSize as its replicas use it: unset, one group."""
    rule = function.rule
    if rule is None or rule.batch_size is not None:
        return function
    return function.model_copy(update={"rule": rule.model_copy(update={"batch_size": group_size})})


def reward_answer_deadline(timeout_seconds: float) -> float:
    """How long the driver waits for a reward replica's answer to one sample before it takes the replica for
    hung: the server's own deadline (reward.timeoutSeconds, retries of a remote kind included) twice over,
    room for a queue on the replica, plus 30 s for a loaded machine."""
    return 2 * timeout_seconds + 30.0


def _rollout_config(spec: RLJobSpec) -> RolloutWorkerConfig:
    rollout = spec.rollout
    return RolloutWorkerConfig(
        model_path=spec.model.path,
        dtype=spec.model.dtype,
        engine=rollout.engine,
        gpus=rollout.gpus_per_replica,
        tensor_parallel_size=rollout.tensor_parallel_size,
        pipeline_parallel_size=rollout.pipeline_parallel_size,
        data_parallel_size=rollout.data_parallel_size,
        weight_update=rollout.weight_update,
        max_concurrent_prompts=rollout.max_concurrent_prompts,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        seed=spec.algorithm.seed,
        max_calls=4 * max(rollout.max_concurrent_prompts, _samples_in_flight(spec)),
    )


def _samples_in_flight(spec: RLJobSpec) -> int:
    """Samples (episodes) the controller may have in flight: a step's groups for each version the staleness bound
    allows and the one being trained, and a held-out eval round's."""
    algorithm, evaluation = spec.algorithm, spec.data.eval
    train = algorithm.prompts_per_step * (algorithm.max_staleness + 2) * algorithm.group_size
    return train + (evaluation.prompts * evaluation.samples_per_prompt if evaluation is not None else 0)


def _controller_config(job: RLJob, algorithm: Algorithm) -> ControllerConfig:
    spec = job.spec
    return ControllerConfig(
        job_name=job.metadata.name,
        namespace=job.metadata.namespace,
        model_path=spec.model.path,
        data=spec.data,
        algorithm=algorithm,
        sampling=spec.rollout.sampling,
        rollout_replicas=spec.rollout.replicas,
        rollout_retries=spec.rollout.retries,
        reward_replicas=spec.reward.replicas,
        reward_scaling=spec.reward.scaling,
        reward_timeout_seconds=spec.reward.timeout_seconds,
        reward_retries=spec.reward.retries,
        reward_on_error=spec.reward.on_error,
        reward_wait_timeout=spec.reward.wait_timeout_seconds,
        reward_max_in_flight=spec.reward.max_in_flight_per_replica,
        reward_dispatch=spec.reward.dispatch,
        weight_sync=spec.weight_sync,
        checkpoint=spec.checkpoint,
        logging=spec.logging,
        max_restarts={
            "rollout": spec.rollout.max_restarts,
            "reward": spec.reward.max_restarts,
            "trainer": spec.trainer.max_restarts,
            "environment": spec.environment.max_restarts if spec.environment else 0,
        },
        hung_after_seconds=spec.supervision.hung_after_seconds,
        rollout_request_timeout=spec.rollout.request_timeout_seconds,
        reward_answer_deadline=reward_answer_deadline(spec.reward.timeout_seconds),
        progress_deadline_seconds=spec.progress_deadline_seconds,
        active_deadline_seconds=spec.active_deadline_seconds,
        reward_functions=scores_with_functions(spec),
        environment=spec.environment,
    )


def _environment_config(spec: RLJobSpec) -> EnvironmentWorkerConfig | None:
    environment = spec.environment
    if environment is None or environment.kind == "remote":
        return None
    return EnvironmentWorkerConfig(
        class_ref=environment.class_ref,
        container_port=environment.port if environment.kind == "image" else None,
        args=environment.args,
        max_episodes=environment.max_episodes_per_replica,
        step_timeout_seconds=environment.step_timeout_seconds,
        gpus=environment.gpus_per_replica,
    )


def derive_worker_configs(job: RLJob) -> WorkerConfigs:
    """The one mapping from an RLJob spec to its workers' configs."""
    spec = job.spec
    algorithm = resolve_algorithm(spec.algorithm, spec.rollout.sampling.max_new_tokens)
    return WorkerConfigs(
        rollout=_rollout_config(spec),
        reward=RewardWorkerConfig(
            functions=[_with_batch_size(f, spec.algorithm.group_size) for f in spec.reward.functions],
            timeout_seconds=spec.reward.timeout_seconds,
            max_in_flight=spec.reward.max_in_flight_per_replica,
            gpus=spec.reward.gpus_per_replica,
        ),
        trainer=TrainerWorkerConfig(
            model_path=spec.model.path,
            dtype=spec.model.dtype,
            algorithm=algorithm,
            temperature=spec.rollout.sampling.temperature,
            strategy=spec.trainer.strategy,
            world_size=spec.trainer.world_size,
            gpus_per_node=spec.trainer.gpus_per_node,
            micro_batch_size=spec.trainer.micro_batch_size,
            gradient_checkpointing=spec.trainer.gradient_checkpointing,
            freeze=spec.trainer.freeze,
            checkpoint=spec.checkpoint,
            weight_sync=spec.weight_sync,
        ),
        controller=_controller_config(job, algorithm),
        environment=_environment_config(spec),
        colocate=spec.colocate,
    )
