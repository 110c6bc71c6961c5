"""Apply the elastic policy to a pool (reward, environment): observe its clients, decide with
`scaling_policy.decide`, add replicas or drain and stop them. No work in flight is lost: a replica leaves
the clients (its samples, its episodes finish) before its actor stops. Locally the launcher's actor pool is
changed directly; on a cluster the same decision is what the operator reads from the ControlService to size
the pool's worker group."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from rljob_api.reward import ReplicaRange, ScalingSpec
from rljob_workers.driver.pools.scaling_policy import ScalingDecision, ScalingObservation, ScalingState, decide

log = logging.getLogger(__name__)


class ReplicaPool(Protocol):
    """Starts and stops a pool's replicas (Ray actors)."""

    actors: dict[str, object]

    async def add(self) -> tuple[str, str]: ...
    async def stop(self, name: str) -> str: ...


class ReplicaLoad(Protocol):
    """One replica as its pool's clients see it."""

    @property
    def outstanding(self) -> int: ...  # work on it now (samples being scored, environment calls)
    @property
    def scored(self) -> int: ...  # work it has done (samples scored, episodes played)
    @property
    def draining(self) -> bool: ...


class PoolLoad(Protocol):
    """What the clients of a pool see of it: the reward router's stats, the environment clients'."""

    @property
    def replicas(self) -> Mapping[str, ReplicaLoad]: ...
    @property
    def waiting(self) -> int: ...  # work waiting for a replica
    @property
    def service_seconds(self) -> float: ...  # summed over the work answered so far
    @property
    def answered(self) -> int: ...


class Served(Protocol):
    """The clients of a pool: the reward router, the environment clients."""

    def stats(self) -> PoolLoad: ...
    async def add_replica(self, name: str, address: str) -> None: ...
    async def remove_replica(self, name: str, timeout: float) -> int: ...  # drained: the work it did


@dataclass
class ElasticPool:
    clients: Served
    pool: ReplicaPool
    bounds: ReplicaRange
    scaling: ScalingSpec
    arrivals: Callable[[], int]  # work sent to the pool so far (samples, environment calls)
    drain_timeout: float = 60.0
    name: str = "reward"
    done: str = "scoring {} samples"  # the work a drained replica did, for its log line
    state: ScalingState = field(default_factory=ScalingState)
    desired: int = 0
    drained: deque[str] = field(default_factory=lambda: deque(maxlen=32))
    retired: dict[str, int] = field(default_factory=dict)  # drained replica -> the work it did
    failed_starts: int = 0  # replicas the policy added that did not start
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held while the pool changes (supervision too)
    _last: tuple[float, int] | None = None  # (when, work sent to the pool by then)
    _answered: tuple[float, int] = (0.0, 0)  # (service seconds, work answered) at the last look
    _latency: float | None = None

    def backlog(self) -> int:
        """Work waiting for a replica or in service."""
        return _backlog(self.clients.stats())

    def observe(self, now: float) -> ScalingObservation:
        stats = self.clients.stats()
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
            log.info("%s pool %d -> %d: %s", self.name, current, decision.replicas, decision.reason)
            added = await asyncio.gather(
                *(self._add() for _ in range(decision.replicas - current)), return_exceptions=True
            )
            started = [a for a in added if not isinstance(a, BaseException)]
            for failed in (a for a in added if isinstance(a, BaseException)):
                if not isinstance(failed, Exception):
                    raise failed  # a cancellation: the run is ending
                # the next round asks again; on a cluster the status says why the pod is not up
                self.failed_starts += 1
                log.warning("%s replica not added: %s", self.name, failed)
            for name, address, seconds in started:
                await self.clients.add_replica(name, address)
                # On a cluster this is a pod's start (scheduled, created, Ray joined) and the replica's own.
                log.info("%s replica %s serving at %s, %.1fs after the decision", self.name, name, address, seconds)
        elif decision.replicas < current:
            log.info("%s pool %d -> %d: %s", self.name, current, decision.replicas, decision.reason)
            for name in self._victims(current - decision.replicas):
                done = await self.clients.remove_replica(name, self.drain_timeout)  # work in flight finishes
                pod = await self.pool.stop(name)
                self.drained.append(pod)
                self.retired[name] = done
                done_text = self.done.format(done)
                log.info("%s replica %s drained after %s; %s stopped", self.name, name, done_text, pod)
        return decision

    async def _add(self) -> tuple[str, str, float]:
        """A new replica's name and address, and the seconds it took to start."""
        asked = time.monotonic()
        name, address = await self.pool.add()
        return name, address, time.monotonic() - asked

    def _victims(self, count: int) -> list[str]:
        """The least-loaded replicas, newest first among equals."""
        stats = self.clients.stats().replicas
        names = sorted(self.pool.actors, key=lambda n: (stats[n].outstanding if n in stats else 0, -_index(n)))
        return names[:count]

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.scaling.interval_seconds)
            await self.step()

    def scored_by_replica(self) -> dict[str, int]:
        """The work each replica of the run did (samples scored, episodes played), the drained ones included."""
        return {**self.retired, **{name: r.scored for name, r in self.clients.stats().replicas.items()}}

    def ready(self) -> int:
        return sum(1 for r in self.clients.stats().replicas.values() if not r.draining)


def _backlog(stats: PoolLoad) -> int:
    return stats.waiting + sum(r.outstanding for r in stats.replicas.values())


def _index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0
