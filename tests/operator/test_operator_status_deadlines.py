"""Status of a run that stands still (#53): Degraded NoProgress from half spec.progressDeadlineSeconds, Failed
with the deadline's own reason, a replica's blocked event loop named, the driver Job's deadline; and the
driver Job carrying spec.activeDeadlineSeconds as its backstop."""

from __future__ import annotations

from test_operator_status import DRIVER_RUNNING, HEAD, T0, cond, job, running_pools, snapshot

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api.workercfg import Ports
from rljob_operator.options import RenderOptions
from rljob_operator.render.driver import DRIVER_GRACE_SECONDS, render_driver
from rljob_operator.status.compute import compute_status
from rljob_operator.status.observe import DriverInfo, Observed


def running(snap: control_pb.JobStatus, **spec: object) -> tuple[str, str, str]:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    status = compute_status(job(**spec), observed, snap, now=T0)
    degraded = cond(status, "Degraded")
    return status.phase or "", degraded.reason, degraded.message


def test_no_step_for_half_the_progress_deadline_is_degraded_no_progress() -> None:
    assert running(snapshot(seconds_since_step=899.0), progressDeadlineSeconds=1800)[1] == "AsExpected"
    phase, reason, message = running(snapshot(seconds_since_step=900.0), progressDeadlineSeconds=1800)
    assert (phase, reason) == ("Running", "NoProgress")
    assert "no train step for 900 s" in message and "progressDeadlineSeconds 1800" in message


def test_a_run_failed_by_its_deadline_says_which_in_the_failed_condition() -> None:
    text = "no train step completed for 1800 s (spec.progressDeadlineSeconds 1800); waiting on: prompts generating"
    snap = snapshot(
        phase=control_pb.RUN_PHASE_FAILED, message=text, failure_reason=control_pb.FAILURE_REASON_PROGRESS_DEADLINE
    )
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    status = compute_status(job(), observed, snap, now=T0)
    assert status.phase == "Failed"
    assert (cond(status, "Failed").reason, cond(status, "Failed").message) == ("ProgressDeadlineExceeded", text)
    assert cond(status, "Degraded").reason == "ProgressDeadlineExceeded"
    # Kubernetes' backstop: the driver Job failed by its activeDeadlineSeconds, no snapshot left
    killed = Observed(driver=DriverInfo(failed=True, message="Job was active longer", deadline_exceeded=True))
    assert cond(compute_status(job(), killed, None, now=T0), "Failed").reason == "ActiveDeadlineExceeded"


def test_a_blocked_event_loop_is_degraded_naming_the_replica() -> None:
    report = "reward replica reward-0: event loop blocked for 5.0 s: ...; its async user functions: slow_rule"
    phase, reason, message = running(snapshot(loop_blocked=report))
    assert (phase, reason, message) == ("Running", "EventLoopBlocked", report)


def test_the_driver_job_carries_the_active_deadline_plus_its_grace() -> None:
    assert "activeDeadlineSeconds" not in render_driver(job(), Ports(), RenderOptions())["spec"]
    limited = render_driver(job(activeDeadlineSeconds=7200), Ports(), RenderOptions())
    assert limited["spec"]["activeDeadlineSeconds"] == 7200 + DRIVER_GRACE_SECONDS
