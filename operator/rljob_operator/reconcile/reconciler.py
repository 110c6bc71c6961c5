"""The operator's two actions over the pure cores: make the children match the spec, and refresh status.

`ensure_children` (the handlers) has `writer.write_children` write every child; `refresh` reads the
children and the controller, updates the `Desired` state (a scale decision, a release) and has
`write_children` write the pools where their rendering changed, then writes status when it changed
and posts an Event on every phase change and every new Degraded reason (reconcile/events.py). Both are
serialised per job. Neither derives the job's worker configs: the handler derives them once per
reconcile (a create is `ensure_children` then `refresh`) and hands them to both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, RLJobStatus
from rljob_api.workercfg import WorkerConfigs
from rljob_operator.kube.claims import check_claims
from rljob_operator.kube.client import describe
from rljob_operator.names import driver_name, ray_cluster_name
from rljob_operator.reconcile.context import Context, key_of, owner_of, stored_status
from rljob_operator.reconcile.events import announce, post
from rljob_operator.reconcile.writer import job_token, write_children
from rljob_operator.status.compute import compute_status
from rljob_operator.status.desired import next_desired, read_back
from rljob_operator.status.observe import Observed, final_snapshot, observe

log = logging.getLogger(__name__)
POOL_LABEL_SELECTOR = "rljob.io/job"


async def ensure_children(ctx: Context, job: RLJob, configs: WorkerConfigs, body: Mapping[str, Any]) -> None:
    """Apply every child the job should have and delete those it must not have (the create, update and
    resume handlers), rendered with the job's worker `configs`. Idempotent; serialised with the job's refreshes."""
    ns = job.metadata.namespace
    async with ctx.lock(key_of(job)):
        cache = ctx.children
        if cache is not None:
            ray_cluster = cache.ray_clusters.get(ns, ray_cluster_name(job))
            driver_job = cache.jobs.get(ns, driver_name(job))
        else:
            ray_cluster, driver_job = await asyncio.gather(
                ctx.kube.get("RayCluster", ns, ray_cluster_name(job)), ctx.kube.get("Job", ns, driver_name(job))
            )
        seen = observe(ray_cluster, (), driver_job)
        current = ctx.desired.get(key_of(job)) or read_back(seen)
        ctx.desired[key_of(job)] = desired = next_desired(job, current, seen)
        await write_children(ctx, job, configs, body, desired)
        await check_claims_of(ctx, job, body)


async def check_claims_of(ctx: Context, job: RLJob, body: Mapping[str, Any]) -> None:
    """Read the job's claims (kube/claims.py) and post a Warning Event for each problem not seen before."""
    key = key_of(job)
    try:
        found = await check_claims(ctx.kube, job)
    except ApiException as exc:  # e.g. an older chart's RBAC: the condition stays as it was
        log.warning("reading the claims of %s/%s: %s", *key, describe(exc))
        return
    before, ctx.claims[key] = ctx.claims.get(key, ()), found
    for problem in found:
        if problem not in before:
            await post(ctx, body, "Warning", problem.reason, problem.message)


async def observe_children(ctx: Context, job: RLJob) -> Observed:
    ns = job.metadata.namespace
    cache = ctx.children
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


async def poll_controller_of(
    ctx: Context, job: RLJob, body: Mapping[str, Any], configs: WorkerConfigs, observed: Observed, poll: bool
) -> tuple[control_pb.JobStatus | None, bool]:
    """The controller's snapshot while the driver runs (polled when `poll` or none is kept yet, else the
    last one), and whether it was polled just now."""
    key = key_of(job)
    driver = observed.driver
    if driver is None or not driver.running:
        ctx.snapshots.pop(key, None)
        return final_snapshot(driver), False  # the last step, reward and checkpoint, once it ended
    if poll or key not in ctx.snapshots:
        token = await job_token(ctx, job, owner_of(body))
        ctx.snapshots[key] = (
            await ctx.control.snapshot(key, ctx.control_address(job, configs), token) if token else None
        )
        return ctx.snapshots[key], True
    return ctx.snapshots[key], False


async def refresh(
    ctx: Context, job: RLJob, configs: WorkerConfigs, body: Mapping[str, Any], *, poll_controller: bool = True
) -> RLJobStatus | None:
    """Observe, decide (scale, release) and write the pools that changed, then status (only when it
    changed); `configs` are the job's worker configs (the controller's address). Serialised per job.

    `poll_controller` False (a child changed) reuses the controller's last snapshot and does not scale.
    None: the RLJob was deleted meanwhile; nothing is remembered or announced for it.
    """
    key = key_of(job)
    async with ctx.lock(key):
        observed = await observe_children(ctx, job)
        if ctx.claims.get(key):  # until a claim is fixed (or made)
            await check_claims_of(ctx, job, body)
        snapshot, fresh = await poll_controller_of(ctx, job, body, configs, observed, poll_controller)
        current = ctx.desired.get(key) or read_back(observed)
        desired = ctx.desired[key] = next_desired(job, current, observed, snapshot if fresh else None)
        await write_children(ctx, job, configs, body, desired, pools_only=True)
        observed = replace(observed, groups=desired.groups)
        previous = ctx.last.get(key) or stored_status(body)
        status = compute_status(
            job,
            observed,
            snapshot,
            now=datetime.now(timezone.utc),
            generation=(body.get("metadata") or {}).get("generation"),
            previous=previous,
            claim_problems=ctx.claims.get(key),
            name_taken=ctx.taken.get(key),
        )
        wire = status.model_dump(by_alias=True, mode="json")
        changed = previous is None or previous.model_dump(by_alias=True, mode="json") != wire
        if changed and not await ctx.kube.patch_status(job.metadata.namespace, job.metadata.name, wire):
            ctx.drop(key)
            return None
        ctx.last[key] = status
        await announce(ctx, body, previous, status, snapshot, observed.driver)
        ctx.metrics.observe_job(key, status, snapshot)
        return status
