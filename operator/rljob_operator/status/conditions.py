"""The RLJob's conditions: each pool's Ready, Progressing, the aggregate Ready, Succeeded and Failed, and the list
in a fixed order whose lastTransitionTime moves only when a status does. Pure: `now` is an argument."""

from __future__ import annotations

from datetime import datetime, timezone

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import Condition, PoolReplicas, RLJob, RLJobStatus
from rljob_api.status import Phase
from rljob_api.workercfg import Pool, cluster_pools
from rljob_operator.status.observe import Observed
from rljob_operator.status.phase import TERMINAL
from rljob_operator.status.pools import GPU_SHORTAGE, unschedulable

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


def rfc3339(now: datetime) -> str:
    return now.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pool_condition(
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
    pending = unschedulable(observed, pool)
    if pending:
        reason = "InsufficientGPUs" if any(GPU_SHORTAGE in m for m in pending) else "Unschedulable"
        return "False", reason, f"{text}; {len(pending)} unschedulable: {pending[0]}"
    return "False", "ReplicasNotReady", text


def progressing(phase: Phase, snapshot: control_pb.JobStatus | None, job: RLJob) -> tuple[str, str, str]:
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


def aggregate(
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


def as_conditions(
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
