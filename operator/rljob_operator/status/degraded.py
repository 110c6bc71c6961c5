"""What goes wrong in a job, worst first: the Degraded condition and the Failed condition's reason, from
its pods, its driver Job and the controller's report. Pure."""

from __future__ import annotations

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob
from rljob_api.status import Phase
from rljob_api.workercfg import POOLS
from rljob_operator.status.observe import Observed
from rljob_operator.status.pools import GPU_SHORTAGE, unschedulable

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


def degraded_condition(
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
    short = [p for p in POOLS if any(GPU_SHORTAGE in m for m in unschedulable(observed, p))]
    if short:
        gpus = {
            "rollout": job.spec.rollout.gpus_per_replica,
            "trainer": job.spec.trainer.gpus_per_node,
            "reward": job.spec.reward.gpus_per_replica,
            "environment": job.spec.environment.gpus_per_replica if job.spec.environment else 0,
        }
        detail = ", ".join(f"{p} ({gpus[p]} nvidia.com/gpu per pod)" for p in short)
        return "True", "InsufficientGPUs", f"pods of pool {detail} are unschedulable: not enough free GPUs"
    stuck = [p for p in POOLS if unschedulable(observed, p)]
    if stuck:
        return "True", "Unschedulable", f"pods of pool {', '.join(stuck)}: {unschedulable(observed, stuck[0])[0]}"
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
    waiting = waiting_for_reward(snapshot)
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


def waiting_for_reward(snapshot: control_pb.JobStatus | None) -> str:
    """What the run waits for under reward onError: wait, or "" when no sample waits."""
    if snapshot is None or snapshot.phase != control_pb.RUN_PHASE_RUNNING or not snapshot.samples.waiting_for_reward:
        return ""
    count = snapshot.samples.waiting_for_reward
    reason = snapshot.reward_wait_reason or "no reason given"
    return f"{count} sample(s) waiting for reward (onError: wait): {reason}"
