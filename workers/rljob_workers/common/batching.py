"""Coalescing a stream into the items that are ready together, so one gRPC message carries many.

A message costs the same CPU whether it carries one sample or sixteen; an engine that finishes a
whole group at once should not pay for sixteen. Nothing waits to fill a batch: a batch is what the
producer finished while the consumer was busy sending the last one, so latency is never added.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")
_END = object()
# Items sent together share one message up to this size, far under the 64 MiB gRPC limit (a lone
# item may be larger, to that limit): a group of long completions with their log-probs must fit.
MESSAGE_BUDGET_BYTES = 4 * 1024 * 1024


async def ready_batches(items: AsyncIterator[T], limit: int = 0) -> AsyncGenerator[list[T], None]:
    """`items`, in order, as lists of whatever is ready; each list has at most `limit` items (0: any).

    The producer runs in a task of its own; its exception is raised here after the items before it.
    Closing this generator early (the caller cancelled) cancels the producer.
    """
    queue: asyncio.Queue[object] = asyncio.Queue()

    async def produce() -> None:
        try:
            async for item in items:
                queue.put_nowait(item)
        except Exception as exc:  # handed to the consumer, in order
            queue.put_nowait(_Raised(exc))
        queue.put_nowait(_END)

    producer = asyncio.create_task(produce())
    try:
        done = False
        while not done:
            batch: list[T] = []
            item = await queue.get()
            while True:
                if item is _END:
                    done = True
                    break
                if isinstance(item, _Raised):
                    if batch:  # the items before the failure go first
                        yield batch
                    raise item.exc
                batch.append(item)  # type: ignore[arg-type]
                if (limit and len(batch) >= limit) or queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                yield batch
    finally:
        if not producer.done():
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer


class _Raised:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc
