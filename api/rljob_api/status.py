"""The observed state of an RLJob, written by the operator (and by `rljob run` locally)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Model

Phase = Literal["Pending", "Provisioning", "Running", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[Phase, ...] = (
    "Pending",
    "Provisioning",
    "Running",
    "Suspended",
    "Succeeded",
    "Failed",
)


class Condition(Model):
    """A Kubernetes-style condition."""

    type: str = Field(
        description=(
            "Condition type: RolloutReady, TrainerReady, RewardReady, VolumesReady, Progressing, Degraded, Ready, "
            "Succeeded, Failed."
        ),
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field("", description="CamelCase reason, e.g. InsufficientGPUs.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str | None = Field(None, description="RFC 3339 time the status last changed.")
    observed_generation: int | None = Field(None, description="Generation the condition was computed for.")


class PoolReplicas(Model):
    """Replica counts of one pool."""

    desired: int = Field(0, description="Replicas wanted.")
    ready: int = Field(0, description="Replicas running and ready.")


class PoolsStatus(Model):
    """Replica counts of the pools the job runs; a pool it does not run is absent, not 0/0."""

    rollout: PoolReplicas = Field(default_factory=PoolReplicas, description="Rollout pool.")
    trainer: PoolReplicas = Field(default_factory=PoolReplicas, description="Trainer pool.")
    reward: PoolReplicas | None = Field(None, description="Reward pool, when functions score samples.")
    environment: PoolReplicas | None = Field(None, description="Environment pool (kind python or image).")

    def of(self, pool: str) -> PoolReplicas | None:
        """One pool's counts, None for a pool the job does not run."""
        counts: PoolReplicas | None = getattr(self, pool)
        return counts


class RewardStats(Model):
    """Reward of the last train batch."""

    mean: float | None = Field(None, description="Mean reward.")
    std: float | None = Field(None, description="Standard deviation.")


class StalenessStats(Model):
    """Policy-version lag of the samples of the last train batch."""

    mean: float | None = Field(None, description="Mean staleness.")
    max: int | None = Field(None, description="Largest staleness.")


class EvalStats(Model):
    """The newest held-out eval round (spec.data.eval)."""

    step: int = Field(description="Train steps completed when it ran (0: before the first update).")
    policy_version: int = Field(description="Policy version the rollout pool served.")
    reward_mean: float = Field(description="Mean reward over its completions.")
    rewards: dict[str, float] = Field(default_factory=dict, description="Each reward function's mean score.")
    pass_at_k: dict[str, float] = Field(
        default_factory=dict, description="pass@k (unbiased estimate) by k, from 1 up to samplesPerPrompt."
    )


class Restarts(Model):
    """Replacements so far, by what was replaced (an Event on the RLJob tells each one)."""

    rollout: int = Field(0, description="Rollout replicas replaced.")
    reward: int = Field(0, description="Reward replicas replaced.")
    environment: int = Field(0, description="Environment replicas replaced (their episodes restarted elsewhere).")
    trainer: int = Field(0, description="Trainer groups restarted from a checkpoint.")
    driver: int = Field(0, description="Driver pods that failed and were started again by their Job.")
    run_id: str = Field("", description="The driver process whose replacements `seen` counts.")
    seen: int = Field(0, description="Replacements of that driver process counted so far.")


class RLJobStatus(Model):
    """Observed state of an RLJob."""

    phase: Phase | None = Field(None, description="Pending, Provisioning, Running, Suspended, Succeeded or Failed.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions, one per type.")
    observed_generation: int | None = Field(None, description="Spec generation this status reflects.")
    step: int | None = Field(None, description="Train steps completed.")
    policy_version: int | None = Field(None, description="Newest policy version published to rollout.")
    reward: RewardStats | None = Field(None, description="Reward statistics of the last batch.")
    staleness: StalenessStats | None = Field(None, description="Staleness of the last batch.")
    eval: EvalStats | None = Field(None, description="The newest held-out eval round, where spec.data.eval is set.")
    samples_per_second: float | None = Field(None, description="Trained samples per second.")
    filtered_groups: int | None = Field(
        None,
        description=(
            "Prompt groups dynamic sampling dropped so far (all rewards equal: nothing to learn); "
            "set while algorithm.dynamicSampling is enabled."
        ),
    )
    pools: PoolsStatus | None = Field(None, description="Desired and ready replicas per pool.")
    checkpoint: str | None = Field(None, description="Newest checkpoint, kept across suspend.")
    start_time: str | None = Field(None, description="RFC 3339 time the run started.")
    completion_time: str | None = Field(None, description="RFC 3339 time the run ended.")
    message: str | None = Field(None, description="Human-readable summary, the failure when Failed.")
    restarts: Restarts | None = Field(None, description="Replicas, trainer groups and driver pods replaced.")
