"""ready_batches: what a producer finished while the consumer was busy comes as one list, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from rljob_workers.common.batching import ready_batches


async def _produce(groups: list[list[int]], gap: float, fail_after: bool = False) -> AsyncIterator[int]:
    """Each group at once (no await between its items), a `gap` between groups."""
    for group in groups:
        for item in group:
            yield item
        await asyncio.sleep(gap)
    if fail_after:
        raise ValueError("engine failed")


async def _collect(source: AsyncIterator[int], limit: int = 0) -> list[list[int]]:
    return [batch async for batch in ready_batches(source, limit)]


def test_items_finished_together_come_together_in_order() -> None:
    groups = [[1, 2, 3, 4], [5], [6, 7]]
    assert asyncio.run(_collect(_produce(groups, gap=0.01))) == groups


def test_a_batch_is_cut_at_the_limit() -> None:
    assert asyncio.run(_collect(_produce([[1, 2, 3, 4, 5]], gap=0.01), limit=2)) == [[1, 2], [3, 4], [5]]


def test_the_producers_error_comes_after_its_items() -> None:
    seen: list[list[int]] = []

    async def body() -> None:
        async for batch in ready_batches(_produce([[1, 2], [3]], gap=0.0, fail_after=True)):
            seen.append(batch)

    with pytest.raises(ValueError, match="engine failed"):
        asyncio.run(body())
    assert [x for b in seen for x in b] == [1, 2, 3]


def test_closing_early_stops_the_producer() -> None:
    finished: list[str] = []

    async def endless() -> AsyncIterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
                await asyncio.sleep(0.001)
        finally:
            finished.append("producer closed")

    async def body() -> list[int]:
        batches = ready_batches(endless())
        first = await anext(batches)
        await batches.aclose()
        await asyncio.sleep(0.01)
        return first

    assert asyncio.run(body()) == [0]
    assert finished == ["producer closed"]
