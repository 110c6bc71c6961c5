"""An RLJob's status from what the cluster and the controller report. Pure: `now` is an argument."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import Condition, PoolReplicas, PoolsStatus, RLJob, RLJobStatus
from rljob_api.status import EvalStats, Phase, RewardStats, StalenessStats
from rljob_api.workercfg import POOLS, Pool, cluster_pools
from rljob_operator.render.group_sizing import clamp_replicas
from rljob_operator.status.observe import Observed
from rljob_operator.status.restarts import count_restarts
from rljob_operator.status.volumes import ClaimProblem, volumes_condition

CONDITION_TYPES = (
    "RolloutReady",
    "TrainerReady",
    "RewardReady",
    "EnvironmentReady",
    "VolumesReady",
    "Progressing",
    "Degraded",
    "Ready",
    "Succeeded",
    "Failed",
)
READY_TYPE: dict[Pool, str] = {
    "rollout": "RolloutReady",
    "trainer": "TrainerReady",
    "reward": "RewardReady",
    "environment": "EnvironmentReady",
}
TERMINAL: tuple[Phase, ...] = ("Succeeded", "Failed")
GPU_SHORTAGE = "Insufficient nvidia.com/gpu"


def rfc3339(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def desired_replicas(job: RLJob, observed: Observed, pool: Pool, *, live: bool) -> int:
    """Pods a pool should have: none while suspended or finished, or for a pool the job does not run; an
    elastic group as last scaled."""
    if not live or pool not in cluster_pools(job.spec):
        return 0
    if pool == "rollout":
        return job.spec.rollout.replicas
    if pool == "trainer":
        return job.spec.trainer.nodes
    return clamp_replicas(job, pool, observed.groups.of(pool).replicas)


def _pools(job: RLJob, observed: Observed, *, live: bool) -> PoolsStatus:
    counts = {
        pool: PoolReplicas(
            desired=desired_replicas(job, observed, pool, live=live),
            ready=sum(1 for p in observed.pool_pods(pool) if p.serving),
        )
        for pool in cluster_pools(job.spec)
    }
    return PoolsStatus(**counts)


def _ready(counts: PoolReplicas | None) -> bool:
    return counts is not None and counts.ready >= counts.desired


def _counts(counts: PoolReplicas | None) -> str:
    return f"{counts.ready}/{counts.desired}" if counts is not None else "-"


def _unschedulable(observed: Observed, pool: Pool) -> list[str]:
    return [p.unschedulable for p in observed.pool_pods(pool) if p.unschedulable and not p.deleting]


def _phase(job: RLJob, observed: Observed, pools: PoolsStatus, snapshot: control_pb.JobStatus | None) -> Phase:
    driver = observed.driver
    run = snapshot.phase if snapshot is not None else control_pb.RUN_PHASE_UNSPECIFIED
    if job.spec.suspend:
        return "Suspended"
    if (driver is not None and driver.failed) or run == control_pb.RUN_PHASE_FAILED:
        return "Failed"
    if (driver is not None and driver.succeeded) or run == control_pb.RUN_PHASE_SUCCEEDED:
        return "Succeeded"
    if not observed.ray_cluster and driver is None:
        return "Pending"
    if run in (control_pb.RUN_PHASE_RUNNING, control_pb.RUN_PHASE_STOPPING):
        # The controller trains: its pools serve, whatever their pods' Ready conditions say yet
        # (KubeRay's probes lag the Ray workers by seconds; an elastic pool grows while it trains).
        return "Running"
    head_ready = observed.head is not None and observed.head.serving
    pools_ready = head_ready and all(_ready(pools.of(p)) for p in cluster_pools(job.spec))
    driving = driver is not None and driver.running
    return "Running" if observed.ray_cluster and pools_ready and driving else "Provisioning"


def _pool_condition(
    job: RLJob, pool: Pool, counts: PoolReplicas | None, observed: Observed, phase: Phase
) -> tuple[str, str, str]:
    if counts is None or pool not in cluster_pools(job.spec):
        return "True", "NotUsed", f"the job runs no {pool} pool"
    if phase == "Suspended":
        return "False", "Suspended", "the job is suspended; its pools are torn down"
    if phase in TERMINAL:
        return "False", phase, f"the run {phase.lower()}; its pools are released"
    text = f"{counts.ready}/{counts.desired} replicas ready"
    if counts.ready >= counts.desired:
        return "True", "ReplicasReady", text
    pulls = observed.image_pulls(pool)
    if pulls:
        return "False", "ImagePullFailed", f"{text}; {len(pulls)} cannot pull their image: {pulls[0]}"
    pending = _unschedulable(observed, pool)
    if pending:
        reason = "InsufficientGPUs" if any(GPU_SHORTAGE in m for m in pending) else "Unschedulable"
        return "False", reason, f"{text}; {len(pending)} unschedulable: {pending[0]}"
    return "False", "ReplicasNotReady", text


def _progressing(phase: Phase, snapshot: control_pb.JobStatus | None, job: RLJob) -> tuple[str, str, str]:
    if phase == "Suspended":
        return "False", "Suspended", "suspended; resumes from the newest checkpoint"
    if phase in TERMINAL:
        return "False", phase, f"the run {phase.lower()}"
    if phase == "Pending":
        return "Unknown", "Pending", "children not created yet"
    if phase == "Provisioning":
        return "True", "Provisioning", "waiting for the Ray head, the pools and the driver"
    if snapshot is None:
        return "Unknown", "ControllerUnreachable", "the controller's ControlService did not answer"
    total = snapshot.total_steps or job.spec.algorithm.total_steps
    return "True", "Training", f"step {snapshot.step}/{total}, policy version {snapshot.policy_version}"


FAILURE_REASONS = {
    control_pb.FAILURE_REASON_PROGRESS_DEADLINE: "ProgressDeadlineExceeded",
    control_pb.FAILURE_REASON_ACTIVE_DEADLINE: "ActiveDeadlineExceeded",
}


def failure_reason(observed: Observed, snapshot: control_pb.JobStatus | None) -> str:
    """The Failed condition's reason: the run's own kind of failure where it has one (the driver Job's
    deadline, Kubernetes' backstop of spec.activeDeadlineSeconds, counts as the run's), else Failed."""
    if snapshot is not None and snapshot.failure_reason in FAILURE_REASONS:
        return FAILURE_REASONS[snapshot.failure_reason]
    driver = observed.driver
    return "ActiveDeadlineExceeded" if driver is not None and driver.deadline_exceeded else "Failed"


def _aggregate(
    phase: Phase, message: str, wanted: dict[str, tuple[str, str, str]], failed: str
) -> dict[str, tuple[str, str, str]]:
    """Ready (running, every pool and volume ready), and the terminal Succeeded and Failed, so that
    `kubectl wait --for=condition=Succeeded rljob/NAME` works."""
    parts = [kind for kind in (*READY_TYPE.values(), "VolumesReady") if wanted[kind][0] != "True"]
    ready: tuple[str, str, str]
    if phase != "Running":
        ready = ("False", phase, f"the run is {phase}")
    elif parts:
        ready = ("False", "NotReady", f"not ready: {', '.join(parts)}")
    else:
        ready = ("True", "Running", "")
    done = phase in ("Succeeded", "Failed")
    return {
        "Ready": ready,
        "Succeeded": ("True", "Succeeded", message) if phase == "Succeeded" else ("False", phase, ""),
        "Failed": ("True", failed, message) if phase == "Failed" else ("False", phase if done else "NotFailed", ""),
    }


def _degraded(
    job: RLJob, observed: Observed, phase: Phase, message: str, snapshot: control_pb.JobStatus | None
) -> tuple[str, str, str]:
    if phase == "Failed":
        return "True", failure_reason(observed, snapshot), message
    if phase in ("Suspended", "Succeeded"):
        return "False", "AsExpected", ""
    pulls = observed.image_pulls()
    if pulls:
        pools = [p for p in POOLS if observed.image_pulls(p)]
        where = f" of pool {', '.join(pools)}" if pools else ""
        return "True", "ImagePullFailed", f"{len(pulls)} pod(s){where} cannot pull their image; {pulls[0]}"
    crashing = [p for p in POOLS if observed.crash_loops(p)]
    if crashing:
        first = observed.crash_loops(crashing[0])
        return "True", "CrashLoopBackOff", f"pods of pool {', '.join(crashing)} keep crashing; {first[0]}"
    short = [p for p in POOLS if any(GPU_SHORTAGE in m for m in _unschedulable(observed, p))]
    if short:
        gpus = {
            "rollout": job.spec.rollout.gpus_per_replica,
            "trainer": job.spec.trainer.gpus_per_node,
            "reward": job.spec.reward.gpus_per_replica,
            "environment": job.spec.environment.gpus_per_replica if job.spec.environment else 0,
        }
        detail = ", ".join(f"{p} ({gpus[p]} nvidia.com/gpu per pod)" for p in short)
        return "True", "InsufficientGPUs", f"pods of pool {detail} are unschedulable: not enough free GPUs"
    stuck = [p for p in POOLS if _unschedulable(observed, p)]
    if stuck:
        return "True", "Unschedulable", f"pods of pool {', '.join(stuck)}: {_unschedulable(observed, stuck[0])[0]}"
    driver = observed.driver
    if driver is not None and driver.failed_attempts and not driver.finished:
        return (
            "True",
            "DriverRestarted",
            f"the driver failed {driver.failed_attempts} time(s); it resumes from the newest checkpoint",
        )
    return _run_trouble(job, phase, snapshot)


def _run_trouble(job: RLJob, phase: Phase, snapshot: control_pb.JobStatus | None) -> tuple[str, str, str]:
    """What the controller reports going wrong in a live run: samples waiting for reward, no step for half the
    progress deadline, a replica's blocked event loop."""
    waiting = _waiting_for_reward(snapshot)
    if waiting:
        return "True", "WaitingForReward", waiting
    deadline = job.spec.progress_deadline_seconds
    if snapshot is not None and phase == "Running" and snapshot.seconds_since_step >= deadline / 2:
        stalled = snapshot.seconds_since_step
        return (
            "True",
            "NoProgress",
            f"no train step for {stalled:.0f} s; the run fails at progressDeadlineSeconds {deadline:g}",
        )
    if snapshot is not None and snapshot.loop_blocked:
        return "True", "EventLoopBlocked", snapshot.loop_blocked
    return "False", "AsExpected", ""


def _conditions(
    previous: RLJobStatus | None, wanted: dict[str, tuple[str, str, str]], generation: int | None, now: datetime
) -> list[Condition]:
    """Conditions in a fixed order; lastTransitionTime moves only when a condition's status changes."""
    before = {c.type: c for c in (previous.conditions if previous else [])}
    out = []
    for kind in CONDITION_TYPES:
        status, reason, message = wanted[kind]
        old = before.get(kind)
        changed = old is None or old.status != status or old.last_transition_time is None
        out.append(
            Condition(
                type=kind,
                status=status,  # type: ignore[arg-type]
                reason=reason,
                message=message,
                last_transition_time=rfc3339(now) if changed else old.last_transition_time,  # type: ignore[union-attr]
                observed_generation=generation,
            )
        )
    return out


def _waiting_for_reward(snapshot: control_pb.JobStatus | None) -> str:
    """What the run waits for under reward onError: wait, or "" when no sample waits."""
    if snapshot is None or snapshot.phase != control_pb.RUN_PHASE_RUNNING or not snapshot.samples.waiting_for_reward:
        return ""
    count = snapshot.samples.waiting_for_reward
    reason = snapshot.reward_wait_reason or "no reason given"
    return f"{count} sample(s) waiting for reward (onError: wait): {reason}"


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
    sizes = ", ".join(f"{p} {_counts(pools.of(p))}" for p in cluster_pools(job.spec))
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
    pools = _pools(job, observed, live=live)
    phase = _phase(job, observed, pools, snapshot)
    waiting = _waiting_for_reward(snapshot)
    message = _message(job, phase, observed, snapshot, pools, waiting)
    wanted = {READY_TYPE[p]: _pool_condition(job, p, pools.of(p), observed, phase) for p in POOLS}
    wanted["VolumesReady"] = volumes_condition(job, claim_problems)
    wanted["Progressing"] = _progressing(phase, snapshot, job)
    degraded = _degraded(job, observed, phase, message, snapshot)
    wanted["Degraded"] = ("True", "NameTaken", name_taken) if name_taken else degraded
    wanted.update(_aggregate(phase, message, wanted, failure_reason(observed, snapshot)))
    prev = previous or RLJobStatus()
    status = RLJobStatus(
        phase=phase,
        conditions=_conditions(previous, wanted, generation, now),
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
