"""An RLJob's status from what the cluster and the controller report: phase (phase.py), conditions
(conditions.py, degraded.py), pool counts (pools.py), progress, restarts. Pure: `now` is an argument."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import PoolsStatus, RLJob, RLJobStatus
from rljob_api.status import EvalStats, Phase, RewardStats, StalenessStats
from rljob_api.workercfg import POOLS, cluster_pools
from rljob_operator.status.conditions import (
    READY_TYPE,
    aggregate,
    as_conditions,
    pool_condition,
    progressing,
    rfc3339,
)
from rljob_operator.status.degraded import degraded_condition, failure_reason, waiting_for_reward
from rljob_operator.status.observe import Observed
from rljob_operator.status.phase import TERMINAL, phase_of
from rljob_operator.status.pools import counts_text, pool_counts
from rljob_operator.status.restarts import count_restarts
from rljob_operator.status.volumes import ClaimProblem, volumes_condition


def _message(
    job: RLJob,
    phase: Phase,
    observed: Observed,
    snapshot: control_pb.JobStatus | None,
    pools: PoolsStatus,
    waiting: str,
) -> str:
    if phase == "Failed":
        driver = observed.driver
        if snapshot is not None and snapshot.message:
            return snapshot.message
        return (driver.message if driver else "") or "the driver failed"
    sizes = ", ".join(f"{p} {counts_text(pools.of(p))}" for p in cluster_pools(job.spec))
    pulls = observed.image_pulls() if phase not in TERMINAL else []
    return (
        f"{phase}: {sizes}"
        + (f"; {waiting}" if waiting and phase == "Running" else "")
        + (f"; {pulls[0]}" if pulls else "")
    )


def eval_stats(result: control_pb.EvalResult) -> EvalStats:
    """The controller's newest eval round as the RLJob status shows it."""
    return EvalStats(
        step=result.step,
        policy_version=result.policy_version,
        reward_mean=result.reward_mean,
        rewards=dict(result.rewards),
        pass_at_k={str(k): v for k, v in sorted(result.pass_at_k.items())},
    )


def compute_status(
    job: RLJob,
    observed: Observed,
    snapshot: control_pb.JobStatus | None,
    *,
    now: datetime,
    generation: int | None = None,
    previous: RLJobStatus | None = None,
    claim_problems: Sequence[ClaimProblem] | None = None,
    name_taken: str | None = None,
) -> RLJobStatus:
    """The status to write: phase, conditions, pool counts from the cluster, progress from the controller.

    Without a snapshot (the controller is not up, or did not answer) the last progress is kept;
    `claim_problems` (kube/claims.py) None: the claims are not checked yet; `name_taken`: the objects of children's
    names that are not the job's (kube/ownership.py), which keep every child from being written."""
    live = not job.spec.suspend and not (observed.driver is not None and observed.driver.finished)
    pools = pool_counts(job, observed, live=live)
    phase = phase_of(job, observed, pools, snapshot)
    waiting = waiting_for_reward(snapshot)
    message = _message(job, phase, observed, snapshot, pools, waiting)
    wanted = {READY_TYPE[p]: pool_condition(job, p, pools.of(p), observed, phase) for p in POOLS}
    wanted["VolumesReady"] = volumes_condition(job, claim_problems)
    wanted["Progressing"] = progressing(phase, snapshot, job)
    degraded = degraded_condition(job, observed, phase, message, snapshot)
    wanted["Degraded"] = ("True", "NameTaken", name_taken) if name_taken else degraded
    wanted.update(aggregate(phase, message, wanted, failure_reason(observed, snapshot)))
    prev = previous or RLJobStatus()
    status = RLJobStatus(
        phase=phase,
        conditions=as_conditions(previous, wanted, generation, now),
        observed_generation=generation,
        pools=pools,
        step=prev.step,
        policy_version=prev.policy_version,
        reward=prev.reward,
        staleness=prev.staleness,
        eval=prev.eval,
        samples_per_second=prev.samples_per_second,
        filtered_groups=prev.filtered_groups,
        checkpoint=prev.checkpoint,
        start_time=prev.start_time,
        completion_time=prev.completion_time if phase in TERMINAL else None,
        message=message,
        restarts=count_restarts(prev.restarts, snapshot, observed.driver),
    )
    if snapshot is not None and snapshot.phase != control_pb.RUN_PHASE_UNSPECIFIED:
        _take_progress(status, snapshot, job)
    if phase == "Running" and status.start_time is None:
        status.start_time = rfc3339(now)
    if phase in TERMINAL and status.completion_time is None:
        status.completion_time = rfc3339(now)
    return status


def _take_progress(status: RLJobStatus, snapshot: control_pb.JobStatus, job: RLJob) -> None:
    """The controller's progress into `status`: step, version, throughput, reward, staleness, checkpoint, eval."""
    status.step = snapshot.step
    status.policy_version = snapshot.policy_version
    status.samples_per_second = snapshot.samples_per_second
    if job.spec.algorithm.effective("dynamicSampling.enabled"):
        status.filtered_groups = snapshot.samples.filtered_groups
    if snapshot.step > 0:
        status.reward = RewardStats(mean=snapshot.reward_mean, std=snapshot.reward_std)
        status.staleness = StalenessStats(mean=snapshot.staleness_mean, max=snapshot.staleness_max)
    status.checkpoint = snapshot.checkpoint or status.checkpoint
    if snapshot.HasField("eval"):
        status.eval = eval_stats(snapshot.eval)
