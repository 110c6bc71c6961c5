"""The run's two deadlines (spec.progressDeadlineSeconds, spec.activeDeadlineSeconds): a run that makes no
progress says so, naming what it waited on, and fails; a run past its time stops as on SIGTERM (the step
finished, a checkpoint written) and fails. Neither holds its GPUs for ever. The policy is pure
(`Deadlines.expired`); `watch` applies it to a running controller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rljob.v1 import control_service_pb2 as control_pb

log = logging.getLogger("rljob")

CHECK_SECONDS = 1.0  # how often the watch looks


@dataclass
class Deadlines:
    """When the run started and last made progress; what it may not exceed."""

    progress_seconds: float
    active_seconds: float | None = None
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    reason: int = control_pb.FAILURE_REASON_UNSPECIFIED  # set once a deadline has passed

    def progressed(self, now: float) -> None:
        """A train step completed at `now` (monotonic)."""
        self.last_progress = now

    def stalled(self, now: float) -> float:
        """Seconds without a completed step."""
        return now - self.last_progress

    def expired(self, now: float, waiting_on: str) -> tuple[int, str] | None:
        """The passed deadline's FailureReason and message, naming what the run waited on; None while none has."""
        if self.active_seconds is not None and now - self.started >= self.active_seconds:
            return (
                control_pb.FAILURE_REASON_ACTIVE_DEADLINE,
                f"the run reached spec.activeDeadlineSeconds ({self.active_seconds:g} s)",
            )
        stalled = self.stalled(now)
        if stalled >= self.progress_seconds:
            return (
                control_pb.FAILURE_REASON_PROGRESS_DEADLINE,
                f"no train step completed for {stalled:.0f} s (spec.progressDeadlineSeconds "
                f"{self.progress_seconds:g}); waiting on: {waiting_on or 'nothing reported'}",
            )
        return None


async def watch(
    deadlines: Deadlines,
    waiting_on: Callable[[], str],
    end: Callable[[int, str], None],
    cancel: Callable[[], Awaitable[None]],
    grace: float,
) -> None:
    """Once a deadline passes, `end(reason, message)` the run; if it has not ended `grace` seconds later (a call
    that never returns), `cancel` it. Runs until cancelled."""
    while True:
        await asyncio.sleep(CHECK_SECONDS)
        passed = deadlines.expired(time.monotonic(), waiting_on())
        if passed is None:
            continue
        deadlines.reason, message = passed
        log.error("%s", message)
        end(*passed)
        await asyncio.sleep(grace)
        log.error("the run did not stop within %.0f s of its deadline: cancelled", grace)
        await cancel()
        return
