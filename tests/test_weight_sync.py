"""WeightSync when a rollout replica dies in the middle of a policy push.

A dead member is invisible to the group's other members (gloo waits for it until the group's timeout), so
the first call that fails must abort the group, or the whole run stalls for weightSync.timeoutSeconds.

The supervisor takes a dead replica out of the pool (RolloutClients.remove closes its channel) on its
own schedule, so it can happen while a weight sync is between two calls to that replica. A call on a
closed channel raises grpc.aio.UsageError, not AioRpcError: before the fix it escaped the sync and
ended `rljob run` with exit 1 (CI saw it with a rollout replica killed after step 3). Real gRPC servers
on loopback stand for the replicas (only the RPCs the sync makes); a stand-in trainer lets the test
choose the moment the replica goes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from rljob.v1 import rollout_service_pb2 as pb
from rljob.v1 import rollout_service_pb2_grpc as pb_grpc
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.driver.controller.weight_sync import WeightSync
from rljob_workers.driver.pools.rollout import RolloutClients


class Replica(pb_grpc.RolloutServiceServicer):
    """The weight-sync RPCs of a rollout replica; UpdateWeights holds until the broadcast ends, or fails
    as a member of an aborted group does."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.aborted: set[str] = set()  # group ids
        self.groups: list[str] = []  # each group this replica joined, in order

    async def JoinWeightGroup(self, request: Any, context: Any) -> pb.JoinWeightGroupResponse:
        self.groups.append(request.group_id)
        return pb.JoinWeightGroupResponse()

    async def UpdateWeights(self, request: Any, context: Any) -> pb.UpdateWeightsResponse:
        group = request.broadcast.group_id
        while not self.release.is_set():
            if group in self.aborted:
                await context.abort(grpc.StatusCode.UNKNOWN, f"weight group {group!r} was aborted")
            await asyncio.sleep(0.01)
        return pb.UpdateWeightsResponse(staged_version=request.version)

    async def GetRolloutInfo(self, request: Any, context: Any) -> pb.GetRolloutInfoResponse:
        return pb.GetRolloutInfoResponse()


@dataclass
class Trainer:
    """The trainer side; `gate` holds its next publish/open_group until the test opens it."""

    weight_address: str = "127.0.0.1:1"
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    broadcast_fails: bool = False
    published: list[tuple[int, bool]] = field(default_factory=list)

    async def publish(self, version: int, broadcast: bool = False) -> None:
        if broadcast:
            await self.gate.wait()
            if self.broadcast_fails:  # what gloo does when a peer's process is gone
                raise RuntimeError("gloo: Connection reset by peer")
        self.published.append((version, broadcast))

    def broadcast_source(self, group_id: str) -> pb.BroadcastSource:
        return pb.BroadcastSource(group_id=group_id)

    async def open_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]:
        await self.gate.wait()
        return "127.0.0.1", 1

    async def join_group(self) -> None:
        return None

    async def broadcast(self) -> int:
        return 0

    async def abort_group(self, group_id: str, reason: str) -> None:
        pass


async def _serve() -> tuple[RunningServer, Replica]:
    servicer = Replica()
    server = await start_server(
        [Service(pb_grpc.add_RolloutServiceServicer_to_server, servicer, "rljob.v1.RolloutService")]
    )
    return server, servicer


async def _dies_during(phase: str) -> tuple[Trainer, RolloutClients]:
    server, _ = await _serve()
    clients = RolloutClients(max_in_flight=4)
    clients.add("rollout-0", f"127.0.0.1:{server.port}")
    trainer = Trainer(broadcast_fails=True)
    sync = WeightSync(trainer, clients, "gloo", timeout=10.0)
    if phase == "broadcast":
        sync.members = ("rollout-0",)  # the group is formed: the push goes straight to the broadcast
    pushing = asyncio.create_task(sync(1))
    await asyncio.sleep(0.3)  # the sync now waits inside the broadcast / the group's opening
    await server.stop(None)  # the replica's process dies
    await asyncio.sleep(0.2)
    await clients.remove("rollout-0")  # the supervisor finds it dead and takes it out of the pool
    trainer.gate.set()
    await asyncio.wait_for(pushing, 10)
    return trainer, clients


def test_a_replica_removed_while_the_broadcast_runs_leaves_the_version_published() -> None:
    trainer, clients = asyncio.run(_dies_during("broadcast"))
    assert not clients.live()
    assert trainer.published == [(1, False)], trainer.published  # kept for the replacement to pull


def test_a_replica_removed_while_the_group_forms_leaves_the_version_published() -> None:
    trainer, clients = asyncio.run(_dies_during("group"))
    assert not clients.live()
    assert trainer.published == [(1, False)], trainer.published


def test_a_replica_that_stops_answering_is_marked_dead_and_the_next_one_still_gets_the_version() -> None:
    async def run() -> tuple[Trainer, RolloutClients, Replica]:
        dead, _ = await _serve()
        alive, servicer = await _serve()
        clients = RolloutClients(max_in_flight=4)
        clients.add("rollout-0", f"127.0.0.1:{dead.port}")
        clients.add("rollout-1", f"127.0.0.1:{alive.port}")
        trainer = Trainer()
        sync = WeightSync(trainer, clients, "gloo", timeout=10.0)
        await dead.stop(None)
        servicer.release.set()
        trainer.gate.set()
        await asyncio.wait_for(sync(1), 10)
        await alive.stop(None)
        return trainer, clients, servicer

    trainer, clients, _ = asyncio.run(run())
    assert [r.name for r in clients.live()] == ["rollout-1"]
    assert trainer.published == [(1, True)], trainer.published


def test_usage_error_is_what_a_closed_channel_raises() -> None:
    """The premise of the tests above, pinned to the installed grpcio."""

    async def call_closed() -> BaseException | None:
        server, _ = await _serve()
        clients = RolloutClients(max_in_flight=1)
        replica = clients.add("r", f"127.0.0.1:{server.port}")
        await clients.remove("r")
        try:
            await replica.stub.GetRolloutInfo(pb.GetRolloutInfoRequest(), timeout=1)
        except BaseException as exc:
            return exc
        finally:
            await server.stop(None)
        return None

    assert isinstance(asyncio.run(call_closed()), grpc.aio.UsageError)


@dataclass
class AbortingTrainer(Trainer):
    """A trainer whose side of a broadcast, like gloo's, never notices a dead member: in a group of more than
    the live replica it ends only when the group is aborted; an abort fails the survivor's side too."""

    survivor: Replica = field(default_factory=Replica)
    aborts: list[tuple[str, str]] = field(default_factory=list)
    group: tuple[str, int] = ("", 0)  # id, world size

    async def open_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]:
        self.group = (group_id, world_size)
        return "127.0.0.1", 1

    async def publish(self, version: int, broadcast: bool = False) -> None:
        group_id, world_size = self.group
        if broadcast and world_size > 2:  # waits for the dead member
            while group_id not in {g for g, _ in self.aborts}:
                await asyncio.sleep(0.01)
            raise RuntimeError(f"weight group {group_id!r} was aborted")
        if broadcast:
            self.survivor.release.set()
        self.published.append((version, broadcast))

    async def abort_group(self, group_id: str, reason: str) -> None:
        self.aborts.append((group_id, reason))
        self.survivor.aborted.add(group_id)


def test_a_replica_lost_mid_broadcast_aborts_the_group_and_the_sync_finishes_without_it_at_once() -> None:
    """rollout-0 dies during the broadcast: its call fails at once, the group is aborted (the trainer and
    rollout-1 stop waiting), and the version reaches rollout-1 in a group without rollout-0, in seconds, not
    after weightSync.timeoutSeconds (600 here)."""

    async def run() -> tuple[AbortingTrainer, list[str], Replica, float]:
        dead, _ = await _serve()
        alive, survivor = await _serve()
        clients = RolloutClients(max_in_flight=4)
        clients.add("rollout-0", f"127.0.0.1:{dead.port}")
        clients.add("rollout-1", f"127.0.0.1:{alive.port}")
        trainer = AbortingTrainer(survivor=survivor, group=("formed", 3))
        sync = WeightSync(trainer, clients, "gloo", timeout=600.0)
        sync.members, sync.group_id = ("rollout-0", "rollout-1"), "formed"  # the push goes straight to the broadcast
        pushing = asyncio.create_task(sync(1))
        await asyncio.sleep(0.3)  # everyone is inside the broadcast
        started = time.monotonic()
        await dead.stop(None)  # rollout-0's process dies
        await asyncio.wait_for(pushing, 30)
        took = time.monotonic() - started
        live = [r.name for r in clients.live()]
        for name in ("rollout-0", "rollout-1"):
            await clients.remove(name)
        await alive.stop(None)
        return trainer, live, survivor, took

    trainer, live, survivor, took = asyncio.run(run())
    assert took < 10, f"the sync took {took:.1f}s after rollout-0 died"
    assert [g for g, _ in trainer.aborts] == ["formed"]
    assert "weight update of rollout-0 failed" in trainer.aborts[0][1], trainer.aborts
    assert live == ["rollout-1"]
    assert len(survivor.groups) == 1 and survivor.groups[0] != "formed"  # re-formed without rollout-0
    assert trainer.published == [(1, True)], trainer.published
