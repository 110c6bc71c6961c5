"""The trainer's next step overlaps the delivery of the version before, where maxStaleness allows.

The controller's weight sync snapshots the new version, then delivers it to the rollout pool in the
background (`WeightSync.overlapped`); the next train step may start meanwhile on groups already
generated, while new groups wait for the delivery. The fake sync here takes 50 ms to deliver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_controller_dispatch import Log, make_controller

DELIVERY_SECONDS = 0.05


def run_with_slow_delivery(max_staleness: int, steps: int = 6) -> tuple[list[tuple[int, str, int]], Any]:
    log = Log()
    controller = make_controller(log, "sample", max_staleness, steps, per_step=3, n=4)
    generating_version = controller.rollout.version  # type: ignore[attr-defined]  # what the fake replica generates with
    events: list[tuple[int, str, int]] = []  # (sequence number, what, version)

    async def sync_weights(version: int) -> asyncio.Task[None]:
        events.append((log.tick(), "snapshot", version))

        async def deliver() -> None:
            await asyncio.sleep(DELIVERY_SECONDS)
            generating_version[0] = version
            events.append((log.tick(), "delivered", version))

        return asyncio.create_task(deliver())

    train_step = controller.trainer.train_step

    async def logged_train_step(samples: list[Any]) -> dict[str, float]:
        events.append((log.tick(), "train", controller.version + 1))
        return await train_step(samples)

    controller.sync_weights = sync_weights
    controller.trainer.train_step = logged_train_step  # type: ignore[method-assign]
    reports: list[Any] = []
    controller.on_step = reports.append
    asyncio.run(asyncio.wait_for(controller.run(), 30))
    assert [v for _, what, v in events if what == "delivered"] == list(range(1, steps + 1)), "every version, in order"
    assert controller.counts.discarded_stale == 0
    assert max(report.staleness_max for report in reports) <= max_staleness
    return events, controller


def trains_before_delivery(events: list[tuple[int, str, int]]) -> list[int]:
    """Versions whose train step started before the version before it was delivered."""
    delivered = {v: seq for seq, what, v in events if what == "delivered"}
    return [v for seq, what, v in events if what == "train" and v > 1 and seq < delivered[v - 1]]


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_the_next_step_trains_while_the_version_before_is_delivered(max_staleness: int) -> None:
    events, _ = run_with_slow_delivery(max_staleness)
    assert trains_before_delivery(events), f"no step overlapped a delivery: {events}"


def test_with_max_staleness_0_each_step_waits_for_the_delivery_before_it() -> None:
    events, _ = run_with_slow_delivery(0)
    assert trains_before_delivery(events) == []
