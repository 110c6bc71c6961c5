"""The operator's two actions over the pure cores: make the children match the spec, and refresh status.

`ensure_children` renders and applies (server-side apply, idempotent) and deletes what must not
exist (suspend: the pools and the driver; a finished run: the pools). `refresh` reads the children
and the controller, sizes the reward group, releases the pools of a finished run, writes status when
it changed, and posts an Event on every phase change and every new Degraded reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, RLJobInvalid, RLJobStatus, derive_worker_configs, parse_rljob

from .config import OperatorConfig
from .control import ControlClients
from .informer import Children
from .kube import Kube, describe
from .metrics import OperatorMetrics
from .names import (
    control_service_name,
    driver_name,
    ray_cluster_name,
)
from .observe import Observed, driver_info, observe, reward_group
from .options import Owner, RewardGroup
from .raycluster import render_ray_cluster
from .render import absent_kinds, render
from .scaling import decide_reward_group
from .status import compute_status

log = logging.getLogger(__name__)
Key = tuple[str, str]
POOL_LABEL_SELECTOR = "rljob.io/job"


def plain(value: Any) -> Any:
    """kopf's body views as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def parse_job(body: Mapping[str, Any]) -> RLJob:
    """The RLJob model of a body (spec and the metadata workers read); RLJobInvalid names each field."""
    meta = body.get("metadata") or {}
    document = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or "default",
            "labels": plain(meta.get("labels") or {}),
        },
        "spec": plain(body.get("spec") or {}),
    }
    return parse_rljob(document, f"{meta.get('namespace')}/{meta.get('name')}")


def stored_status(body: Mapping[str, Any]) -> RLJobStatus | None:
    try:
        return RLJobStatus.model_validate(plain(body.get("status") or {}))
    except ValidationError:
        return None


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], uid=meta["uid"])


@dataclass
class Context:
    """What every handler shares; made at startup, kept in kopf's memo."""

    config: OperatorConfig
    kube: Kube
    control: ControlClients
    metrics: OperatorMetrics
    children: Children | None = None  # informers of RayClusters, Jobs, pods; None: read the API
    jobs: dict[Key, dict[str, Any]] = field(default_factory=dict)  # newest body of each RLJob, from the watch
    last: dict[Key, RLJobStatus] = field(default_factory=dict)  # the status last written
    snapshots: dict[Key, control_pb.JobStatus | None] = field(default_factory=dict)  # the controller's, last poll
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    poked: set[Key] = field(default_factory=set)  # jobs whose children changed since the last refresh
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def poke(self, key: Key) -> None:
        """A child of `key` changed: refresh it soon (called on the event loop)."""
        self.poked.add(key)
        self.wake.set()

    def cached(self) -> Children | None:
        return self.children if self.children is not None and self.children.synced() else None

    def control_address(self, job: RLJob) -> str:
        return self.config.control_address.format(
            service=control_service_name(job),
            namespace=job.metadata.namespace,
            job=job.metadata.name,
            port=derive_worker_configs(job).ports.control,
        )

    async def forget(self, key: Key, job: RLJob | None) -> None:
        for table in (self.jobs, self.last, self.locks, self.snapshots):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.metrics.forget(key)
        if job is not None:
            await self.control.forget(self.control_address(job))


async def ensure_children(ctx: Context, job: RLJob, body: Mapping[str, Any]) -> None:
    """Apply every child the job should have and delete those it must not have. Idempotent."""
    ns = job.metadata.namespace
    cache = ctx.cached()
    if cache is not None:
        ray_cluster = cache.ray_clusters.get(ns, ray_cluster_name(job))
        driver_job = cache.jobs.get(ns, driver_name(job))
    else:
        ray_cluster, driver_job = await asyncio.gather(
            ctx.kube.get("RayCluster", ns, ray_cluster_name(job)), ctx.kube.get("Job", ns, driver_name(job))
        )
    replicas, to_delete = reward_group(ray_cluster)
    driver = driver_info(driver_job, ())
    finished = driver is not None and driver.finished
    docs = render(
        job,
        ctx.config.render,
        owner=owner_of(body),
        reward=RewardGroup(replicas, to_delete),
        finished=finished,
    )
    # The pools first (they need nothing else to be scheduled: their pods use no account of ours), then
    # what others need (the driver's ServiceAccount and ConfigMap; the Role, which a RoleBinding is checked
    # against), then the rest at once.
    for wave in (("RayCluster",), ("ServiceAccount", "ConfigMap", "Role"), ("RoleBinding", "Service", "Job")):
        urgent = wave == ("RayCluster",)
        await asyncio.gather(*(ctx.kube.apply(d, urgent=urgent) for d in docs if d["kind"] in wave))
    names = {"RayCluster": ray_cluster_name(job), "Job": driver_name(job)}
    for kind in absent_kinds(job, finished=finished):
        if await ctx.kube.delete(kind, ns, names[kind]):
            reason = "Suspended" if job.spec.suspend else "PoolsReleased"
            await post(ctx, body, "Normal", reason, f"deleted {kind} {names[kind]}")


async def observe_children(ctx: Context, job: RLJob) -> Observed:
    ns = job.metadata.namespace
    cache = ctx.cached()
    if cache is not None:
        return observe(
            cache.ray_clusters.get(ns, ray_cluster_name(job)),
            cache.pods.of_job(ns, job.metadata.name),
            cache.jobs.get(ns, driver_name(job)),
        )
    ray_cluster, pods, driver_job = await asyncio.gather(
        ctx.kube.get("RayCluster", ns, ray_cluster_name(job)),
        ctx.kube.list("Pod", ns, {POOL_LABEL_SELECTOR: job.metadata.name}),
        ctx.kube.get("Job", ns, driver_name(job)),
    )
    return observe(ray_cluster, pods, driver_job)


async def scale_reward(
    ctx: Context, job: RLJob, body: Mapping[str, Any], observed: Observed, snapshot: control_pb.JobStatus
) -> Observed:
    """Apply the controller's reward decision to the RayCluster; only drained pods are removed."""
    current = RewardGroup(observed.reward_replicas, observed.reward_workers_to_delete)
    pods = {p.name for p in observed.pool_pods("reward") if not p.deleting}
    decision = decide_reward_group(
        job.spec.reward.replicas, current, snapshot.reward.desired, list(snapshot.reward.drained), pods
    )
    if decision == current:
        return observed
    doc = render_ray_cluster(job, ctx.config.render, decision)
    doc["metadata"]["ownerReferences"] = [owner_of(body).reference()]
    await ctx.kube.apply(doc)
    removed = f", removing drained {', '.join(decision.workers_to_delete)}" if decision.workers_to_delete else ""
    message = f"reward replicas {current.replicas} -> {decision.replicas}{removed}"
    await post(ctx, body, "Normal", "RewardScaled", message)
    return replace(observed, reward_replicas=decision.replicas, reward_workers_to_delete=decision.workers_to_delete)


async def refresh(
    ctx: Context, job: RLJob, body: Mapping[str, Any], *, poll_controller: bool = True
) -> RLJobStatus | None:
    """Observe, scale, release, and write status (only when it changed). Serialised per job.

    `poll_controller` False (a child changed) reuses the controller's last snapshot and does not scale.
    None: the RLJob was deleted meanwhile; nothing is remembered or announced for it.
    """
    key = (job.metadata.namespace, job.metadata.name)
    async with ctx.lock(key):
        observed = await observe_children(ctx, job)
        driver = observed.driver
        snapshot = None
        fresh = False
        if driver is not None and driver.running:
            if poll_controller or key not in ctx.snapshots:
                snapshot = ctx.snapshots[key] = await ctx.control.snapshot(ctx.control_address(job))
                fresh = True
            else:
                snapshot = ctx.snapshots[key]
        else:
            ctx.snapshots.pop(key, None)
        live = not job.spec.suspend and not (driver is not None and driver.finished)
        if fresh and snapshot is not None and live and observed.ray_cluster:
            observed = await scale_reward(ctx, job, body, observed, snapshot)
        if not live and observed.ray_cluster and not job.spec.suspend:
            await ctx.kube.delete("RayCluster", job.metadata.namespace, ray_cluster_name(job))
            message = "the run ended; its RayCluster is deleted, the driver Job kept"
            await post(ctx, body, "Normal", "PoolsReleased", message)
            observed = replace(observed, ray_cluster=False)
        previous = ctx.last.get(key) or stored_status(body)
        status = compute_status(
            job,
            observed,
            snapshot,
            now=datetime.now(timezone.utc),
            generation=(body.get("metadata") or {}).get("generation"),
            previous=previous,
        )
        wire = status.model_dump(by_alias=True, mode="json")
        changed = previous is None or previous.model_dump(by_alias=True, mode="json") != wire
        if changed and not await ctx.kube.patch_status(job.metadata.namespace, job.metadata.name, wire):
            return None
        ctx.last[key] = status
        await announce(ctx, body, previous, status)
        ctx.metrics.observe_job(key, status, snapshot)
        return status


async def announce(ctx: Context, body: Mapping[str, Any], before: RLJobStatus | None, after: RLJobStatus) -> None:
    """An Event per phase change, and per Degraded condition that turned True or changed its reason."""
    if before is None or before.phase != after.phase:
        kind = "Warning" if after.phase == "Failed" else "Normal"
        await post(ctx, body, kind, after.phase or "Pending", after.message or "")
    old = {c.type: c for c in (before.conditions if before else [])}.get("Degraded")
    new = next((c for c in after.conditions if c.type == "Degraded"), None)
    if new is not None and new.status == "True" and (old is None or (old.status, old.reason) != ("True", new.reason)):
        await post(ctx, body, "Warning", new.reason, new.message)


async def post(ctx: Context, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the RLJob; a failure to post is logged, never raised."""
    meta = body.get("metadata") or {}
    ref = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
    }
    try:
        await ctx.kube.post_event(ref, kind, reason, message)
    except Exception as exc:  # an Event is best effort
        log.warning("posting event %s on %s/%s: %s", reason, meta.get("namespace"), meta.get("name"), describe(exc))


def invalid_message(exc: RLJobInvalid) -> str:
    return "; ".join(str(e) for e in exc.errors)
