"""The reward replicas as the router holds them: a Score stream per replica, added after its Info
answers, drained or lost; each answer delivered to the slot that waits for it (see router.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_workers.common.grpc_server import channel
from rljob_workers.driver.pools.reward.stream import InFlight, ReplicaStream
from rljob_workers.driver.pools.slots import SlotQueue

# Used when a replica's Info reports no limit (0): a generous bound that still keeps one replica from taking all.
DEFAULT_MAX_IN_FLIGHT = 64

log = logging.getLogger(__name__)


class ReplicaUnavailableError(ConnectionError):
    """A replica being added did not answer Info."""


class ReplicaLost(Exception):
    """The replica's stream died with the sample outstanding on it."""


class ReplicaSet:
    """Reward replicas by name, their streams and their slots; the router's base."""

    def __init__(self, *, token: str | None, info_timeout: float, answer_deadline: float | None = None) -> None:
        self.token = token  # the job's, sent on every stream
        self.info_timeout = info_timeout
        # A sample unanswered this long after it was written: its replica is hung (a stream it accepts and never
        # answers, an event loop blocked), taken out like a dead one, its samples sent elsewhere.
        self.answer_deadline = answer_deadline
        self._watchdog: asyncio.Task[None] | None = None
        self._replicas: dict[str, ReplicaStream] = {}
        self._changed = asyncio.Event()
        self._slots = SlotQueue()
        self._closed = False
        self.duplicates_dropped = 0
        self.service_seconds = 0.0
        self.answered = 0  # samples answered by a replica, over which service_seconds is summed

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
        if self.answer_deadline is not None and (self._watchdog is None or self._watchdog.done()):
            self._watchdog = asyncio.create_task(self._watch_answers(self.answer_deadline), name="reward-watchdog")
        self._notify()

    async def _watch_answers(self, deadline: float) -> None:
        """Lose every replica whose oldest outstanding sample has waited past `deadline` seconds."""
        while not self._closed:
            await asyncio.sleep(max(0.2, min(5.0, deadline / 10)))
            now = time.monotonic()
            for replica in list(self._replicas.values()):
                late = [(entry.sent_at, sid) for sid, entry in replica.outstanding.items()]
                if replica.alive and late and now - min(late)[0] > deadline:
                    waited, sid = now - min(late)[0], min(late)[1]
                    self._lose(replica, f"sample {sid!r} unanswered for {waited:.0f} s (over {deadline:g} s): hung")

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

    def _accepting(self) -> bool:
        """Whether some replica takes samples, full or not (a full one frees a slot with each answer)."""
        return any(r.alive and not r.draining for r in self._replicas.values())

    def _pick(self) -> ReplicaStream | None:
        candidates = [r for r in self._replicas.values() if r.has_room]
        if not candidates:
            return None
        return min(candidates, key=lambda r: (len(r.outstanding), r.latency or 0.0))

    def _forget(self, replica: ReplicaStream, sid: str, entry: InFlight) -> None:
        if replica.release(sid, entry):  # its caller gave up (cancelled) before the answer came
            self._slot_freed()

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
        self.answered += 1
        entry.future.set_result(score)
        self._slot_freed()

    def _lose(self, replica: ReplicaStream, reason: str) -> None:
        """Take a replica out and fail its outstanding samples over to their `score()` calls."""
        if not replica.alive:
            return
        if not self._closed:
            log.warning("reward replica %s at %s lost: %s", replica.name, replica.address, reason)
        replica.alive = False
        if self._replicas.get(replica.name) is replica:
            del self._replicas[replica.name]
        replica.call.cancel()
        for entry in replica.outstanding.values():
            if not entry.future.done():
                entry.future.set_exception(
                    ReplicaLost(f"reward replica {replica.name!r} at {replica.address}: {reason}")
                )
        replica.outstanding.clear()
        self._notify()

    def _notify(self) -> None:
        """The pool changed (a replica came, went or drains; the router closed): every waiter looks again."""
        self._changed.set()
        self._changed = asyncio.Event()
        self._slots.wake_all()

    def _slot_freed(self) -> None:
        self._changed.set()  # remove_replica waits for its replica's last answers here
        self._changed = asyncio.Event()
        self._slots.wake_one()

    @staticmethod
    async def _wait_changed(changed: asyncio.Event, timeout: float | None) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    async def close(self) -> None:
        """Close every stream; samples still waiting raise RuntimeError."""
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._notify()  # waiters raise, even with no replica left to lose
        replicas = list(self._replicas.values())
        for replica in replicas:
            self._lose(replica, "router closed")
        await asyncio.gather(*(r.reader for r in replicas if r.reader is not None), return_exceptions=True)
