"""The one writer of an RLJob's children: it renders them from the spec and the job's `Desired` state
(status/desired.py: the elastic groups' sizes, whether the run has ended), applies them (server-side apply,
idempotent) and deletes what must not exist (suspend: the pools and the driver; a finished run: the
pools). It also makes the job's token Secret once, and reads the token back for the controller's client.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Mapping
from typing import Any

from rljob_api import RLJob
from rljob_api.workercfg import ELASTIC_POOLS, WorkerConfigs
from rljob_operator.kube.ownership import (
    NameTaken,
    delete_if_owned,
    describe_taken,
    owned_by,
    remove_legacy_rbac,
    taken_names,
)
from rljob_operator.names import (
    JOB_TOKEN_KEY,
    RAY_TOKEN_KEY,
    driver_name,
    ray_cluster_name,
    service_account_name,
    token_secret_name,
)
from rljob_operator.options import Owner
from rljob_operator.reconcile.context import Context, key_of, owner_of
from rljob_operator.reconcile.events import post
from rljob_operator.render.manifests import POOL_KINDS, absent_kinds, finish, render, render_pools, render_token_secret
from rljob_operator.status.desired import Desired
from rljob_operator.status.observe import elastic_group


async def write_children(
    ctx: Context,
    job: RLJob,
    configs: WorkerConfigs,
    body: Mapping[str, Any],
    desired: Desired,
    *,
    pools_only: bool = False,
) -> None:
    """The one writer of an RLJob's children: render them from the spec (and its worker `configs`, derived once
    per reconcile) and `desired`, apply, and delete those that must not exist. The caller holds the job's
    lock.

    Every child (the handlers), in dependency waves. `pools_only` (a refresh): only the pools, and only
    where their rendering differs from what this process last wrote; nothing for a job no handler has
    written yet in this process (after a restart the resume handler writes it first).
    """
    key = key_of(job)
    written = ctx.pools.get(key)
    if pools_only and written is None:
        return
    owner = owner_of(body)
    if pools_only:
        docs = render_pools(job, ctx.config.render, desired.groups, desired.finished, owner)
        waves: tuple[tuple[str, ...], ...] = (POOL_KINDS,)
    else:
        docs = render(job, configs, ctx.config.render, owner=owner, groups=desired.groups, finished=desired.finished)
        # The pools first (they need nothing else to be scheduled: their pods use no account of ours), then
        # what others need (the driver's ServiceAccount and ConfigMap; the Role, which a RoleBinding is
        # checked against), then the rest at once.
        # The NetworkPolicy goes with them, so that no pod of the job is ever open to other pods.
        waves = ((*POOL_KINDS, "NetworkPolicy"), ("ServiceAccount", "ConfigMap"), ("Service", "Job"))
        # Before the first child is written: every name is free or this job's (kube/ownership.py).
        taken = await taken_names(ctx.kube, docs, owner.uid)
        if taken:
            raise NameTaken("; ".join(taken))
        await ensure_token(ctx, job, owner)
        await _remove_legacy_rbac(ctx, job, body, owner)
    written = ctx.pools.setdefault(key, {})
    for wave in waves:
        todo = [d for d in docs if d["kind"] in wave and not (pools_only and written.get(d["kind"]) == d)]
        await asyncio.gather(*(_apply(ctx, body, d, written, urgent=wave is waves[0]) for d in todo))
    names = {"RayCluster": ray_cluster_name(job), "Job": driver_name(job)}
    for kind in absent_kinds(job, finished=desired.finished):
        if pools_only and (kind not in POOL_KINDS or written.get(kind) is None):
            continue
        if await delete_if_owned(ctx.kube, kind, job.metadata.namespace, names[kind], owner.uid):
            await post(ctx, body, "Normal", *_deleted(job, kind, names[kind]))
        if kind in POOL_KINDS:
            written[kind] = None


async def ensure_token(ctx: Context, job: RLJob, owner: Owner) -> None:
    """Make the job's token Secret once (a random token); one that exists is kept, if it is this job's, and
    given Ray's key where an older operator made it without (KubeRay reads the token under that key)."""
    key = key_of(job)
    if key in ctx.token_checked:
        return
    token = secrets.token_urlsafe(32)
    if await ctx.kube.create(finish(render_token_secret(job, token), job, owner)):
        ctx.tokens[key] = token
        ctx.token_checked.add(key)
        return
    found = await ctx.kube.get("Secret", job.metadata.namespace, token_secret_name(job)) or {}
    if not owned_by(found, owner.uid):  # whoever made it knows the token: the job's pools must not trust it
        raise NameTaken(describe_taken("Secret", job.metadata.namespace, token_secret_name(job), found))
    data = found.get("data") or {}
    if RAY_TOKEN_KEY not in data and JOB_TOKEN_KEY in data:
        doc = finish(render_token_secret(job, ""), job, owner)
        doc.pop("stringData")
        await ctx.kube.apply({**doc, "data": {RAY_TOKEN_KEY: data[JOB_TOKEN_KEY]}})
    ctx.token_checked.add(key)


async def job_token(ctx: Context, job: RLJob, owner: Owner) -> str | None:
    """The job's token, from its Secret (read once) if the Secret is the job's; None while there is none.
    A Secret of the name that is someone else's is not read: its token would go to the job's controller."""
    key = key_of(job)
    if key not in ctx.tokens:
        found = await ctx.kube.get("Secret", job.metadata.namespace, token_secret_name(job))
        data = (found or {}).get("data") or {}
        if JOB_TOKEN_KEY not in data or not owned_by(found or {}, owner.uid):
            return None
        ctx.tokens[key] = base64.b64decode(data[JOB_TOKEN_KEY]).decode().strip()
    return ctx.tokens[key]


async def _apply(
    ctx: Context, body: Mapping[str, Any], doc: dict[str, Any], written: dict[str, dict[str, Any] | None], urgent: bool
) -> None:
    """Apply one child; for the pools, keep what was written and announce a changed elastic group
    (RewardScaled, EnvironmentScaled)."""
    await ctx.kube.apply(doc, urgent=urgent)
    kind = doc["kind"]
    if kind not in POOL_KINDS:
        return
    before, written[kind] = written.get(kind), doc
    if before is None:
        return
    for pool in ELASTIC_POOLS:
        was, now = elastic_group(before, pool), elastic_group(doc, pool)
        if was == now:
            continue
        removed = f", removing drained {', '.join(now.workers_to_delete)}" if now.workers_to_delete else ""
        reason = f"{pool.capitalize()}Scaled"
        await post(ctx, body, "Normal", reason, f"{pool} replicas {was.replicas} -> {now.replicas}{removed}")


async def _remove_legacy_rbac(ctx: Context, job: RLJob, body: Mapping[str, Any], owner: Owner) -> None:
    """Once per job and process: the Role and RoleBinding an older operator made for it, if they are its own."""
    key = key_of(job)
    if key in ctx.rbac_checked:
        return
    account = service_account_name(job)
    for kind in await remove_legacy_rbac(ctx.kube, job.metadata.namespace, account, owner.uid):
        await post(ctx, body, "Normal", "RightsDropped", f"deleted {kind} {account}: the driver needs no rights")
    ctx.rbac_checked.add(key)


def _deleted(job: RLJob, kind: str, name: str) -> tuple[str, str]:
    """The reason and message of the Event on deleting a child."""
    if job.spec.suspend:
        return "Suspended", f"deleted {kind} {name}"
    return "PoolsReleased", f"the run ended; its {kind} {name} is deleted, the driver Job kept"
