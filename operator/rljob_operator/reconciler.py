"""The operator's two actions over the pure cores: make the children match the spec, and refresh status.

`write_children` is the one writer of an RLJob's children: it renders them from the spec and the
job's `Desired` state (desired.py: the reward group's size, whether the run has ended), applies them
(server-side apply, idempotent) and deletes what must not exist (suspend: the pools and the driver;
a finished run: the pools). `ensure_children` (the handlers) writes every child; `refresh` reads the
children and the controller, updates the `Desired` state (a scale decision, a release) and has
`write_children` write the pools where their rendering changed, then writes status when it changed
and posts an Event on every phase change and every new Degraded reason. Both are serialised per job.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, RLJobInvalid, RLJobStatus, derive_worker_configs, parse_rljob
from rljob_api.colocate import refuse_on_a_cluster

from .children import Children
from .claims import ClaimProblem, check_claims
from .config import OperatorConfig
from .control import ControlClients
from .desired import Desired, next_desired, read_back
from .kube import Kube, describe
from .metrics import OperatorMetrics
from .names import (
    JOB_TOKEN_KEY,
    control_service_name,
    driver_name,
    ray_cluster_name,
    token_secret_name,
)
from .observe import DriverInfo, Observed, final_snapshot, observe, reward_group
from .options import Owner
from .render import POOL_KINDS, absent_kinds, finish, render, render_pools, render_token_secret
from .restarts import restart_events
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
    source = f"{meta.get('namespace')}/{meta.get('name')}"
    job = parse_rljob(document, source)
    refuse_on_a_cluster(job, source)  # one machine's GPUs shared by two pools: `rljob run`'s, not the operator's
    return job


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
    children: Children | None = None  # kopf's indexes of RayClusters, Jobs, pods (children.py); None: read the API
    jobs: dict[Key, dict[str, Any]] = field(default_factory=dict)  # newest body of each RLJob, from the watch
    last: dict[Key, RLJobStatus] = field(default_factory=dict)  # the status last written
    snapshots: dict[Key, control_pb.JobStatus | None] = field(default_factory=dict)  # the controller's, last poll
    desired: dict[Key, Desired] = field(default_factory=dict)  # what the pools are rendered from (desired.py)
    pools: dict[Key, dict[str, dict[str, Any] | None]] = field(default_factory=dict)  # as last written; None: deleted
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    tokens: dict[Key, str] = field(default_factory=dict)  # each job's token (its Secret), once read or made
    claims: dict[Key, tuple[ClaimProblem, ...]] = field(default_factory=dict)  # the last check of its claims
    poked: set[Key] = field(default_factory=set)  # jobs whose children changed since the last refresh
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def poke(self, key: Key) -> None:
        """A child of `key` changed: refresh it soon (called on the event loop)."""
        self.poked.add(key)
        self.wake.set()

    def control_address(self, job: RLJob) -> str:
        return self.config.control_address.format(
            service=control_service_name(job),
            namespace=job.metadata.namespace,
            job=job.metadata.name,
            port=derive_worker_configs(job).ports.control,
        )

    def drop(self, key: Key) -> None:
        """Forget what was kept of a job's state (its status, snapshot, decisions, pools as written)."""
        for table in (self.last, self.snapshots, self.desired, self.pools, self.tokens, self.claims):
            table.pop(key, None)  # type: ignore[attr-defined]

    async def forget(self, key: Key) -> None:
        self.drop(key)
        for table in (self.jobs, self.locks):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.metrics.forget(key)
        await self.control.forget(key)


def key_of(job: RLJob) -> Key:
    return (job.metadata.namespace, job.metadata.name)


async def ensure_children(ctx: Context, job: RLJob, body: Mapping[str, Any]) -> None:
    """Apply every child the job should have and delete those it must not have (the create, update and
    resume handlers). Idempotent; serialised with the job's refreshes."""
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
        await write_children(ctx, job, body, desired)
        await check_claims_of(ctx, job, body)


async def check_claims_of(ctx: Context, job: RLJob, body: Mapping[str, Any]) -> None:
    """Read the job's claims (claims.py) and post a Warning Event for each problem not seen before."""
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


async def write_children(
    ctx: Context, job: RLJob, body: Mapping[str, Any], desired: Desired, *, pools_only: bool = False
) -> None:
    """The one writer of an RLJob's children: render them from the spec and `desired`, apply, and delete
    those that must not exist. The caller holds the job's lock.

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
        docs = render_pools(job, ctx.config.render, desired.reward, desired.finished, owner)
        waves: tuple[tuple[str, ...], ...] = (POOL_KINDS,)
    else:
        docs = render(job, ctx.config.render, owner=owner, reward=desired.reward, finished=desired.finished)
        # The pools first (they need nothing else to be scheduled: their pods use no account of ours), then
        # what others need (the driver's ServiceAccount and ConfigMap; the Role, which a RoleBinding is
        # checked against), then the rest at once.
        # The NetworkPolicy goes with them, so that no pod of the job is ever open to other pods.
        waves = (
            (*POOL_KINDS, "NetworkPolicy"),
            ("ServiceAccount", "ConfigMap", "Role"),
            ("RoleBinding", "Service", "Job"),
        )
    written = ctx.pools.setdefault(key, {})
    if not pools_only:
        await ensure_token(ctx, job, owner)
    for wave in waves:
        todo = [d for d in docs if d["kind"] in wave and not (pools_only and written.get(d["kind"]) == d)]
        await asyncio.gather(*(_apply(ctx, body, d, written, urgent=wave is waves[0]) for d in todo))
    names = {"RayCluster": ray_cluster_name(job), "Job": driver_name(job)}
    for kind in absent_kinds(job, finished=desired.finished):
        if pools_only and (kind not in POOL_KINDS or written.get(kind) is None):
            continue
        if await ctx.kube.delete(kind, job.metadata.namespace, names[kind]):
            await post(ctx, body, "Normal", *_deleted(job, kind, names[kind]))
        if kind in POOL_KINDS:
            written[kind] = None


async def ensure_token(ctx: Context, job: RLJob, owner: Owner) -> None:
    """Make the job's token Secret once (a random token); one that exists is kept, if it is this job's."""
    key = key_of(job)
    if key in ctx.tokens:
        return
    token = secrets.token_urlsafe(32)
    if await ctx.kube.create(finish(render_token_secret(job, token), job, owner)):
        ctx.tokens[key] = token
        return
    found = await ctx.kube.get("Secret", job.metadata.namespace, token_secret_name(job)) or {}
    owners = [ref.get("uid") for ref in (found.get("metadata") or {}).get("ownerReferences") or []]
    if owner.uid not in owners:
        # Whoever made it knows the token: the job's pools must not trust it.
        raise RuntimeError(
            f"Secret {job.metadata.namespace}/{token_secret_name(job)} exists and is not this RLJob's; "
            "delete it (the operator makes the job's token)"
        )


async def job_token(ctx: Context, job: RLJob) -> str | None:
    """The job's token, from its Secret (read once); None while there is none."""
    key = key_of(job)
    if key not in ctx.tokens:
        found = await ctx.kube.get("Secret", job.metadata.namespace, token_secret_name(job))
        data = (found or {}).get("data") or {}
        if JOB_TOKEN_KEY not in data:
            return None
        ctx.tokens[key] = base64.b64decode(data[JOB_TOKEN_KEY]).decode().strip()
    return ctx.tokens[key]


async def _apply(
    ctx: Context, body: Mapping[str, Any], doc: dict[str, Any], written: dict[str, dict[str, Any] | None], urgent: bool
) -> None:
    """Apply one child; for the pools, keep what was written and announce a changed reward group."""
    await ctx.kube.apply(doc, urgent=urgent)
    kind = doc["kind"]
    if kind not in POOL_KINDS:
        return
    before, written[kind] = written.get(kind), doc
    if before is None or reward_group(before) == reward_group(doc):
        return
    (was, _), (now, to_delete) = reward_group(before), reward_group(doc)
    removed = f", removing drained {', '.join(to_delete)}" if to_delete else ""
    await post(ctx, body, "Normal", "RewardScaled", f"reward replicas {was} -> {now}{removed}")


def _deleted(job: RLJob, kind: str, name: str) -> tuple[str, str]:
    """The reason and message of the Event on deleting a child."""
    if job.spec.suspend:
        return "Suspended", f"deleted {kind} {name}"
    return "PoolsReleased", f"the run ended; its {kind} {name} is deleted, the driver Job kept"


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
    ctx: Context, job: RLJob, observed: Observed, poll: bool
) -> tuple[control_pb.JobStatus | None, bool]:
    """The controller's snapshot while the driver runs (polled when `poll` or none is kept yet, else the
    last one), and whether it was polled just now."""
    key = key_of(job)
    driver = observed.driver
    if driver is None or not driver.running:
        ctx.snapshots.pop(key, None)
        return final_snapshot(driver), False  # the last step, reward and checkpoint, once it ended
    if poll or key not in ctx.snapshots:
        token = await job_token(ctx, job)
        ctx.snapshots[key] = await ctx.control.snapshot(key, ctx.control_address(job), token) if token else None
        return ctx.snapshots[key], True
    return ctx.snapshots[key], False


async def refresh(
    ctx: Context, job: RLJob, body: Mapping[str, Any], *, poll_controller: bool = True
) -> RLJobStatus | None:
    """Observe, decide (scale, release) and write the pools that changed, then status (only when it
    changed). Serialised per job.

    `poll_controller` False (a child changed) reuses the controller's last snapshot and does not scale.
    None: the RLJob was deleted meanwhile; nothing is remembered or announced for it.
    """
    key = key_of(job)
    async with ctx.lock(key):
        observed = await observe_children(ctx, job)
        if ctx.claims.get(key):  # until a claim is fixed (or made)
            await check_claims_of(ctx, job, body)
        snapshot, fresh = await poll_controller_of(ctx, job, observed, poll_controller)
        current = ctx.desired.get(key) or read_back(observed)
        desired = ctx.desired[key] = next_desired(job, current, observed, snapshot if fresh else None)
        await write_children(ctx, job, body, desired, pools_only=True)
        reward = desired.reward
        observed = replace(observed, reward_replicas=reward.replicas, reward_workers_to_delete=reward.workers_to_delete)
        previous = ctx.last.get(key) or stored_status(body)
        status = compute_status(
            job,
            observed,
            snapshot,
            now=datetime.now(timezone.utc),
            generation=(body.get("metadata") or {}).get("generation"),
            previous=previous,
            claim_problems=ctx.claims.get(key),
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


async def announce(
    ctx: Context,
    body: Mapping[str, Any],
    before: RLJobStatus | None,
    after: RLJobStatus,
    snapshot: control_pb.JobStatus | None = None,
    driver: DriverInfo | None = None,
) -> None:
    """An Event per phase change, per Degraded condition that turned True or changed its reason, and
    per replacement of a replica, a trainer group or a driver pod."""
    if before is None or before.phase != after.phase:
        kind = "Warning" if after.phase == "Failed" else "Normal"
        await post(ctx, body, kind, after.phase or "Pending", after.message or "")
    old = {c.type: c for c in (before.conditions if before else [])}.get("Degraded")
    new = next((c for c in after.conditions if c.type == "Degraded"), None)
    told_below = new is not None and new.reason == "DriverRestarted"  # one Event per failed driver pod, below
    changed = new is not None and (old is None or (old.status, old.reason) != ("True", new.reason))
    if new is not None and new.status == "True" and changed and not told_below:
        await post(ctx, body, "Warning", new.reason, new.message)
    for reason, message in restart_events(before.restarts if before else None, snapshot, driver):
        await post(ctx, body, "Warning", reason, message)


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
