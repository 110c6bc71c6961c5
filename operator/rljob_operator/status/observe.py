"""What the operator reads back from the cluster, reduced to the facts status and scaling need. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api.workercfg import POOLS, Pool
from rljob_operator.names import LABEL_COMPONENT, LABEL_POOL
from rljob_operator.options import ElasticGroup, ElasticGroups


@dataclass(frozen=True)
class PodInfo:
    """One pod: its phase, readiness, and why the scheduler could not place it (if it could not)."""

    name: str
    phase: str = "Pending"
    ready: bool = False
    unschedulable: str | None = None
    deleting: bool = False
    created: str = ""
    termination_message: str = ""  # its container's, once it terminated
    image_pull: str = ""  # why a container's image cannot be pulled (IMAGE_PULL_REASONS), naming the image
    crash_loop: str = ""  # a container the kubelet keeps restarting (CrashLoopBackOff): which, and how it ended

    @property
    def serving(self) -> bool:
        return self.phase == "Running" and self.ready and not self.deleting


@dataclass(frozen=True)
class DriverInfo:
    """The driver Job: finished (Complete or Failed, with the reason), failed attempts, and its newest pod."""

    complete: bool = False
    failed: bool = False
    message: str = ""
    failed_attempts: int = 0
    pod: PodInfo | None = None
    deadline_exceeded: bool = False  # Failed by the Job's activeDeadlineSeconds (spec.activeDeadlineSeconds)

    @property
    def finished(self) -> bool:
        return self.complete or self.failed

    @property
    def succeeded(self) -> bool:
        """The Job is Complete, or its pod succeeded (a moment before the Job controller marks the Job)."""
        return self.complete or (self.pod is not None and self.pod.phase == "Succeeded")

    @property
    def running(self) -> bool:
        return self.pod is not None and self.pod.phase == "Running" and not self.pod.deleting


@dataclass(frozen=True)
class Observed:
    """The children as they are: the RayCluster (and its elastic groups' sizes), pool pods, the driver."""

    ray_cluster: bool = False
    groups: ElasticGroups = field(default_factory=ElasticGroups)
    pods: Mapping[Pool, tuple[PodInfo, ...]] = field(default_factory=dict)
    head: PodInfo | None = None
    driver: DriverInfo | None = None

    def pool_pods(self, pool: Pool) -> tuple[PodInfo, ...]:
        return self.pods.get(pool, ())

    def image_pulls(self, pool: Pool | None = None) -> list[str]:
        """'pod NAME: why' for each live pod of `pool` (None: of the whole job, head and driver too) that
        cannot pull its image."""
        if pool is not None:
            pods: list[PodInfo | None] = list(self.pool_pods(pool))
        else:
            pods = [
                self.head,
                *(p for group in self.pods.values() for p in group),
                self.driver.pod if self.driver else None,
            ]
        return [f"pod {p.name}: {p.image_pull}" for p in pods if p is not None and p.image_pull and not p.deleting]

    def crash_loops(self, pool: Pool) -> list[str]:
        """'pod NAME: which container' for each live pod of `pool` whose container the kubelet keeps restarting."""
        return [f"pod {p.name}: {p.crash_loop}" for p in self.pool_pods(pool) if p.crash_loop and not p.deleting]


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


# The kubelet's waiting reasons of a container whose image it cannot get: the pod never starts by itself.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)


def _image_pull(status: Mapping[str, Any]) -> str:
    """The first container (init containers first) waiting for an image it cannot pull: reason, image, cause."""
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            cause = str(waiting.get("message") or "").strip()
            return f"{waiting['reason']} {container.get('image', '?')}" + (f": {cause}" if cause else "")
    return ""


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready = _condition(pod, "Ready")
    scheduled = _condition(pod, "PodScheduled")
    unschedulable = None
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = str(scheduled.get("message") or "Unschedulable")
    return PodInfo(
        name=str(meta.get("name", "")),
        phase=str(status.get("phase") or "Pending"),
        ready=bool(ready and ready.get("status") == "True"),
        unschedulable=unschedulable,
        deleting=bool(meta.get("deletionTimestamp")),
        created=str(meta.get("creationTimestamp") or ""),
        termination_message=_termination_message(status),
        image_pull=_image_pull(status),
        crash_loop=_crash_loop(status),
    )


def _crash_loop(status: Mapping[str, Any]) -> str:
    """The first container in CrashLoopBackOff: its name, image and how its last run ended."""
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            ended = ((container.get("lastState") or {}).get("terminated")) or {}
            how = f"exit code {ended.get('exitCode', '?')}" + (f", {ended['reason']}" if ended.get("reason") else "")
            return f"container {container.get('name', '?')} ({container.get('image', '?')}) keeps exiting ({how})"
    return ""


def _termination_message(status: Mapping[str, Any]) -> str:
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("message"):
            return str(terminated["message"])
    return ""


def final_snapshot(driver: DriverInfo | None) -> control_pb.JobStatus | None:
    """The controller's last status, as the driver pod left it in its termination message, once the run
    is over: the driver pod succeeded, or the Job failed for good (a failed attempt the Job retries is
    not the end). None without one (a driver killed before it wrote it leaves its log's end instead)."""
    if driver is None or driver.pod is None or not driver.pod.termination_message:
        return None
    if not (driver.succeeded or driver.finished):
        return None
    try:
        return json_format.Parse(driver.pod.termination_message, control_pb.JobStatus(), ignore_unknown_fields=True)
    except json_format.ParseError:
        return None


def driver_info(job: Mapping[str, Any] | None, pods: Iterable[PodInfo]) -> DriverInfo | None:
    """The driver Job's state; None when there is no Job."""
    if job is None:
        return None
    complete = _condition(job, "Complete")
    failed = _condition(job, "Failed")
    newest = max(pods, key=lambda p: (p.created, p.name), default=None)
    is_failed = bool(failed and failed.get("status") == "True")
    return DriverInfo(
        complete=bool(complete and complete.get("status") == "True"),
        failed=is_failed,
        message=str((failed or {}).get("message") or "") if is_failed else "",
        failed_attempts=int((job.get("status") or {}).get("failed") or 0),
        pod=newest,
        deadline_exceeded=is_failed and (failed or {}).get("reason") == "DeadlineExceeded",
    )


def elastic_group(ray_cluster: Mapping[str, Any] | None, pool: Pool) -> ElasticGroup:
    """An elastic worker group's replicas and workersToDelete as the RayCluster holds them."""
    for group in ((ray_cluster or {}).get("spec") or {}).get("workerGroupSpecs") or ():
        if group.get("groupName") == pool:
            to_delete = (group.get("scaleStrategy") or {}).get("workersToDelete") or ()
            replicas = group.get("replicas")
            return ElasticGroup(int(replicas) if replicas is not None else None, tuple(str(n) for n in to_delete))
    return ElasticGroup()


def elastic_groups(ray_cluster: Mapping[str, Any] | None) -> ElasticGroups:
    """The reward and environment groups as the RayCluster holds them."""
    return ElasticGroups(elastic_group(ray_cluster, "reward"), elastic_group(ray_cluster, "environment"))


def observe(
    ray_cluster: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    driver_job: Mapping[str, Any] | None,
) -> Observed:
    """Group the job's pods (all labelled rljob.io/job) by pool and driver, and read the RayCluster."""
    by_pool: dict[Pool, list[PodInfo]] = {p: [] for p in POOLS}
    driver_pods: list[PodInfo] = []
    heads: list[PodInfo] = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        info = pod_info(pod)
        pool = labels.get(LABEL_POOL)
        if pool in by_pool:
            by_pool[pool].append(info)
        elif labels.get(LABEL_COMPONENT) == "driver":
            driver_pods.append(info)
        elif labels.get(LABEL_COMPONENT) == "head":
            heads.append(info)
    return Observed(
        ray_cluster=ray_cluster is not None,
        groups=elastic_groups(ray_cluster),
        pods={p: tuple(sorted(v, key=lambda i: i.name)) for p, v in by_pool.items()},
        head=max(heads, key=lambda p: (p.serving, p.created, p.name), default=None),
        driver=driver_info(driver_job, driver_pods),
    )
