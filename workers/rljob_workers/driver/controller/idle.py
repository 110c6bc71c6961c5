"""How busy the pools are: exact busy seconds per pool, and idle fractions over a sliding window."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class BusyClock:
    """Seconds a pool was busy, i.e. had at least one piece of work open (work may overlap)."""

    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    _open: int = 0
    _since: float = 0.0
    _total: float = 0.0

    def begin(self) -> None:
        if self._open == 0:
            self._since = self.clock()
        self._open += 1

    def end(self) -> None:
        if self._open <= 0:
            raise RuntimeError("BusyClock.end() without a matching begin()")
        self._open -= 1
        if self._open == 0:
            self._total += self.clock() - self._since

    @contextmanager
    def busy(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    @property
    def is_busy(self) -> bool:
        return self._open > 0

    def seconds(self) -> float:
        """Busy seconds so far, the open stretch included."""
        return self._total + (self.clock() - self._since if self._open else 0.0)


@dataclass
class IdleMeter:
    """Fraction of the last `window` seconds a pool was observed idle (observed every tick)."""

    window: float = 60.0
    _seen: deque[tuple[float, bool]] = field(default_factory=deque)

    def record(self, now: float, busy: bool) -> None:
        self._seen.append((now, busy))
        while self._seen and self._seen[0][0] < now - self.window:
            self._seen.popleft()

    def fraction(self) -> float:
        if not self._seen:
            return 0.0
        return sum(1 for _, busy in self._seen if not busy) / len(self._seen)
