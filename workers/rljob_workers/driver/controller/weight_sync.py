"""Move each new policy version from the trainer to every live rollout replica.

The bulk path is a bucketed collective broadcast in a group of the trainer (rank 0) and
the live replicas, set up over gRPC (JoinWeightGroup) and re-formed whenever the set of
replicas changes. A replica that joins late first pulls the current version from the
trainer's WeightService, then joins the group at the next sync.

The supervisor may take a dead replica out of the pool (closing its channel) between two calls of a
sync; a call on a closed channel raises grpc.aio.UsageError, which counts here as a replica lost.

The group's members cannot tell that one of them died (gloo waits for it until the group's timeout), but
the controller can: that replica's call fails. The first call that fails aborts the group, which fails
every member's side of the join or broadcast at once, and the sync goes on with the replicas that answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import grpc

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.driver.pools.rollout import Replica, RolloutClients

log = logging.getLogger(__name__)

T = TypeVar("T")
GONE = (grpc.aio.AioRpcError, grpc.aio.UsageError)  # the replica stopped answering / left the pool
BACKENDS = {"gloo": pb.WEIGHT_BACKEND_GLOO, "nccl": pb.WEIGHT_BACKEND_NCCL}


class WeightSource(Protocol):
    """The trainer side of the checkpoint engine."""

    weight_address: str

    async def publish(self, version: int, broadcast: bool = False) -> None: ...
    def broadcast_source(self, group_id: str) -> pb.BroadcastSource: ...
    async def open_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]: ...
    async def join_group(self) -> None: ...
    async def broadcast(self) -> int: ...
    async def abort_group(self, group_id: str, reason: str) -> None: ...


@dataclass
class WeightSync:
    trainer: WeightSource
    rollout: RolloutClients
    backend: str
    timeout: float
    members: tuple[str, ...] = ()
    group_id: str = ""
    published: int = -1
    seconds: list[float] = field(default_factory=list)
    _delivery: asyncio.Task[None] | None = None  # the version `overlapped` delivers in the background

    async def __call__(self, version: int) -> None:
        """Publish `version` and deliver it to every live replica (re-forming the group if needed), within
        weightSync.timeoutSeconds for all tries together: a sync that cannot finish fails naming its replicas."""
        started = time.monotonic()
        failed: list[Replica] = []
        for _attempt in range(3):
            live = self.rollout.live()
            if not live:
                await self._publish_only(version)
                return
            failed = await self._form_group(live) if tuple(r.name for r in live) != self.members else []
            if not failed:
                failed = await self._broadcast(live, version)
            if not failed:
                self.seconds.append(time.monotonic() - started)
                return
            # A broken broadcast fails every member; only those that stopped answering are gone.
            for replica in failed:
                replica.alive = await answers(replica)
            self.members = ()
            if time.monotonic() - started >= self.timeout:
                break
        causes = "; ".join(f"{r.name}: {r.last_error}" for r in failed) or "no replica took it"
        raise RuntimeError(
            f"could not deliver policy version {version} to the rollout pool within weightSync.timeoutSeconds "
            f"({self.timeout:g} s): {causes}"
        )

    async def _form_group(self, live: list[Replica]) -> list[Replica]:
        """Open a group of the trainer and `live`; returns the replicas that failed to join. A replica takes as
        many ranks as its engine has processes that receive weights (vllm: one per tensor-parallel rank)."""
        self.group_id = uuid.uuid4().hex[:12]
        try:
            ranks = await asyncio.gather(*(_weight_ranks(r, self.timeout) for r in live))
        except GONE as exc:
            for replica in live:
                replica.last_error = f"asking its weight ranks failed: {_detail(exc)}"
            return live
        world = 1 + sum(ranks)
        firsts = [1 + sum(ranks[:i]) for i in range(len(live))]
        host, port = await self.trainer.open_group(self.group_id, world, self.backend, self.timeout)
        joins = [
            _call(
                r.stub.JoinWeightGroup,
                pb.JoinWeightGroupRequest(
                    group_id=self.group_id,
                    master_address=host,
                    master_port=port,
                    rank=first,
                    world_size=world,
                    backend=BACKENDS[self.backend],
                    timeout_seconds=self.timeout,
                ),
                self.timeout,
            )
            for first, r in zip(firsts, live, strict=True)
        ]
        # A member that cannot join would leave the others waiting for it until the group's timeout: its failed
        # call aborts the group (_beside).
        _, failed = await self._beside(self.trainer.join_group(), live, joins, "joining the weight group")
        if not failed:
            self.members = tuple(r.name for r in live)
        return failed

    async def _broadcast(self, live: list[Replica], version: int) -> list[Replica]:
        """Run one broadcast; returns the replicas that failed to take it."""
        request = pb.UpdateWeightsRequest(version=version, broadcast=self.trainer.broadcast_source(self.group_id))
        calls = [_call(r.stub.UpdateWeights, request, self.timeout) for r in live]
        # First attempt: pack and send bucket by bucket (overlapped); a retry re-sends the snapshot.
        first = self.published < version
        send = self.trainer.publish(version, broadcast=True) if first else self.trainer.broadcast()
        sent, failed = await self._beside(send, live, calls, "weight update")
        if sent:
            self.published = version
        return failed

    async def overlapped(self, version: int) -> asyncio.Task[None]:
        """Snapshot `version` on the trainer now and deliver it in a task, which this returns: the next
        train step may run meanwhile (it changes the trainer's weights, not the snapshot). One delivery
        at a time, since a broadcast sends the newest snapshot: the one before is awaited first (its
        failure is its awaiter's to report)."""
        if self._delivery is not None:
            with contextlib.suppress(Exception):
                await self._delivery
        await self._publish_only(version)
        self._delivery = asyncio.create_task(self(version), name=f"deliver-policy-version-{version}")
        return self._delivery

    async def publish_initial(self, version: int) -> None:
        """Publish the starting version (for late replicas and the bucket plan), sending nothing."""
        await self._publish_only(version)

    async def _publish_only(self, version: int) -> None:
        if self.published < version:
            await self.trainer.publish(version)
            self.published = version

    async def catch_up(self, replica: Replica, version: int) -> None:
        """Bring a replica that starts late to `version` over the WeightService chunk stream."""
        request = pb.UpdateWeightsRequest(version=version, pull=pb.PullSource(address=self.trainer.weight_address))
        try:
            await replica.stub.UpdateWeights(request, timeout=self.timeout)
        except GONE as exc:
            raise RuntimeError(f"replica {replica.name} could not pull version {version}: {_detail(exc)}") from None

    async def _beside(
        self, trainer_side: Awaitable[Any], live: list[Replica], calls: Sequence[Awaitable[Any]], what: str
    ) -> tuple[bool, list[Replica]]:
        """Run the trainer's side beside one call per replica: (the trainer's side succeeded, the replicas
        whose call failed). The first side that fails aborts the group, so the others fail now rather than
        wait for it until the group's timeout. A trainer-side error while every replica is fine is the
        trainer's own: raised."""
        sides = [asyncio.ensure_future(trainer_side), *(asyncio.ensure_future(call) for call in calls)]
        try:
            pending: set[asyncio.Future[Any]] = set(sides)
            while pending:
                # FIRST_COMPLETED, not FIRST_EXCEPTION: a call cancelled by its closed channel (a replica found
                # hung and taken out) raised nothing, and waiting on would wait on the group for its timeout.
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failure = next(((i, e) for i, s in enumerate(sides) if s in done and (e := _failure_of(s))), None)
                if failure is not None and pending:
                    who = "the trainer" if failure[0] == 0 else live[failure[0] - 1].name
                    await self._abort(f"{what} of {who} failed: {_detail(failure[1])}")
                    break
            results = await asyncio.gather(*sides, return_exceptions=True)
        except asyncio.CancelledError:
            for side in sides:
                side.cancel()
            raise
        failed = []
        for replica, result in zip(live, results[1:], strict=True):
            if isinstance(result, BaseException):
                # The detail, not the error: a log record that holds an AioRpcError holds its call and channel
                replica.last_error = f"{what} failed: {_detail(result)}"
                log.warning("%s: %s", replica.name, replica.last_error)
                failed.append(replica)
        if isinstance(results[0], BaseException) and not failed:
            raise results[0]
        return not isinstance(results[0], BaseException), failed

    async def _abort(self, reason: str) -> None:
        log.warning("aborting weight group %s: %s", self.group_id, reason)
        try:
            await self.trainer.abort_group(self.group_id, reason[:500])
        except Exception as error:  # the trainer's own side then fails at the group's timeout
            log.warning("could not abort weight group %s: %s", self.group_id, error)


async def _call(method: Callable[..., Awaitable[T]], request: Any, timeout: float) -> T:
    """Start the call inside the coroutine, so that a channel closed meanwhile fails it in gather."""
    return await method(request, timeout=timeout)


async def _weight_ranks(replica: Replica, timeout: float) -> int:
    """Members `replica` adds to a weight group (an older replica says 0: one)."""
    info = await replica.stub.GetRolloutInfo(pb.GetRolloutInfoRequest(), timeout=timeout)
    return max(int(info.weight_ranks), 1)


async def answers(replica: Replica) -> bool:
    """Whether `replica` still answers a GetRolloutInfo within 5 s."""
    try:
        await replica.stub.GetRolloutInfo(pb.GetRolloutInfoRequest(), timeout=5.0)
    except GONE:
        return False
    return True


def _failure_of(side: asyncio.Future[Any]) -> BaseException | None:
    """How a finished side failed: its exception, or a CancelledError when its call was cancelled."""
    return asyncio.CancelledError("its call was cancelled") if side.cancelled() else side.exception()


def _detail(exc: BaseException) -> str:
    if isinstance(exc, asyncio.CancelledError):
        return "its call was cancelled (the replica was taken out of the pool)"
    return (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) else f"{type(exc).__name__}: {exc}"
