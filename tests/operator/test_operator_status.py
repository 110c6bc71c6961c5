"""Status from hand-built observations: phases, conditions, transitions, controller progress."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, RLJobStatus, parse_rljob
from rljob_api.workercfg import POOLS, Pool
from rljob_operator.options import ElasticGroup, ElasticGroups
from rljob_operator.status.compute import compute_status
from rljob_operator.status.observe import DriverInfo, Observed, PodInfo, final_snapshot, observe, pod_info

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
GPU_MESSAGE = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."


def job(**spec: Any) -> RLJob:
    doc = yaml.safe_load((REPO / "examples" / "gpu-cluster.yaml").read_text())
    doc["spec"].update(spec)
    return parse_rljob(doc)


def ready(prefix: str, n: int) -> tuple[PodInfo, ...]:
    return tuple(PodInfo(f"{prefix}-{i}", "Running", True) for i in range(n))


def running_pools(**overrides: tuple[PodInfo, ...]) -> dict[Pool, tuple[PodInfo, ...]]:
    sizes = {"rollout": 4, "trainer": 2, "reward": 2, "environment": 0}
    return {pool: overrides.get(pool, ready(pool[:2], sizes[pool])) for pool in POOLS}


HEAD = PodInfo("head-x", "Running", True)
DRIVER_RUNNING = DriverInfo(pod=PodInfo("driver-x", "Running", True))


def cond(status: RLJobStatus, kind: str) -> Any:
    return next(c for c in status.conditions if c.type == kind)


def snapshot(**fields: Any) -> control_pb.JobStatus:
    base: dict[str, Any] = {"phase": control_pb.RUN_PHASE_RUNNING, "step": 12, "total_steps": 500}
    base.update(fields)
    return control_pb.JobStatus(**base)


def test_pending_before_children() -> None:
    status = compute_status(job(), Observed(), None, now=T0, generation=1)
    assert status.phase == "Pending"
    assert status.observed_generation == 1
    assert [c.type for c in status.conditions] == [
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
    ]
    assert all(c.observed_generation == 1 for c in status.conditions)


def test_provisioning_counts_ready_pods() -> None:
    pods = running_pools(rollout=(*ready("ro", 1), PodInfo("ro-9", "Pending")))
    status = compute_status(job(), Observed(ray_cluster=True, head=HEAD, pods=pods, driver=DriverInfo()), None, now=T0)
    assert status.phase == "Provisioning"
    assert status.pools is not None
    assert (status.pools.rollout.desired, status.pools.rollout.ready) == (4, 1)
    assert (status.pools.trainer.desired, status.pools.trainer.ready) == (2, 2)
    assert cond(status, "RolloutReady").status == "False"
    assert cond(status, "RolloutReady").reason == "ReplicasNotReady"
    assert cond(status, "TrainerReady").status == "True"
    assert cond(status, "Degraded").status == "False"


def test_running_once_pools_ready_and_driver_runs() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    status = compute_status(job(), observed, None, now=T0)
    assert status.phase == "Running"
    assert status.start_time == "2026-01-02T03:04:05Z"
    assert cond(status, "Progressing").status == "Unknown"
    assert cond(status, "Progressing").reason == "ControllerUnreachable"


def test_running_once_the_controller_trains_though_a_pool_pod_is_not_ready_yet() -> None:
    # KubeRay's readiness probe lags the Ray worker; the controller already trains on it (CI: step 44).
    pods = running_pools(rollout=(*ready("ro", 3), PodInfo("ro-9", "Running")))
    observed = Observed(ray_cluster=True, head=HEAD, pods=pods, driver=DRIVER_RUNNING)
    assert compute_status(job(), observed, None, now=T0).phase == "Provisioning"
    status = compute_status(job(), observed, snapshot(), now=T0)
    assert status.phase == "Running"
    assert status.pools is not None and (status.pools.rollout.ready, status.pools.rollout.desired) == (3, 4)
    assert cond(status, "RolloutReady").status == "False"


def test_head_not_ready_is_still_provisioning() -> None:
    observed = Observed(ray_cluster=True, head=PodInfo("h", "Pending"), pods=running_pools(), driver=DRIVER_RUNNING)
    assert compute_status(job(), observed, None, now=T0).phase == "Provisioning"
    assert compute_status(job(), replace(observed, head=None), None, now=T0).phase == "Provisioning"


def test_driver_pending_is_still_provisioning() -> None:
    driver = DriverInfo(pod=PodInfo("d", "Pending"))
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=driver)
    assert compute_status(job(), observed, None, now=T0).phase == "Provisioning"


def test_insufficient_gpus_names_the_pool() -> None:
    stuck = (*ready("ro", 2), PodInfo("ro-8", unschedulable=GPU_MESSAGE), PodInfo("ro-9", unschedulable=GPU_MESSAGE))
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(rollout=stuck), driver=DriverInfo())
    status = compute_status(job(), observed, None, now=T0)
    assert status.phase == "Provisioning"
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "InsufficientGPUs")
    assert "rollout" in degraded.message and "trainer" not in degraded.message
    assert "8 nvidia.com/gpu" in degraded.message
    rollout = cond(status, "RolloutReady")
    assert (rollout.status, rollout.reason) == ("False", "InsufficientGPUs")
    assert "2 unschedulable" in rollout.message


def test_other_unschedulable_reason() -> None:
    msg = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
    observed = Observed(
        ray_cluster=True, pods=running_pools(reward=(PodInfo("rw-0", unschedulable=msg),)), driver=DriverInfo()
    )
    degraded = cond(compute_status(job(), observed, None, now=T0), "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "Unschedulable")
    assert "reward" in degraded.message


IMAGE = "registry.example:5000/rljob/rljob-worker:0.2.0"
PULL_MESSAGE = f'Back-off pulling image "{IMAGE}": ErrImagePull: pull access denied, authorization failed'


def test_a_pod_waiting_on_an_image_it_cannot_pull_says_which_and_why() -> None:
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": PULL_MESSAGE}}
    raw = {"metadata": {"name": "ro-0"}, "status": {"phase": "Pending", "containerStatuses": [
        {"name": "ray-worker", "image": IMAGE, "state": waiting}]}}  # fmt: skip
    assert pod_info(raw).image_pull == f"ImagePullBackOff {IMAGE}: {PULL_MESSAGE}"
    creating = {"waiting": {"reason": "ContainerCreating"}}
    raw["status"]["containerStatuses"][0]["state"] = creating  # type: ignore[index]
    assert pod_info(raw).image_pull == ""  # waiting for another reason: not an image problem


def test_pods_that_cannot_pull_their_image_degrade_the_job_naming_pod_and_image() -> None:
    cause = f"ImagePullBackOff {IMAGE}: {PULL_MESSAGE}"
    rollout = (*ready("ro", 3), PodInfo("ro-3", image_pull=cause))
    driver = DriverInfo(pod=PodInfo("driver-x", image_pull=cause))
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(rollout=rollout), driver=driver)
    status = compute_status(job(), observed, None, now=T0)
    assert status.phase == "Provisioning"
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "ImagePullFailed")
    assert degraded.message == f"2 pod(s) of pool rollout cannot pull their image; pod ro-3: {cause}"
    ready_ = cond(status, "RolloutReady")
    assert (ready_.status, ready_.reason) == ("False", "ImagePullFailed") and IMAGE in ready_.message
    assert status.message is not None and status.message.endswith(f"; pod ro-3: {cause}")
    deleting = replace(observed, pods=running_pools(rollout=(*ready("ro", 3), PodInfo("ro-3", image_pull=cause,
                       deleting=True))), driver=DriverInfo(pod=PodInfo("driver-x", "Running", True)))  # fmt: skip
    assert cond(compute_status(job(), deleting, None, now=T0), "Degraded").reason != "ImagePullFailed"


def test_progress_from_the_controller() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    snap = snapshot(
        policy_version=11,
        reward_mean=0.75,
        reward_std=0.1,
        staleness_mean=0.5,
        staleness_max=1,
        samples_per_second=42.5,
        checkpoint="/checkpoints/step-10",
    )
    status = compute_status(job(), observed, snap, now=T0)
    assert (status.step, status.policy_version, status.samples_per_second) == (12, 11, 42.5)
    assert status.reward is not None and status.reward.mean == 0.75
    assert status.staleness is not None and (status.staleness.mean, status.staleness.max) == (0.5, 1)
    assert status.checkpoint == "/checkpoints/step-10"
    progressing = cond(status, "Progressing")
    assert (progressing.status, progressing.reason) == ("True", "Training")
    assert "step 12/500" in progressing.message
    # The controller unreachable later: progress is kept, not blanked.
    later = compute_status(job(), observed, None, now=T0 + timedelta(seconds=5), previous=status)
    assert (later.step, later.checkpoint) == (12, "/checkpoints/step-10")


def test_controller_running_counts_as_driving() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DriverInfo())
    assert compute_status(job(), observed, snapshot(), now=T0).phase == "Running"


def test_last_transition_time_moves_only_on_status_change() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DriverInfo())
    first = compute_status(job(), observed, None, now=T0)
    second = compute_status(job(), observed, None, now=T0 + timedelta(minutes=1), previous=first)
    for a, b in zip(first.conditions, second.conditions, strict=True):
        assert a.last_transition_time == b.last_transition_time == "2026-01-02T03:04:05Z"
    lost = running_pools(trainer=ready("tr", 1))
    third = compute_status(
        job(),
        Observed(ray_cluster=True, head=HEAD, pods=lost, driver=DriverInfo()),
        None,
        now=T0 + timedelta(minutes=2),
        previous=second,
    )
    assert cond(third, "TrainerReady").last_transition_time == "2026-01-02T03:06:05Z"
    assert cond(third, "RolloutReady").last_transition_time == "2026-01-02T03:04:05Z"
    # A reason/message change with the same status keeps the time.
    assert cond(third, "Progressing").last_transition_time == "2026-01-02T03:04:05Z"


def test_suspended() -> None:
    observed = Observed(ray_cluster=False, pods=running_pools(reward=()), driver=None)
    prev = RLJobStatus(checkpoint="/checkpoints/step-25", step=25)
    status = compute_status(job(suspend=True), observed, None, now=T0, previous=prev)
    assert status.phase == "Suspended"
    assert status.pools is not None and status.pools.rollout.desired == 0
    assert status.checkpoint == "/checkpoints/step-25" and status.step == 25
    assert cond(status, "Progressing").reason == "Suspended"
    assert cond(status, "RolloutReady").reason == "Suspended"


def test_succeeded_from_the_driver_job() -> None:
    observed = Observed(ray_cluster=False, driver=DriverInfo(complete=True))
    status = compute_status(job(), observed, None, now=T0)
    assert status.phase == "Succeeded"
    assert status.completion_time == "2026-01-02T03:04:05Z"
    assert cond(status, "Degraded").status == "False"
    assert status.pools is not None and status.pools.reward is not None and status.pools.reward.desired == 0


def test_succeeded_from_the_controller() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    snap = snapshot(phase=control_pb.RUN_PHASE_SUCCEEDED, step=500)
    status = compute_status(job(), observed, snap, now=T0)
    assert status.phase == "Succeeded"
    # the terminal conditions `kubectl wait --for=condition=...` reads
    assert [(cond(status, k).status, cond(status, k).reason) for k in ("Succeeded", "Failed", "Ready")] == [
        ("True", "Succeeded"),
        ("False", "Succeeded"),
        ("False", "Succeeded"),
    ]


def test_failed_carries_the_reason() -> None:
    observed = Observed(driver=DriverInfo(failed=True, message="Job has reached the specified backoff limit"))
    status = compute_status(job(), observed, None, now=T0)
    assert status.phase == "Failed"
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "Failed")
    assert "backoff limit" in degraded.message and "backoff limit" in (status.message or "")
    assert cond(status, "Failed").status == "True" and "backoff limit" in cond(status, "Failed").message
    assert cond(status, "Succeeded").status == "False"
    snap = snapshot(phase=control_pb.RUN_PHASE_FAILED, message="reward function exact-match raised")
    failed = compute_status(job(), Observed(ray_cluster=True, head=HEAD, driver=DRIVER_RUNNING), snap, now=T0)
    assert failed.phase == "Failed" and failed.message == "reward function exact-match raised"


def test_driver_restart_is_degraded() -> None:
    driver = DriverInfo(failed_attempts=1, pod=PodInfo("d2", "Running", True))
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=driver)
    status = compute_status(job(), observed, None, now=T0)
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "DriverRestarted")


def test_samples_waiting_for_reward_are_degraded_and_named() -> None:
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    reason = "remote reward 'judge': sample 'e3/1' not sent: circuit breaker open"
    waiting = snapshot(samples=control_pb.SampleCounts(waiting_for_reward=3), reward_wait_reason=reason)
    status = compute_status(job(), observed, waiting, now=T0)
    assert status.phase == "Running"
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "WaitingForReward")
    assert degraded.message == f"3 sample(s) waiting for reward (onError: wait): {reason}"
    assert status.message is not None and status.message.endswith(degraded.message)
    # The endpoint is back: the condition clears with the controller's next snapshot.
    recovered = compute_status(job(), observed, snapshot(), now=T0, previous=status)
    assert cond(recovered, "Degraded").status == "False" and "waiting" not in (recovered.message or "")


def test_reward_desired_follows_the_scaled_group() -> None:
    groups = ElasticGroups(reward=ElasticGroup(5))
    observed = Observed(ray_cluster=True, head=HEAD, groups=groups, pods=running_pools(reward=ready("rw", 3)))
    status = compute_status(job(), observed, None, now=T0)
    assert status.pools is not None and status.pools.reward is not None
    assert (status.pools.reward.desired, status.pools.reward.ready) == (5, 3)


def test_a_pool_the_job_does_not_run_is_absent_and_does_not_hold_readiness() -> None:
    """CI saw `pools.environment: {desired: 0, ready: 0}` on a job with no environment, which a reader (and
    any `ready >= desired > 0` check) takes for a pool that is down."""
    observed = Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING)
    status = compute_status(job(), observed, snapshot(), now=T0)
    assert status.pools is not None and status.pools.environment is None
    assert "environment" not in status.model_dump(by_alias=True, mode="json", exclude_none=True)["pools"]
    assert status.phase == "Running"
    assert cond(status, "EnvironmentReady").reason == "NotUsed"


def test_observe_reads_raw_objects() -> None:
    def pod(name: str, labels: dict[str, str], phase: str, **status: Any) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": labels}, "status": {"phase": phase, **status}}

    rc = {
        "spec": {
            "workerGroupSpecs": [
                {"groupName": "rollout", "replicas": 4},
                {"groupName": "reward", "replicas": 3, "scaleStrategy": {"workersToDelete": ["rw-1"]}},
            ]
        }
    }
    pods = [
        pod("ro-1", {"rljob.io/pool": "rollout"}, "Running", conditions=[{"type": "Ready", "status": "True"}]),
        pod(
            "ro-2",
            {"rljob.io/pool": "rollout"},
            "Pending",
            conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": GPU_MESSAGE}],
        ),
        pod("drv", {"rljob.io/component": "driver"}, "Running"),
        pod("head", {"rljob.io/component": "head"}, "Running", conditions=[{"type": "Ready", "status": "True"}]),
    ]
    job_obj = {"status": {"failed": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    seen = observe(rc, pods, job_obj)
    assert seen.ray_cluster and seen.groups.reward == ElasticGroup(3, ("rw-1",))
    assert seen.groups.environment == ElasticGroup()
    rollout = seen.pool_pods("rollout")
    assert [p.serving for p in rollout] == [True, False]
    assert rollout[1].unschedulable == GPU_MESSAGE
    assert seen.driver is not None and seen.driver.complete and seen.driver.failed_attempts == 1
    assert seen.driver.pod is not None and seen.driver.pod.name == "drv"
    assert seen.head is not None and seen.head.serving
    assert observe(None, [], None) == Observed(pods={"rollout": (), "trainer": (), "reward": (), "environment": ()})


def test_succeeded_once_the_driver_pod_succeeded_before_the_job_is_marked_complete() -> None:
    # the pools are still up and the controller gone: not "Provisioning" again
    observed = Observed(
        ray_cluster=True, head=HEAD, pods=running_pools(), driver=DriverInfo(pod=PodInfo("d", "Succeeded"))
    )
    assert compute_status(job(), observed, None, now=T0).phase == "Succeeded"


def _ended(phase: str, message: str, **driver: Any) -> DriverInfo:
    return DriverInfo(pod=PodInfo("d", phase, termination_message=message), **driver)


def test_the_last_step_comes_from_the_driver_pods_termination_message() -> None:
    last = snapshot(phase=control_pb.RUN_PHASE_SUCCEEDED, step=500, reward_mean=0.93, checkpoint="/c/step-000500")
    message = json_format.MessageToJson(last, indent=None)
    raw = {"metadata": {"name": "d"}, "status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 0, "message": message}}}]}}  # fmt: skip
    assert pod_info(raw).termination_message == message
    # the previous poll saw step 496; the ControlService is gone now
    before = compute_status(job(), Observed(ray_cluster=True, head=HEAD, pods=running_pools(), driver=DRIVER_RUNNING),
                            snapshot(step=496, reward_mean=0.9), now=T0)  # fmt: skip
    driver = _ended("Succeeded", message, complete=True)
    status = compute_status(job(), Observed(driver=driver), final_snapshot(driver), now=T0, previous=before)
    assert (status.phase, status.step, status.checkpoint) == ("Succeeded", 500, "/c/step-000500")
    assert status.reward is not None and status.reward.mean == 0.93


def test_termination_message_counts_only_at_the_end() -> None:
    stopped = json_format.MessageToJson(snapshot(phase=control_pb.RUN_PHASE_STOPPING, step=7), indent=None)
    # a failed attempt the Job retries is not the end; the Job's failure is, with the driver's own reason
    assert final_snapshot(_ended("Failed", stopped)) is None
    assert final_snapshot(_ended("Failed", stopped, failed=True)).step == 7  # type: ignore[union-attr]
    # FallbackToLogsOnError: the end of the log, not JSON
    assert final_snapshot(_ended("Failed", "Traceback (most recent call last):", failed=True)) is None
    assert final_snapshot(_ended("Running", "")) is None and final_snapshot(None) is None
