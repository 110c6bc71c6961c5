"""Environments: multi-turn episodes against tools, sandboxes and games (spec.environment)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import FieldRuleError, cel, cel_rules
from .placement import Placement
from .reward import NAME, OnError, RemoteReward, ReplicaRange, ScalingSpec

EnvironmentKind = Literal["python", "remote", "image"]
# Where a `kind: image` environment's server listens in its pod (spec.environment.port's default).
ENVIRONMENT_PORT = 50055
CLASS_REF = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
# Environment calls (an episode's start or a step) in service at once per replica that the elastic policy aims
# for: a sync environment's calls run on the replica's threads (asyncio's default pool: cores + 4).
CALLS_PER_REPLICA = 4.0


class EnvironmentScalingSpec(ScalingSpec):
    """Targets of the elastic environment policy, counted in environment calls."""

    target_backlog_per_replica: float = Field(
        CALLS_PER_REPLICA,
        description="Environment calls in service at once per replica the policy aims for: the load is the call "
        "rate × the call latency, or the calls waiting and in service × the latency ÷ intervalSeconds.",
        gt=0,
    )


class EnvironmentSpec(Placement):
    """Where episodes are played: a Python class in environment actors, or EnvironmentService endpoints.

    A Python environment is a class with ``reset(task) -> observation`` and ``step(action) -> (observation,
    reward, done)``, sync or async (a gymnasium-style ``step`` returning ``(observation, reward, terminated,
    truncated, info)`` works too); ``task`` is the data row's fields. Each episode's return (its turn rewards
    plus its final reward) is the reward ``rewardName``, weighted by ``rewardWeight`` beside spec.reward's
    functions, which then become optional.
    """

    kind: EnvironmentKind = Field(
        description=(
            "python: `class` runs in environment actors; remote: `remote`'s endpoints; image: `image` runs as a "
            "container of its own in each environment pod (any language), beside the Ray actor that supervises it."
        )
    )
    class_ref: str | None = Field(
        None,
        alias="class",
        description="`module.path:Class` of the environment (kind python); one instance per episode.",
        pattern=CLASS_REF,
        max_length=512,
    )
    remote: RemoteReward | None = Field(
        None, description="EnvironmentService endpoints (kind remote): host:port, TLS, token, breaker."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the class (kind python): each episode's instance is `Class(**args)`.",
    )
    image: str | None = Field(
        None,
        description=(
            "kind image (on a cluster): the environment's own image, in any language: a second container in each "
            "environment pod, serving EnvironmentService on all interfaces at `port` and checking the job's token "
            "(the file RLJOB_TOKEN_FILE names); the pod's Ray actor waits for its grpc.health.v1 before the pool "
            "routes episodes to it."
        ),
        min_length=1,
        max_length=1024,
    )
    port: int = Field(
        ENVIRONMENT_PORT, description="kind image: the port its server listens on in the pod.", ge=1024, le=65535
    )
    command: list[str] | None = Field(
        None, description="kind image: the container's command (unset: the image's entrypoint).", max_length=64
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="kind image: environment variables of its container (e.g. a latency)."
    )
    replicas: ReplicaRange = Field(
        default_factory=ReplicaRange,
        description=(
            "Elastic bounds of the environment pool (kind python): one Ray actor per replica, on a cluster one pod "
            "of the job's `environment` worker group each."
        ),
    )
    scaling: EnvironmentScalingSpec = Field(
        default_factory=EnvironmentScalingSpec,
        description=(
            "Elastic scaling targets, as spec.reward.scaling, counted in environment calls (an episode's start or "
            f"a step): targetBacklogPerReplica is the calls in service at once per replica (default "
            f"{CALLS_PER_REPLICA:g}); episodes waiting for a replica's slot count as calls waiting."
        ),
    )
    gpus_per_replica: int = Field(0, description="GPUs per environment replica (a simulator's).", ge=0, le=64)
    start_timeout_seconds: float = Field(
        600.0,
        description=(
            "Longest start of a replica the elastic policy adds (on a cluster: its pod scheduled, its image "
            "pulled, its server up); past it the replica is given up, the next round asks again, and the run "
            "goes on with the replicas it has."
        ),
        gt=0,
    )
    max_turns: int = Field(
        8, description="Most model turns of an episode; an episode at it ends, truncated.", ge=1, le=1024
    )
    max_episode_tokens: int | None = Field(
        None,
        description=(
            "The context budget: prompt, model turns and observations of one episode, in tokens. An episode that "
            "would exceed it ends as truncated and is scored as it stands (algorithm.overlong.maskTruncated "
            "applies). Unset: the prompt plus maxTurns × rollout.sampling.maxNewTokens."
        ),
        ge=1,
    )
    step_timeout_seconds: float = Field(
        30.0, description="Deadline of one environment call (the start or a step); past it the attempt fails.", gt=0
    )
    retries: int = Field(
        2, description="Restarts of an episode after environment errors, before onError.", ge=0, le=100
    )
    on_error: OnError = Field(
        "fail",
        description=(
            "After retries: fail the job naming the environment and the episode; exclude the episode from training "
            "and count it; or wait: keep restarting it while the environment's errors are failures or timeouts."
        ),
    )
    reward_name: str = Field(
        "environment", description="Name of the episode's return among the rewards (metrics, components).", pattern=NAME
    )
    reward_weight: float = Field(1.0, description="Weight of the episode's return in the sample's reward.")
    max_episodes_per_replica: int = Field(
        64, description="Episodes in flight on one environment replica.", ge=1, le=65536
    )

    @model_validator(mode="after")
    def _config_matches_kind(self) -> EnvironmentSpec:
        if self.kind == "python" and self.class_ref is None:
            raise FieldRuleError("class", "is required when kind is python")
        if self.kind == "remote" and self.remote is None:
            raise FieldRuleError("remote", "is required when kind is remote")
        if self.kind != "python" and self.class_ref is not None:
            raise FieldRuleError("class", f"is set but kind is {self.kind}")
        if self.kind != "remote" and self.remote is not None:
            raise FieldRuleError("remote", f"is set but kind is {self.kind}")
        if (self.kind == "image") != (self.image is not None):
            raise FieldRuleError("image", "must be set exactly when kind is image")
        if self.kind != "image" and (self.command is not None or self.env):
            raise FieldRuleError(
                "command" if self.command is not None else "env", f"applies to kind image, not {self.kind}"
            )
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel("has(self.class) == (self.kind == 'python')", "class must be set exactly when kind is python"),
            cel("has(self.remote) == (self.kind == 'remote')", "remote must be set exactly when kind is remote"),
            cel("has(self.image) == (self.kind == 'image')", "image must be set exactly when kind is image"),
        )
    }
