"""Dynamic batching: requests are collected until `batch_size` of them wait or the oldest has waited
`max_wait_s`, then one call of a blocking batch function runs them all in a worker thread.

The batch runs off the event loop (torch releases the GIL), so the gRPC server keeps accepting
requests meanwhile; they form the next batch. A request whose caller gave up (cancelled, e.g.
by the job's timeout) before its batch starts is left out of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rljob_workers.common.daemon_pool import DaemonThreadPool

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class _Request(Generic[T, R]):
    item: T
    future: asyncio.Future[R]
    arrived: float = field(default=0.0)


class DynamicBatcher(Generic[T, R]):
    """Batches concurrent `submit` calls into calls of `run_batch(items) -> results` (same order, same length)."""

    def __init__(self, run_batch: Callable[[list[T]], Sequence[R]], *, batch_size: int, max_wait_s: float) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.run_batch = run_batch
        self.batch_size = batch_size
        self.max_wait_s = max(0.0, max_wait_s)
        self.batch_sizes: deque[int] = deque(maxlen=4096)  # recent batch sizes, for metrics and tests
        self._queue: deque[_Request[T, R]] = deque()
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: list[_Request[T, R]] = []
        # a daemon: a batch function that never returns (a user's) must not hold the replica's process at exit
        self._thread = DaemonThreadPool(1, thread_name_prefix="reward-batch")

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        request: _Request[T, R] = _Request(item, loop.create_future(), loop.time())
        self._queue.append(request)
        if self._task is None or self._task.done():
            self._arrived = asyncio.Event()
            self._task = loop.create_task(self._loop(), name="reward-batcher")
        assert self._arrived is not None
        self._arrived.set()
        return await request.future

    async def _loop(self) -> None:
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            await self._fill(loop)
            batch = self._take()
            if batch:
                await self._run(batch, loop)

    async def _fill(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until a full batch waits or the oldest request has waited max_wait_s."""
        assert self._arrived is not None
        while len(self._queue) < self.batch_size:
            remaining = self._queue[0].arrived + self.max_wait_s - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    def _take(self) -> list[_Request[T, R]]:
        batch: list[_Request[T, R]] = []
        while self._queue and len(batch) < self.batch_size:
            request = self._queue.popleft()
            if not request.future.done():  # its caller gave up
                batch.append(request)
        return batch

    async def _run(self, batch: list[_Request[T, R]], loop: asyncio.AbstractEventLoop) -> None:
        self.batch_sizes.append(len(batch))
        self._running = batch
        try:
            results = await loop.run_in_executor(self._thread, self.run_batch, [r.item for r in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} returned {len(results)} results")
        except Exception as error:  # a failed batch fails its requests, not the batcher
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(error)
            return
        finally:
            self._running = []
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():
                request.future.set_result(result)

    async def close(self) -> None:
        """Stop batching; requests queued or running fail (nobody waits forever on a closed model)."""
        stranded = [*self._running, *self._queue]
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for request in stranded:
            if not request.future.done():
                request.future.set_exception(RuntimeError("the reward model was closed"))
        await asyncio.to_thread(self._thread.shutdown, wait=True)
