"""How idle the pools are: each pool's idle fraction over a sliding window, from its busy seconds."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class IdleMeter:
    """Fraction of the last `window` seconds a pool was idle, from its busy seconds (`BusyClock.seconds`)
    read every tick: exact, however its busy stretches fall between the ticks (sampling whether it is busy
    at each tick would miss every stretch shorter than a tick)."""

    window: float = 60.0
    _seen: deque[tuple[float, float]] = field(default_factory=deque)  # (time, busy seconds so far)

    def record(self, now: float, busy_seconds: float) -> None:
        if self._seen and busy_seconds < self._seen[-1][1]:
            self._seen.clear()  # a new clock (the controller made again after a trainer restart)
        self._seen.append((now, busy_seconds))
        # One reading at or before the window's start stays, so that the window is covered whole.
        while len(self._seen) > 1 and self._seen[1][0] <= now - self.window:
            self._seen.popleft()

    def fraction(self, now: float, busy_seconds: float) -> float:
        """Idle fraction from the window's first reading up to `now`, when the clock reads `busy_seconds`."""
        if not self._seen or busy_seconds < self._seen[-1][1]:
            return 0.0
        since, busy_then = self._seen[0]
        if now <= since:
            return 0.0
        return min(1.0, max(0.0, 1.0 - (busy_seconds - busy_then) / (now - since)))


class PoolIdle:
    """Each pool's IdleMeter, fed from `busy_seconds()`: every pool's busy seconds so far."""

    def __init__(self, busy_seconds: Callable[[], dict[str, float]], window: float = 60.0) -> None:
        self.busy_seconds = busy_seconds
        self.meters: dict[str, IdleMeter] = {}
        self.window = window

    def tick(self, now: float) -> None:
        for pool, seconds in self.busy_seconds().items():
            self.meters.setdefault(pool, IdleMeter(self.window)).record(now, seconds)

    def fractions(self, now: float) -> dict[str, float]:
        busy = self.busy_seconds()
        return {pool: meter.fraction(now, busy[pool]) for pool, meter in self.meters.items()}
