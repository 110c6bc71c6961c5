"""A circuit breaker per remote endpoint, and the choice of an endpoint among the healthy ones.

closed ─(failureThreshold consecutive failures)─► open ─(resetSeconds)─► half-open: one trial call
  ▲                                                ▲                                  │
  └──────────────── trial succeeds ────────────────┴──────── trial fails ─────────────┘

Only failures that say the endpoint is unwell count (unreachable, timed out, overloaded); an
endpoint that answers, even with an error about the sample, is up. A caller that reserved the
half-open trial and then gave up (cancelled) hands it back with `release`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

State = Literal["closed", "open", "half-open"]


@dataclass
class CircuitBreaker:
    """The breaker of one endpoint; `clock` is injectable for tests."""

    failure_threshold: int
    reset_seconds: float
    clock: Callable[[], float] = time.monotonic
    failures: int = 0
    opened_at: float | None = None
    trial_in_flight: bool = False

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if self.clock() - self.opened_at >= self.reset_seconds:
            return "half-open"
        return "open"

    def available(self) -> bool:
        """Whether a call may go to this endpoint now (without reserving it)."""
        state = self.state
        return state == "closed" or (state == "half-open" and not self.trial_in_flight)

    def acquire(self) -> bool:
        """Reserve a call: always when closed; the one trial call when half-open; never when open."""
        if not self.available():
            return False
        if self.state == "half-open":
            self.trial_in_flight = True
        return True

    def release(self) -> None:
        """The caller gave up before an outcome: a reserved trial may be taken again."""
        self.trial_in_flight = False

    def record_success(self) -> None:
        self.failures, self.opened_at, self.trial_in_flight = 0, None, False

    def record_failure(self) -> None:
        self.failures += 1
        was_trial, self.trial_in_flight = self.trial_in_flight, False
        if was_trial or self.failures >= self.failure_threshold:
            self.opened_at = self.clock()  # (re)open: the next trial waits resetSeconds again

    def retry_in(self) -> float:
        """Seconds until a trial call is allowed (0 when one is allowed now)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.opened_at + self.reset_seconds - self.clock())


@dataclass
class Balancer:
    """Least outstanding calls among endpoints whose breaker lets a call through; ties go round-robin."""

    size: int
    _next: int = field(default=0)

    def pick(
        self, breakers: Sequence[CircuitBreaker], outstanding: Sequence[int], avoid: frozenset[int] = frozenset()
    ) -> int | None:
        """Index of the endpoint to call (its breaker reserved), or None when every breaker is open.

        Endpoints in `avoid` (already tried for this sample) are used only when nothing else is available.
        """
        order = [(self._next + i) % self.size for i in range(self.size)]
        for allowed in ([i for i in order if i not in avoid], [i for i in order if i in avoid]):
            ready = [i for i in allowed if breakers[i].available()]
            if ready:
                best = min(ready, key=lambda i: outstanding[i])  # min keeps the first of equals: round-robin
                self._next = (best + 1) % self.size
                breakers[best].acquire()
                return best
        return None
