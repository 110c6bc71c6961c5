"""The kopf handlers, called as kopf calls them, against the fake API server of test_operator_reconciler.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import kopf
from test_operator_reconciler import NAME, NS, RC, body, context, driver_job, pod, running

from rljob_operator.process import handlers
from rljob_operator.reconcile.context import Context

from derivations import counted_derivations


def test_a_reconcile_derives_the_worker_configs_once_create_included() -> None:
    """Through the real handlers: a create (every child, then the status) derives the job's worker configs once,
    as does a poll (a refresh) and an update; the handler hands the one derivation to both halves."""

    async def reconcile(ctx: Context, doc: dict[str, Any]) -> None:
        """kopf's create/update/resume handler itself, called with the keyword arguments it reads."""
        handler = cast(Callable[..., Awaitable[None]], handlers.reconcile)
        await handler(body=kopf.Body(cast(kopf.RawBody, doc)), memo=kopf.Memo(rljob=ctx), logger=logging.getLogger())

    async def play() -> list[int]:
        ctx, kube, cache, control = context()
        doc = body()
        key, counts = (NS, NAME), list[int]()
        with counted_derivations() as calls:
            await reconcile(ctx, doc)  # created
            assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)] and key in ctx.last
            counts.append(calls[0])
            kube.put(driver_job())
            kube.put(pod("elastic-driver-x", {"rljob.io/component": "driver"}))
            cache.sync()
            control.status = running(desired=2)
            ctx.jobs[key] = doc
            await handlers.poll_job(ctx, key, doc, full=True)  # the poller's: scales the reward group
            assert kube.reward_group() == (2, [])
            counts.append(calls[0] - sum(counts))
            doc["metadata"]["labels"] = {"team": "b"}
            await reconcile(ctx, doc)  # updated
            counts.append(calls[0] - sum(counts))
        return counts

    assert asyncio.run(play()) == [1, 1, 1]
