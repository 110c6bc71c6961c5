"""The controller's view of the rollout pool: one gRPC channel per replica, load and liveness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from rljob.v1 import rollout_service_pb2 as pb
from rljob.v1 import rollout_service_pb2_grpc as pb_grpc
from rljob.v1 import sample_pb2
from rljob_workers.common.grpc_server import channel
from rljob_workers.driver.pools.busy import BusyClock

# Codes that mean "this replica is gone", as opposed to "this request was wrong".
REPLICA_LOST = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}


class ReplicaLost(Exception):
    """A rollout replica stopped answering; its work must move elsewhere."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"rollout replica {name} lost: {detail}")
        self.name = name


@dataclass
class Replica:
    name: str
    address: str
    stub: pb_grpc.RolloutServiceStub
    channel: grpc.aio.Channel
    in_flight: int = 0
    alive: bool = True
    last_error: str = ""  # why its last weight sync failed, for the run's message


@dataclass
class RolloutClients:
    """Live rollout replicas by name; picks the least-loaded one for each request."""

    max_in_flight: int
    token: str | None = None  # the job's, sent on every call
    request_timeout: float | None = None  # a Generate call's deadline: past it the replica is hung (lost)
    replicas: dict[str, Replica] = field(default_factory=dict)
    busy: BusyClock = field(default_factory=BusyClock)  # while any prompt is being generated
    _closing: set[asyncio.Future[None]] = field(default_factory=set)  # channels closing in the background

    def add(self, name: str, address: str) -> Replica:
        ch = channel(address, self.token)
        replica = self.replicas[name] = Replica(name, address, pb_grpc.RolloutServiceStub(ch), ch)
        return replica

    async def remove(self, name: str, grace: float | None = None) -> None:
        """Take a replica out; `grace`: seconds its calls in flight have to end before they are cancelled (the
        channel closes in the background meanwhile). A replica found dead or hung is killed first, so its calls
        fail at once with UNAVAILABLE, which every caller handles; a cancelled call is a CancelledError, which
        a caller would take for its own cancellation."""
        replica = self.replicas.pop(name, None)
        if replica is None:
            return
        replica.alive = False
        if grace is None:
            await replica.channel.close(grace=None)
        else:
            self._closing.add(task := asyncio.ensure_future(replica.channel.close(grace=grace)))
            task.add_done_callback(self._closing.discard)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.alive]

    def pick(self, avoid: str = "") -> Replica | None:
        """The live replica with the fewest prompts in flight, if one has room; another than `avoid` (one that
        just failed the request) where another is live."""
        live = self.live()
        if avoid and any(r.name != avoid for r in live):
            live = [r for r in live if r.name != avoid]
        candidates = [r for r in live if r.in_flight < self.max_in_flight]
        return min(candidates, key=lambda r: (r.in_flight, r.name)) if candidates else None

    async def generate(
        self, replica: Replica, request: pb.GenerateRequest, *, reserved: bool = False
    ) -> AsyncIterator[list[sample_pb2.Completion]]:
        """Stream completions, those that came in one message together; a lost replica raises
        ReplicaLost (and is marked dead). `reserved`: the caller counted the request's prompts in
        `replica.in_flight` when it chose the replica (they are released here all the same)."""
        if not reserved:
            replica.in_flight += len(request.prompts)
        self.busy.begin()
        try:
            async for response in replica.stub.Generate(request, timeout=self.request_timeout):
                # `completion`: a server that sends one sample per message
                batch = [response.completion] if response.HasField("completion") else []
                batch.extend(response.completions)
                if batch:
                    yield batch
        except grpc.aio.AioRpcError as exc:
            if exc.code() in REPLICA_LOST:
                replica.alive = False
                raise ReplicaLost(replica.name, exc.details() or exc.code().name) from None
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self.request_timeout is not None:
                # Alive, perhaps, but not generating: hung. Out of the pool (the supervisor replaces it), and
                # the prompts go elsewhere, as for a replica that died.
                replica.alive = False
                detail = f"no answer within rollout.requestTimeoutSeconds ({self.request_timeout:g} s): hung"
                raise ReplicaLost(replica.name, detail) from None
            raise
        except asyncio.CancelledError:
            # The call, not this task, was cancelled: `remove` closed the channel of a replica found hung
            # (its stream would never have ended). Its prompts go elsewhere, as for a replica that died.
            task = asyncio.current_task()
            if replica.alive or (task is not None and task.cancelling()):
                raise
            raise ReplicaLost(replica.name, "taken out of the pool") from None
        finally:
            replica.in_flight -= len(request.prompts)
            self.busy.end()

    async def close(self) -> None:
        for name in list(self.replicas):
            await self.remove(name)
