"""The controller's client of the reward pool: one Score stream per replica, least-outstanding routing.

Each `score()` call owns its sample from start to answer: it reserves a slot on the accepting
replica with the fewest outstanding samples (ties: lower latency), writes the sample on that
replica's stream and awaits the answer. When a replica's stream dies, every sample
outstanding on it is failed over to `score()`, which sends it again, elsewhere; a refusal
(an error whose `refusal` field is set: not computed) is sent again too, and a replica that
refuses because it drains gets no more samples. Only that field says "refused", never the
error's text. Because one coroutine owns each sample and a sample is outstanding on one
replica at a time, each sample gets exactly one answer; an answer nobody awaits any more (a
buggy server answering twice, or a caller that gave up) is dropped and counted.

Retries of failed scores and the job's onError policy are the controller's business: `score`
returns the SampleScore, error or not, and raises only when no replica takes the sample.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass

import grpc

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_workers.common.grpc_server import MAX_MESSAGE_BYTES, channel
from rljob_workers.driver.controller.idle import BusyClock
from rljob_workers.driver.reward_stream import InFlight, ReplicaStats, ReplicaStream
from rljob_workers.reward.functions import INVALID, TRANSIENT, error_score

# Largest sample sent: the gRPC message limit, less room for the request's own framing.
MAX_SAMPLE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024
# Used when a replica's Info reports no limit (0): a generous bound that still keeps one replica from taking all.
DEFAULT_MAX_IN_FLIGHT = 64


class NoReplicaError(TimeoutError):
    """No reward replica could take a sample within the router's replica timeout."""


class ReplicaUnavailableError(ConnectionError):
    """A replica being added did not answer Info."""


class _ReplicaLost(Exception):
    """The replica's stream died with the sample outstanding on it."""


@dataclass(frozen=True)
class RouterStats:
    """Per-replica load, and totals of re-sent and dropped samples."""

    replicas: dict[str, ReplicaStats]
    requeued: int
    refused: int
    duplicates_dropped: int
    waiting: int
    service_seconds: float  # summed over answered samples: the reward work done so far
    busy_seconds: float  # time any sample was outstanding on a replica


class RewardRouter:
    """Routes samples to reward replicas over long-lived Score streams."""

    def __init__(
        self,
        *,
        replica_timeout: float = 60.0,
        max_resends: int = 2,
        info_timeout: float = 10.0,
        max_sample_bytes: int = MAX_SAMPLE_BYTES,
        token: str | None = None,
    ) -> None:
        self.token = token  # the job's, sent on every stream
        self.replica_timeout = replica_timeout
        # A request over the replica's message limit would fail its whole stream, and every sample in
        # flight on it: refuse such a sample up front, naming it.
        self.max_sample_bytes = max_sample_bytes
        # A sample that has killed (or been lost with) this many replicas is answered with an error
        # instead: a poison sample must not take down the whole pool one replica at a time.
        self.max_resends = max_resends
        self.info_timeout = info_timeout
        self._replicas: dict[str, ReplicaStream] = {}
        self._pending: set[str] = set()
        self._changed = asyncio.Event()
        # Callers waiting for a slot on a full pool, in arrival order: a freed slot wakes one of them,
        # not all (waking every waiter on every answer cost O(waiters) per sample).
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._waiting = 0
        self.requeued = 0
        self.refused = 0
        self.duplicates_dropped = 0
        self.service_seconds = 0.0
        self.busy = BusyClock()

    async def add_replica(self, name: str, address: str, *, max_in_flight: int | None = None) -> None:
        """Open a Score stream to `address`; its limit comes from Info unless given."""
        if name in self._replicas:
            raise ValueError(f"reward replica {name!r} is already in the router")
        ch = channel(address, self.token)
        try:
            info = await reward_service_pb2_grpc.RewardServiceStub(ch).Info(
                reward_service_pb2.InfoRequest(), timeout=self.info_timeout
            )
        except grpc.aio.AioRpcError as exc:
            await ch.close(None)
            raise ReplicaUnavailableError(
                f"reward replica {name!r} at {address}: Info failed: {exc.code().name}: {exc.details()}"
            ) from exc
        limit = max_in_flight or info.max_in_flight or DEFAULT_MAX_IN_FLIGHT
        replica = ReplicaStream(name, address, ch, limit, self._lose, batch_limit=max(1, info.max_samples_per_message))
        replica.reader = asyncio.create_task(self._read(replica), name=f"reward-router-{name}")
        self._replicas[name] = replica
        self._notify()

    async def remove_replica(self, name: str, timeout: float | None = None) -> int:
        """Drain a replica: no new samples; in-flight ones finish (or, after `timeout`, go elsewhere).
        Returns the samples it scored."""
        replica = self._replicas.get(name)
        if replica is None:
            return 0
        replica.draining = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while replica.outstanding and replica.alive:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                self._lose(replica, f"drain timed out after {timeout:g}s")
                break
            await self._wait_changed(self._changed, remaining)
        if replica.alive:
            async with replica.write_lock:
                with contextlib.suppress(Exception):
                    await replica.call.done_writing()
        if replica.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await replica.reader
        return replica.scored

    def has_replica(self, name: str) -> bool:
        return name in self._replicas

    def drop_replica(self, name: str, reason: str) -> None:
        """Take a replica that died out at once; its outstanding samples go to the others."""
        replica = self._replicas.get(name)
        if replica is not None:
            self._lose(replica, reason)

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        """The sample's SampleScore (error or not); raises NoReplicaError if no replica takes it in time."""
        sid = sample.sample_id
        if not sid:
            return error_score(sid, INVALID, "sample has an empty sample_id")
        if sid in self._pending:
            return error_score(sid, INVALID, f"sample {sid!r} is already being scored by this router")
        size = sample.ByteSize()
        if size > self.max_sample_bytes:
            message = f"sample {sid!r} is {size} bytes, over the {self.max_sample_bytes}-byte limit of a reward request"
            return error_score(sid, INVALID, message)
        self._pending.add(sid)
        try:
            return await self._route(sample, size)
        finally:
            self._pending.discard(sid)

    async def _route(self, sample: sample_pb2.RewardSample, size: int) -> sample_pb2.SampleScore:
        sid = sample.sample_id
        losses = refusals = 0
        while True:
            replica, entry = await self._acquire(sid)
            try:
                result = await self._send(replica, sample, entry, size)
            except _ReplicaLost as lost:
                losses += 1
                if losses > self.max_resends:
                    message = f"sample {sid!r} was lost with {losses} reward replicas; last: {lost}"
                    return error_score(sid, TRANSIENT, message)
                self.requeued += 1
                continue
            refusal = result.error.refusal  # REFUSAL_REASON_UNSPECIFIED (0) when scored or failed
            if refusal and refusals < self.max_resends:
                refusals += 1
                self.refused += 1
                if refusal == sample_pb2.REFUSAL_REASON_DRAINING:
                    replica.draining = True  # it will refuse everything from now on
                continue
            return result

    async def _acquire(self, sid: str) -> tuple[ReplicaStream, InFlight]:
        """Reserve a slot on the best replica, waiting for one; the wait is bounded only while there is none."""
        deadline: float | None = None
        self._waiting += 1
        try:
            while True:
                if self._closed:
                    raise RuntimeError(f"reward router is closed; sample {sid!r} was not scored")
                changed = self._changed
                replica = self._pick()
                if replica is not None:
                    # Reserved before any await, so concurrent callers see the new outstanding count.
                    entry = InFlight(asyncio.get_running_loop().create_future())
                    replica.outstanding[sid] = entry
                    return replica, entry
                if any(r.alive and not r.draining for r in self._replicas.values()):
                    await self._wait_for_slot()  # replicas exist but are full: a slot frees when an answer comes
                    continue
                deadline = deadline or time.monotonic() + self.replica_timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NoReplicaError(
                        f"no reward replica could take sample {sid!r} within {self.replica_timeout:g}s"
                    )
                await self._wait_changed(changed, remaining)
        finally:
            self._waiting -= 1

    async def _wait_for_slot(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken, then cancelled before taking the slot: the next waiter takes it
            raise

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _pick(self) -> ReplicaStream | None:
        candidates = [r for r in self._replicas.values() if r.has_room]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (len(r.outstanding), r.latency or 0.0))

    async def _send(
        self, replica: ReplicaStream, sample: sample_pb2.RewardSample, entry: InFlight, size: int
    ) -> sample_pb2.SampleScore:
        self.busy.begin()
        try:
            await replica.send(sample, entry, size)
            return await entry.future
        finally:
            if replica.outstanding.get(sample.sample_id) is entry:  # the caller gave up (cancelled)
                del replica.outstanding[sample.sample_id]
                self._slot_freed()
            self.busy.end()

    async def _read(self, replica: ReplicaStream) -> None:
        reason = "stream closed by the replica"
        try:
            async for response in replica.call:
                if response.HasField("score"):
                    self._deliver(replica, response.score)
                for score in response.scores:
                    self._deliver(replica, score)
        except grpc.aio.AioRpcError as exc:
            reason = f"stream failed: {exc.code().name}: {exc.details()}"
        finally:
            self._lose(replica, reason)
            await replica.channel.close(None)

    def _deliver(self, replica: ReplicaStream, score: sample_pb2.SampleScore) -> None:
        entry = replica.outstanding.pop(score.sample_id, None)
        if entry is None or entry.future.done():
            self.duplicates_dropped += 1
            return
        seconds = time.monotonic() - entry.sent_at
        replica.observe(seconds)
        self.service_seconds += seconds
        entry.future.set_result(score)
        self._slot_freed()

    def _lose(self, replica: ReplicaStream, reason: str) -> None:
        """Take a replica out and fail its outstanding samples over to their `score()` calls."""
        if not replica.alive:
            return
        replica.alive = False
        if self._replicas.get(replica.name) is replica:
            del self._replicas[replica.name]
        replica.call.cancel()
        for entry in replica.outstanding.values():
            if not entry.future.done():
                entry.future.set_exception(
                    _ReplicaLost(f"reward replica {replica.name!r} at {replica.address}: {reason}")
                )
        replica.outstanding.clear()
        self._notify()

    def _notify(self) -> None:
        """The pool changed (a replica came, went or drains; the router closed): every waiter looks again."""
        self._changed.set()
        self._changed = asyncio.Event()
        while self._slot_waiters:
            self._wake_one()

    def _slot_freed(self) -> None:
        self._changed.set()  # remove_replica waits for its replica's last answers here
        self._changed = asyncio.Event()
        self._wake_one()

    @staticmethod
    async def _wait_changed(changed: asyncio.Event, timeout: float | None) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    def stats(self) -> RouterStats:
        """Outstanding and latency per replica; samples re-sent, refused, dropped and waiting."""
        return RouterStats(
            replicas={name: r.stats() for name, r in self._replicas.items()},
            requeued=self.requeued,
            refused=self.refused,
            duplicates_dropped=self.duplicates_dropped,
            waiting=self._waiting,
            service_seconds=self.service_seconds,
            busy_seconds=self.busy.seconds(),
        )

    async def close(self) -> None:
        """Close every stream; samples still waiting raise RuntimeError."""
        self._closed = True
        self._notify()  # waiters raise, even with no replica left to lose
        replicas = list(self._replicas.values())
        for replica in replicas:
            self._lose(replica, "router closed")
        await asyncio.gather(*(r.reader for r in replicas if r.reader is not None), return_exceptions=True)
