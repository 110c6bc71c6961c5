"""One reward replica's Score stream as the router holds it (and the router's stats): its samples in
flight, its latency, and how samples are written: one per message, or (when the replica's Info declares
max_samples_per_message > 1) those sent in the same moment together in one message.

Batching never waits to fill a message: a sample is written by a flush task that runs as soon as
the caller yields, taking whatever other callers queued in the meantime; while one message is
being written, the next ones gather.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_workers.common.batching import MESSAGE_BUDGET_BYTES

# Weight of the newest observation in a replica's latency average.
EWMA_ALPHA = 0.3


@dataclass
class InFlight:
    future: asyncio.Future[sample_pb2.SampleScore]
    sent_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ReplicaStats:
    """One replica as the router sees it."""

    address: str
    outstanding: int
    max_in_flight: int
    latency_ewma_seconds: float | None
    scored: int
    draining: bool


@dataclass(frozen=True)
class RouterStats:
    """Per-replica load, and totals of re-sent and dropped samples."""

    replicas: dict[str, ReplicaStats]
    requeued: int
    refused: int
    duplicates_dropped: int
    waiting: int
    service_seconds: float  # summed over answered samples: the reward work done so far
    answered: int  # samples answered by a replica so far
    busy_seconds: float  # time any sample was outstanding on a replica


@dataclass
class _Queued:
    sample: sample_pb2.RewardSample
    entry: InFlight
    size: int


class ReplicaStream:
    """A replica's Score stream; `lose(stream, reason)` is called when a write fails."""

    def __init__(
        self,
        name: str,
        address: str,
        ch: grpc.aio.Channel,
        max_in_flight: int,
        lose: Callable[[ReplicaStream, str], None],
        batch_limit: int = 1,
    ) -> None:
        self.name, self.address, self.channel, self.max_in_flight = name, address, ch, max_in_flight
        self.call = reward_service_pb2_grpc.RewardServiceStub(ch).Score()
        self.outstanding: dict[str, InFlight] = {}
        self.write_lock = asyncio.Lock()
        self.latency: float | None = None
        self.scored = 0
        self.alive = True
        self.draining = False
        self.reader: asyncio.Task[None] | None = None
        self.batch_limit = batch_limit  # most samples per message; 1: `sample`, one per message
        self._lose = lose
        self._outbox: deque[_Queued] = deque()
        self._flusher: asyncio.Task[None] | None = None

    @property
    def has_room(self) -> bool:
        return self.alive and not self.draining and len(self.outstanding) < self.max_in_flight

    def observe(self, seconds: float) -> None:
        self.latency = seconds if self.latency is None else EWMA_ALPHA * seconds + (1 - EWMA_ALPHA) * self.latency
        self.scored += 1

    def release(self, sid: str, entry: InFlight) -> bool:
        """Free the slot `entry` holds for `sid`, if it still does (no answer came); whether it did."""
        if self.outstanding.get(sid) is entry:
            del self.outstanding[sid]
            return True
        return False

    def stats(self) -> ReplicaStats:
        return ReplicaStats(
            self.address, len(self.outstanding), self.max_in_flight, self.latency, self.scored, self.draining
        )

    async def send(self, sample: sample_pb2.RewardSample, entry: InFlight, size: int) -> None:
        """Write the sample (reserved in `outstanding` by the caller); a failed write loses the replica."""
        if self.batch_limit > 1:
            self._outbox.append(_Queued(sample, entry, size))
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.create_task(self._flush(), name=f"reward-flush-{self.name}")
            return
        try:
            async with self.write_lock:
                await self.call.write(reward_service_pb2.ScoreRequest(sample=sample))
            entry.sent_at = time.monotonic()
        except Exception as exc:  # a dead or half-closed stream; the reader may not have noticed yet
            self._lose(self, f"write failed: {type(exc).__name__}: {exc}")

    async def _flush(self) -> None:
        async with self.write_lock:
            while self._outbox and self.alive:
                batch = self._take()
                if not batch:
                    continue
                try:
                    await self.call.write(reward_service_pb2.ScoreRequest(samples=[q.sample for q in batch]))
                except Exception as exc:
                    self._lose(self, f"write failed: {type(exc).__name__}: {exc}")
                    return
                sent = time.monotonic()
                for queued in batch:
                    queued.entry.sent_at = sent

    def _take(self) -> list[_Queued]:
        """The next message's samples: in order, up to the limit and the byte budget; callers that
        gave up (no longer outstanding) are skipped."""
        batch: list[_Queued] = []
        size = 0
        while self._outbox and len(batch) < self.batch_limit:
            queued = self._outbox[0]
            if self.outstanding.get(queued.sample.sample_id) is not queued.entry:
                self._outbox.popleft()
                continue
            if batch and size + queued.size > MESSAGE_BUDGET_BYTES:
                break
            batch.append(self._outbox.popleft())
            size += queued.size
        return batch
