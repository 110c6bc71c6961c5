"""Callers waiting for a slot on a full pool, in arrival order: a freed slot wakes one of them, not
all (waking every waiter on every answer cost O(waiters) per sample)."""

from __future__ import annotations

import asyncio
from collections import deque


class SlotQueue:
    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def wait(self, first: bool = False) -> None:
        """Until a slot frees (`wake_one`) or everything changes (`wake_all`); `first`: ahead of the
        others (a caller woken before, that found the slot taken)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if first:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.wake_one()  # woken, then cancelled before taking the slot: the next waiter takes it
            raise

    def wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            self.wake_one()
