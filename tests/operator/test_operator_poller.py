"""The operator's poller outlives any one poll: a poll that ends abnormally is logged and tried again
at the next round, while the other RLJobs go on being refreshed.

Stop 26's CI: a poll cancelled from outside (the gRPC channel it used was closed under it) raised
CancelledError out of `poll_forever`, which ended; no RLJob's status changed again, and the scale test's
jobs stayed Provisioning for good. Here each poll is `poll_job` replaced by a recorder, since what is
tested is the loop around it (the refresh itself is test_operator_reconciler.py's).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from rljob_operator.config import OperatorConfig
from rljob_operator.kube.client import Kube
from rljob_operator.kube.control import ControlClients
from rljob_operator.process import handlers
from rljob_operator.reconcile.context import Context
from rljob_operator.reconcile.metrics import OperatorMetrics

GOOD, BAD = ("ns", "good"), ("ns", "bad")


def test_a_poll_ended_by_a_stray_cancellation_does_not_stop_the_poller(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    polls: list[tuple[str, str]] = []

    async def poll_job(ctx: Context, key: tuple[str, str], body: dict[str, Any], full: bool) -> None:
        polls.append(key)
        if key == BAD and polls.count(BAD) == 1:
            raise asyncio.CancelledError()  # as a call on a channel closed under it raises

    monkeypatch.setattr(handlers, "poll_job", poll_job)
    ctx = Context(
        config=OperatorConfig(interval_seconds=0.1),
        kube=cast(Kube, None),  # the recorder above makes no request
        control=ControlClients(0.5),
        metrics=OperatorMetrics(),
    )
    ctx.jobs = {GOOD: {}, BAD: {}}

    async def run_for(seconds: float) -> bool:
        poller = asyncio.create_task(handlers.poll_forever(ctx))
        await asyncio.sleep(seconds)
        alive = not poller.done()
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
        return alive

    with caplog.at_level(logging.ERROR, logger="rljob_operator.process.handlers"):
        alive = asyncio.run(run_for(1.0))
    assert alive, "the poller ended"
    assert polls.count(GOOD) >= 5 and polls.count(BAD) >= 5, polls
    assert any("ns/bad" in r.getMessage() and "CancelledError" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
