"""The controller's client of the reward pool: one Score stream per replica, least-outstanding routing.

`score()` owns its sample from start to answer (`score_many()` its samples): it reserves a slot on
the accepting replica with the fewest outstanding samples (ties: lower latency), writes the sample
on that replica's stream and awaits the answer. When a replica's stream dies, every sample
outstanding on it is failed over to its owner, which sends it again, elsewhere; a refusal (an
error whose `refusal` field is set: not computed; never read from the error's text) is sent again
too, and a replica that refuses because it drains gets no more samples. One owner per sample and
one replica at a time per sample: each sample gets exactly one answer; an answer nobody awaits any
more (a buggy server answering twice, or a caller that gave up) is dropped and counted.

Retries of failed scores and the job's onError policy are the controller's business: `score`
returns the SampleScore, error or not, and raises only when no replica takes the sample.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from typing import Any, cast

from rljob.v1 import sample_pb2
from rljob_workers.common.grpc_server import MAX_MESSAGE_BYTES
from rljob_workers.driver.pools.busy import BusyClock
from rljob_workers.driver.pools.reward.replicas import ReplicaLost, ReplicaSet
from rljob_workers.driver.pools.reward.stream import InFlight, ReplicaStream, RouterStats
from rljob_workers.reward.functions import INVALID, TRANSIENT, error_score

# Largest sample sent: the gRPC message limit, less room for the request's own framing.
MAX_SAMPLE_BYTES = MAX_MESSAGE_BYTES - 64 * 1024


class NoReplicaError(TimeoutError):
    """No reward replica could take a sample within the router's replica timeout."""


class RewardRouter(ReplicaSet):
    """Routes samples to reward replicas over long-lived Score streams."""

    def __init__(
        self,
        *,
        replica_timeout: float = 60.0,
        max_resends: int = 2,
        info_timeout: float = 10.0,
        max_sample_bytes: int = MAX_SAMPLE_BYTES,
        token: str | None = None,
        answer_deadline: float | None = None,
    ) -> None:
        super().__init__(token=token, info_timeout=info_timeout, answer_deadline=answer_deadline)
        self.replica_timeout = replica_timeout
        # A request over the replica's message limit would fail its whole stream, and every sample in
        # flight on it: refuse such a sample up front, naming it.
        self.max_sample_bytes = max_sample_bytes
        # A sample that has killed (or been lost with) this many replicas is answered with an error
        # instead: a poison sample must not take down the whole pool one replica at a time.
        self.max_resends = max_resends
        self._pending: set[str] = set()
        self._waiting = 0
        self.requeued = 0
        self.refused = 0
        self.busy = BusyClock()

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        """The sample's SampleScore (error or not); raises NoReplicaError if no replica takes it in time."""
        return (await self.score_many([sample]))[0]

    async def score_many(self, samples: Sequence[sample_pb2.RewardSample]) -> list[sample_pb2.SampleScore]:
        """Each sample's SampleScore, in order, as `score` answers it, with one coroutine for the lot: what
        the best replica has room for is reserved, written (in one message if it takes several) and
        awaited together; the rest, and any sample lost or refused, is routed as by `score`."""
        results: list[sample_pb2.SampleScore | None] = [None] * len(samples)
        claimed: list[tuple[int, int]] = []  # (index, size)
        for index, sample in enumerate(samples):
            claim = self._claim(sample)
            if isinstance(claim, sample_pb2.SampleScore):
                results[index] = claim
            else:
                claimed.append((index, claim))
        try:
            await self._route_in_lots(samples, claimed, results)
        finally:
            for index, _ in claimed:
                self._pending.discard(samples[index].sample_id)
        return cast(list[sample_pb2.SampleScore], results)  # each one answered: claimed, in a lot or routed

    async def _route_in_lots(
        self,
        samples: Sequence[sample_pb2.RewardSample],
        claimed: list[tuple[int, int]],
        results: list[sample_pb2.SampleScore | None],
    ) -> None:
        """Send `claimed` (index, size) in lots, each what the best replica has room for when its turn
        comes, waiting for room while every replica is full (first in line again after a wake that
        found none); with no replica to wait for, the rest is routed as `score` routes it."""
        queue, lots = claimed, list[asyncio.Future[Any]]()
        last: Coroutine[Any, Any, None] | None = None
        reserved: list[tuple[ReplicaStream, str, InFlight]] = []
        self._waiting += len(queue)
        try:
            while queue:
                replica = None if self._closed else self._pick()
                if replica is not None:
                    room = replica.max_in_flight - len(replica.outstanding)
                    lot, queue = queue[:room], queue[room:]
                    self._waiting -= len(lot)
                    entries = self._reserve(replica, samples, lot)
                    reserved.extend((replica, samples[index].sample_id, entry) for index, _, entry in entries)
                    work = self._score_lot(replica, samples, entries, results)
                    if queue:
                        lots.append(asyncio.ensure_future(work))
                    else:
                        last = work  # awaited here, without a task of its own
                elif not self._closed and self._accepting():
                    await self._slots.wait(first=bool(lots))
                else:
                    self._waiting -= len(queue)
                    queue, routed = [], [self._answer(samples[i], size, i, results) for i, size in queue]
                    lots.append(asyncio.gather(*routed))
            if last is not None:
                await last
            await asyncio.gather(*lots)
        finally:
            self._waiting -= len(queue)
            for started in lots:
                started.cancel()
            for replica, sid, entry in reserved:  # a lot cancelled before it ran cannot free its own
                self._forget(replica, sid, entry)

    def _claim(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore | int:
        """The sample's byte size, now that this router owns it; or the error that refuses it."""
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
        return size

    def _reserve(
        self, replica: ReplicaStream, samples: Sequence[sample_pb2.RewardSample], lot: list[tuple[int, int]]
    ) -> list[tuple[int, int, InFlight]]:
        """A slot on `replica` for each (index, size) of `lot`, taken at once: the next pick sees them."""
        loop = asyncio.get_running_loop()
        reserved = [(index, size, InFlight(loop.create_future())) for index, size in lot]
        for index, _, entry in reserved:
            replica.outstanding[samples[index].sample_id] = entry
        return reserved

    async def _score_lot(
        self,
        replica: ReplicaStream,
        samples: Sequence[sample_pb2.RewardSample],
        reserved: list[tuple[int, int, InFlight]],
        results: list[sample_pb2.SampleScore | None],
    ) -> None:
        """Score the `reserved` (index, size, slot) on `replica` into `results`, written and awaited
        together; those lost or refused are routed again one by one."""
        retry: list[tuple[int, int, tuple[int, int, str]]] = []
        self.busy.begin()
        try:
            for index, size, entry in reserved:
                await replica.send(samples[index], entry, size)
            for index, size, entry in reserved:
                try:
                    result = await entry.future
                except ReplicaLost as lost:
                    self._count_loss(1)
                    retry.append((index, size, (1, 0, str(lost))))
                    continue
                if self._resend_after_refusal(replica, result, 0):
                    retry.append((index, size, (0, 1, "")))
                    continue
                results[index] = result
        finally:
            for index, _, entry in reserved:
                self._forget(replica, samples[index].sample_id, entry)
            self.busy.end()
        await asyncio.gather(*(self._answer(samples[i], size, i, results, tries) for i, size, tries in retry))

    async def _answer(
        self,
        sample: sample_pb2.RewardSample,
        size: int,
        index: int,
        results: list[sample_pb2.SampleScore | None],
        tries: tuple[int, int, str] = (0, 0, ""),
    ) -> None:
        results[index] = await self._route(sample, size, tries)

    async def _route(
        self, sample: sample_pb2.RewardSample, size: int, tries: tuple[int, int, str] = (0, 0, "")
    ) -> sample_pb2.SampleScore:
        sid = sample.sample_id
        losses, refusals, last_loss = tries
        while losses <= self.max_resends:
            replica, entry = await self._acquire(sid)
            try:
                result = await self._send(replica, sample, entry, size)
            except ReplicaLost as lost:
                losses, last_loss = losses + 1, str(lost)
                self._count_loss(losses)
                continue
            if self._resend_after_refusal(replica, result, refusals):
                refusals += 1
                continue
            return result
        return error_score(sid, TRANSIENT, f"sample {sid!r} was lost with {losses} reward replicas; last: {last_loss}")

    def _count_loss(self, losses: int) -> None:
        """A sample's `losses`-th replica was lost with it: counted as re-sent unless that was its last try."""
        if losses <= self.max_resends:
            self.requeued += 1

    def _resend_after_refusal(self, replica: ReplicaStream, result: sample_pb2.SampleScore, refusals: int) -> bool:
        """Whether `result` is a refusal (not computed) to send elsewhere; a draining replica gets no more."""
        refusal = result.error.refusal  # REFUSAL_REASON_UNSPECIFIED (0) when scored or failed
        if not refusal or refusals >= self.max_resends:
            return False
        self.refused += 1
        if refusal == sample_pb2.REFUSAL_REASON_DRAINING:
            replica.draining = True  # it will refuse everything from now on
        return True

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
                if self._accepting():
                    await self._slots.wait()  # replicas exist but are full: a slot frees when an answer comes
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

    async def _send(
        self, replica: ReplicaStream, sample: sample_pb2.RewardSample, entry: InFlight, size: int
    ) -> sample_pb2.SampleScore:
        self.busy.begin()
        try:
            await replica.send(sample, entry, size)
            return await entry.future
        finally:
            self._forget(replica, sample.sample_id, entry)
            self.busy.end()

    def stats(self) -> RouterStats:
        """Outstanding and latency per replica; samples re-sent, refused, dropped and waiting."""
        return RouterStats(
            replicas={name: r.stats() for name, r in self._replicas.items()},
            requeued=self.requeued,
            refused=self.refused,
            duplicates_dropped=self.duplicates_dropped,
            waiting=self._waiting,
            service_seconds=self.service_seconds,
            answered=self.answered,
            busy_seconds=self.busy.seconds(),
        )
