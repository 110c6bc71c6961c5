"""Idle fractions of the pools, from periodic busy/idle observations over a sliding window."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


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
