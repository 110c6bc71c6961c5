"""How long a pool has been busy: exact busy seconds, for the idle fractions the telemetry reports and the
busy seconds each step's metrics line records."""

from __future__ import annotations

import time
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
