"""How late a pool process's event loop runs: an async user function that blocks (a `time.sleep`, a
synchronous HTTP call) holds every other coroutine of the process, its gRPC answers and its health pings
included. The watch measures the lag of a short timer; a stall past `threshold` is logged at once, naming the
suspects the pool gives (its async user functions), and kept as a report the driver reads with its pings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

INTERVAL = 0.25  # seconds between two looks: the finest stall it measures
THRESHOLD = 1.0  # seconds of lag that count as a blocked loop


@dataclass
class LoopWatch:
    """Measures the event loop's lag in the background (`start` on the loop); `report()` tells the newest
    stall past the threshold, once."""

    suspects: Callable[[], list[str]] = list  # names of the async user functions that could block the loop
    threshold: float = THRESHOLD
    worst: float = 0.0  # the longest stall seen, seconds
    _report: str = ""
    _task: asyncio.Task[None] | None = field(default=None, repr=False)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-watch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(INTERVAL)
            self.observe(time.monotonic() - before - INTERVAL)

    def observe(self, lag: float) -> None:
        """One measured lag, in seconds."""
        if lag < self.threshold:
            return
        self.worst = max(self.worst, lag)
        names = ", ".join(self.suspects()) or "none named"
        self._report = (
            f"event loop blocked for {lag:.1f} s: an async function that does not await (time.sleep, a blocking "
            f"call) stalls every request of the replica, its health answers too; its async user functions: "
            f"{names}. Make it a plain def (it then runs in a thread) or await what it waits on"
        )
        log.warning("%s", self._report)

    def report(self) -> str:
        """The newest stall's report since the last call ('' if none)."""
        report, self._report = self._report, ""
        return report
