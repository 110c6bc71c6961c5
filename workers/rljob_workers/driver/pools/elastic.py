"""Apply the elastic reward policy: observe the router, decide with `scaling.decide`, add replicas or
drain and stop them. No in-flight score is lost: a replica leaves the router (its samples finish)
before its actor stops. Locally the launcher's actor pool is changed directly; on a cluster the
same decision is what the operator reads from the ControlService to size the reward group."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rljob_api.reward import ReplicaRange, ScalingSpec
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.driver.pools.reward.stream import RouterStats
from rljob_workers.driver.pools.scaling_policy import ScalingDecision, ScalingObservation, ScalingState, decide

log = logging.getLogger(__name__)


class ReplicaPool(Protocol):
    """Starts and stops reward replicas (Ray actors locally)."""

    actors: dict[str, object]

    async def add(self) -> tuple[str, str]: ...
    async def stop(self, name: str) -> str: ...


@dataclass
class ElasticRewardPool:
    router: RewardRouter
    pool: ReplicaPool
    bounds: ReplicaRange
    scaling: ScalingSpec
    arrivals: Callable[[], int]  # samples sent to reward so far
    drain_timeout: float = 60.0
    state: ScalingState = field(default_factory=ScalingState)
    desired: int = 0
    drained: deque[str] = field(default_factory=lambda: deque(maxlen=32))
    retired: dict[str, int] = field(default_factory=dict)  # drained replica -> samples it scored
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while the pool changes (supervision too)
    _last: tuple[float, int] | None = None  # (when, samples sent to reward by then)
    _answered: tuple[float, int] = (0.0, 0)  # (service seconds, samples answered) at the last look
    _latency: float | None = None

    def backlog(self) -> int:
        """Samples waiting for a replica or being scored."""
        return _backlog(self.router.stats())

    def observe(self, now: float) -> ScalingObservation:
        stats = self.router.stats()
        backlog = _backlog(stats)
        arrived = self.arrivals()
        rate = 0.0
        if self._last is not None and now > self._last[0]:
            rate = (arrived - self._last[1]) / (now - self._last[0])
        self._last = (now, arrived)
        # The mean service time of the samples answered since the last look, whichever replica answered them;
        # kept while none were. Not the replicas' own averages: one that gets no samples (the router favours
        # the fastest) keeps the latency of its last ones, and a slow stretch long over held the pool up.
        service, answered = self._answered
        if stats.answered > answered:
            self._latency = (stats.service_seconds - service) / (stats.answered - answered)
        self._answered = (stats.service_seconds, stats.answered)
        return ScalingObservation(now, backlog, rate, self._latency, len(self.pool.actors))

    async def step(self, now: float | None = None) -> ScalingDecision:
        """One observe-decide-apply round."""
        async with self.lock:
            return await self._step(now)

    async def _step(self, now: float | None) -> ScalingDecision:
        decision = decide(self.state, self.observe(time.monotonic() if now is None else now), self.bounds, self.scaling)
        self.state, self.desired = decision.state, decision.replicas
        current = len(self.pool.actors)
        if decision.replicas > current:
            log.info("reward pool %d -> %d: %s", current, decision.replicas, decision.reason)
            started = await asyncio.gather(*(self._add() for _ in range(decision.replicas - current)))
            for name, address, seconds in started:
                await self.router.add_replica(name, address)
                # On a cluster this is a pod's start (scheduled, created, Ray joined) and the replica's own.
                log.info("reward replica %s serving at %s, %.1fs after the decision", name, address, seconds)
        elif decision.replicas < current:
            log.info("reward pool %d -> %d: %s", current, decision.replicas, decision.reason)
            for name in self._victims(current - decision.replicas):
                scored = await self.router.remove_replica(name, self.drain_timeout)  # in-flight samples finish
                pod = await self.pool.stop(name)
                self.drained.append(pod)
                self.retired[name] = scored
                log.info("reward replica %s drained after scoring %d samples; %s stopped", name, scored, pod)
        return decision

    async def _add(self) -> tuple[str, str, float]:
        """A new replica's name and address, and the seconds it took to start."""
        asked = time.monotonic()
        name, address = await self.pool.add()
        return name, address, time.monotonic() - asked

    def _victims(self, count: int) -> list[str]:
        """The least-loaded replicas, newest first among equals."""
        stats = self.router.stats().replicas
        names = sorted(self.pool.actors, key=lambda n: (stats[n].outstanding if n in stats else 0, -_index(n)))
        return names[:count]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.scaling.interval_seconds)
            await self.step()

    def scored_by_replica(self) -> dict[str, int]:
        """Samples each replica of the run scored, the drained ones included."""
        return {**self.retired, **{name: r.scored for name, r in self.router.stats().replicas.items()}}

    def ready(self) -> int:
        return sum(1 for r in self.router.stats().replicas.values() if not r.draining)


def _backlog(stats: RouterStats) -> int:
    return stats.waiting + sum(r.outstanding for r in stats.replicas.values())


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0
