"""kopf handlers, thin: validate into the model, then `ensure_children` / `refresh` (reconcile/reconciler.py).

- create, update (spec or labels) and resume (operator start): validate, apply the children, refresh status;
- every RLJob seen on the watch is remembered; a background poller refreshes each one every `interval`
  (children, the controller's ControlService, reward scaling, status, events);
- deletion needs no handler and no finalizer: the children's ownerReferences let the garbage
  collector remove them, even while the operator is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rljob_api import GROUP, PLURAL, VERSION, RLJob, RLJobInvalid, derive_worker_configs
from rljob_api.workercfg import WorkerConfigs
from rljob_operator.config import OperatorConfig
from rljob_operator.kube.children import Children
from rljob_operator.kube.client import Kube, describe, load_api_client, urgent_workers
from rljob_operator.kube.control import ControlClients
from rljob_operator.kube.ownership import NameTaken
from rljob_operator.reconcile.context import Context, invalid_message, key_of, parse_job
from rljob_operator.reconcile.events import post
from rljob_operator.reconcile.metrics import OperatorMetrics
from rljob_operator.reconcile.reconciler import ensure_children, refresh

log = logging.getLogger(__name__)
RESOURCE = (GROUP, VERSION, PLURAL)
NAME_TAKEN_RETRY_SECONDS = 15  # how soon a job whose child's name was taken looks again


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    config: OperatorConfig = memo.get("config") or OperatorConfig()
    # kopf's bookkeeping lives in annotations: the CRD's status schema has no room for it.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    metrics = OperatorMetrics()
    if config.metrics_port:
        port = metrics.serve(config.metrics_port, config.metrics_host)
        logger.info(f"metrics on {config.metrics_host}:{port}/metrics")
    # One pooled connection per thread that may hold one: Kube's two lanes (kopf watches with its own client).
    api = load_api_client(config.concurrency + urgent_workers(config.concurrency))
    ctx = Context(
        config=config,
        kube=Kube(api, workers=config.concurrency),
        control=ControlClients(config.control_timeout_seconds),
        metrics=metrics,
    )
    memo["rljob"] = ctx
    memo["poller"] = asyncio.create_task(poll_forever(ctx), name="rljob-poller")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    poller = memo.get("poller")
    if poller is not None:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller
    ctx: Context | None = memo.get("rljob")
    if ctx is not None:
        await ctx.control.close()
        ctx.kube.close()


@kopf.on.event(*RESOURCE)
async def remember(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """Keep the newest body of every RLJob for the poller; forget deleted ones. The first one also hands the
    poller kopf's indexes of the jobs' children (kube/children.py), which kopf gives to handlers only."""
    ctx: Context = memo["rljob"]
    if ctx.children is None:
        ctx.children = Children.of_handler(kwargs)
    key = (body.metadata.namespace or "default", body.metadata.name or "")
    if event.get("type") == "DELETED":
        await ctx.forget(key)
    else:
        ctx.jobs[key] = dict(body)


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
@kopf.on.update(*RESOURCE, field="metadata.labels")
async def reconcile(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    ctx: Context = memo["rljob"]
    with ctx.metrics.reconcile("reconcile"):
        try:
            job = parse_job(body)
        except RLJobInvalid as exc:
            message = invalid_message(exc)
            await post(ctx, body, "Warning", "InvalidSpec", message)
            meta = body.metadata
            status = {
                "phase": "Failed",
                "message": f"invalid spec: {message}",
                "observedGeneration": meta.get("generation"),
            }
            await ctx.kube.patch_status(meta.namespace or "default", meta.name or "", status)
            raise kopf.PermanentError(f"invalid spec: {message}") from None
        configs = derive_worker_configs(job)  # once per reconcile: the children and the status read them
        try:
            await ensure_children(ctx, job, configs, body)
            ctx.taken.pop(key_of(job), None)
        except NameTaken as exc:  # nothing of the job is written until the name is free: retried
            await name_taken(ctx, job, configs, body, str(exc))
            raise kopf.TemporaryError(f"a child's name is taken: {exc}", delay=NAME_TAKEN_RETRY_SECONDS) from None
        except ApiException as exc:
            await post(ctx, body, "Warning", "ApplyFailed", describe(exc))
            if exc.status in (400, 422):  # the API refuses the child as rendered: retrying will not help
                raise kopf.PermanentError(f"a child was refused: {describe(exc)}") from exc
            raise kopf.TemporaryError(f"applying children: {describe(exc)}", delay=10) from exc
        refreshed = await refresh(ctx, job, configs, body)
        logger.info(f"children applied; phase {refreshed.phase}" if refreshed else "the RLJob was deleted meanwhile")


async def name_taken(ctx: Context, job: RLJob, configs: WorkerConfigs, body: kopf.Body, message: str) -> None:
    """A child's name is someone else's: Degraded with reason NameTaken, one Warning Event per new message."""
    key = key_of(job)
    if ctx.taken.get(key) != message:
        await post(ctx, body, "Warning", "NameTaken", message)
    ctx.taken[key] = message
    await refresh(ctx, job, configs, body)


async def poll_job(ctx: Context, key: tuple[str, str], body: dict[str, Any], full: bool) -> None:
    """Refresh one RLJob (`full`: poll its controller too); a failure is logged, counted and retried
    by the next poll. A job deleted meanwhile is not a failure, and leaves nothing remembered."""
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    try:
        job = parse_job(body)
    except RLJobInvalid:
        return  # the reconcile handler reported it
    try:
        with ctx.metrics.reconcile("poll" if full else "refresh"):
            await refresh(ctx, job, derive_worker_configs(job), body, poll_controller=full)
    except ApiException as exc:
        log.warning("refreshing %s/%s: %s", *key, describe(exc))
    except Exception:
        log.exception("refreshing %s/%s", *key)
    if key not in ctx.jobs:  # its DELETED event came while it was refreshed: undo what the refresh kept
        await ctx.forget(key)


async def poll_forever(ctx: Context) -> None:
    """Refresh every known RLJob each interval (polling its controller), and a job whose children changed
    as soon as kopf's watches say so (kube/children.py); `concurrency` at a time."""
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(ctx.config.concurrency)

    async def poll(key: tuple[str, str], body: dict[str, Any], full: bool) -> None:
        async with gate:
            await poll_job(ctx, key, body, full)

    next_full = loop.time()
    while True:
        full = loop.time() >= next_full
        if full:
            next_full = loop.time() + ctx.config.interval_seconds
            keys = set(ctx.jobs)
        else:
            await asyncio.sleep(0.5)  # a burst of child events (pods starting) becomes one refresh per job
            keys = ctx.poked & set(ctx.jobs)
        ctx.poked.clear()
        ctx.wake.clear()
        polled = [key for key in keys if key in ctx.jobs]
        # return_exceptions: a poll that ended abnormally (a CancelledError it did not ask for, above all)
        # must not end the poller, or no RLJob's status would change again.
        ended = await asyncio.gather(*(poll(key, ctx.jobs[key], full) for key in polled), return_exceptions=True)
        for key, outcome in zip(polled, ended, strict=True):
            if isinstance(outcome, BaseException):
                log.error("refreshing %s/%s ended abnormally: %r; tried again next round", *key, outcome)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ctx.wake.wait(), timeout=max(0.0, next_full - loop.time()))
