"""The controller's view of the environment pool: one channel per replica (the job's environment actors, or a
`kind: remote` environment's endpoints), episodes per replica, and one Episode stream per episode."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rljob.v1 import environment_service_pb2 as pb
from rljob.v1 import environment_service_pb2_grpc as pb_grpc
from rljob_api.reward import RemoteReward
from rljob_workers.common.grpc_server import CLIENT_OPTIONS, channel
from rljob_workers.driver.pools.rollout import REPLICA_LOST

ERROR_KINDS = {
    pb.ENVIRONMENT_ERROR_KIND_INVALID_ACTION: "invalid_action",
    pb.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE: "failure",
    pb.ENVIRONMENT_ERROR_KIND_TIMEOUT: "timeout",
}


class EnvironmentLost(Exception):
    """An episode's call failed: its replica is gone, it answered nothing in time, or not at all.
    `kind` is failure, timeout or lost (the replica)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class EnvironmentInfo:
    """What an environment's Info said: its name, its tools (in the chat templates' function format), the
    strings that end a model turn, its own turn limit."""

    name: str
    tools: tuple[dict[str, Any], ...] = ()
    stop: tuple[str, ...] = ()
    max_turns: int = 0

    @classmethod
    def from_info(cls, info: pb.EnvironmentServiceInfoResponse) -> EnvironmentInfo:
        tools = tuple(
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": json.loads(t.parameters_json or "{}"),
                },
            }
            for t in info.tools
        )
        return cls(info.name, tools, tuple(info.stop), info.max_turns)

    @property
    def tool_names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]


@dataclass
class EnvironmentReplica:
    name: str
    address: str
    channel: grpc.aio.Channel
    stub: pb_grpc.EnvironmentServiceStub
    metadata: tuple[tuple[str, str], ...] = ()
    episodes: int = 0
    alive: bool = True
    supervised: bool = True  # one of the job's environment actors (False: a kind remote endpoint)
    draining: bool = False  # leaving the pool: no new episodes, those on it finish
    calls: int = 0  # environment calls (a start, a step) in flight on it
    played: int = 0  # episodes that ended on it

    @property
    def outstanding(self) -> int:
        return self.calls

    @property
    def scored(self) -> int:
        return self.played


@dataclass(frozen=True)
class EnvironmentLoad:
    """The environment pool as the elastic policy sees it (elastic.PoolLoad), in environment calls: episodes
    waiting for a replica count as calls waiting (each starts with one)."""

    replicas: dict[str, EnvironmentReplica]
    waiting: int
    service_seconds: float
    answered: int


@dataclass
class EpisodeStream:
    """One episode's stream on one replica: each `ask` sends a request and waits for its answer."""

    replica: EnvironmentReplica
    call: Any
    timeout: float
    clients: EnvironmentClients

    async def ask(self, request: pb.EpisodeRequest) -> pb.EpisodeResponse:
        started = time.monotonic()
        self.replica.calls += 1
        self.clients.calls_started += 1
        try:
            response = await self._ask(request)
        finally:
            self.replica.calls -= 1
        self.clients.answered(time.monotonic() - started)
        return response

    async def _ask(self, request: pb.EpisodeRequest) -> pb.EpisodeResponse:
        try:
            await asyncio.wait_for(self.call.write(request), self.timeout)
            response = await asyncio.wait_for(self.call.read(), self.timeout)
        except TimeoutError:
            raise EnvironmentLost(
                f"environment replica {self.replica.name} answered nothing within stepTimeoutSeconds {self.timeout:g}",
                "timeout",
            ) from None
        except asyncio.InvalidStateError:  # the write came after the stream ended: its replica went away
            code = await self.call.code()
            self.replica.alive = self.replica.alive and not (code in REPLICA_LOST and self.replica.supervised)
            kind = "lost" if code in REPLICA_LOST else "failure"
            raise EnvironmentLost(f"environment replica {self.replica.name} ended the stream: {code}", kind) from None
        except grpc.aio.AioRpcError as exc:
            if exc.code() in REPLICA_LOST:
                # one of the job's replicas is replaced by its supervisor; a remote endpoint stays: it may be back
                self.replica.alive = not self.replica.supervised
                raise EnvironmentLost(
                    f"environment replica {self.replica.name} lost: {exc.details()}", "lost"
                ) from None
            raise EnvironmentLost(f"environment replica {self.replica.name}: {exc.details()}", "failure") from None
        if response is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc's stubs lack it
            raise EnvironmentLost(f"environment replica {self.replica.name} ended the episode's stream", "failure")
        return response  # type: ignore[no-any-return]

    def close(self) -> None:
        self.call.cancel()
        self.replica.episodes -= 1
        self.replica.played += 1
        self.clients.free_slot()


@dataclass
class EnvironmentClients:
    """Live environment replicas by name; each episode goes to the one with the fewest."""

    max_episodes: int
    step_timeout: float
    token: str | None = None  # the job's, for its own replicas
    replicas: dict[str, EnvironmentReplica] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # of every call since the last `take_latencies`
    calls_started: int = 0  # environment calls sent so far (the elastic policy's arrivals)
    waiting: int = 0  # episodes waiting for a replica (a live one, or a slot on one)
    service_seconds: float = 0.0  # summed over the calls answered so far
    calls_answered: int = 0
    _slot_freed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _notifying: set[asyncio.Task[None]] = field(default_factory=set)

    def answered(self, seconds: float) -> None:
        self.latencies.append(seconds)
        self.service_seconds += seconds
        self.calls_answered += 1

    def stats(self) -> EnvironmentLoad:
        replicas = {name: r for name, r in self.replicas.items() if r.supervised}
        return EnvironmentLoad(replicas, self.waiting, self.service_seconds, self.calls_answered)

    async def add_replica(self, name: str, address: str) -> None:
        """A replica the elastic policy started (elastic.Served)."""
        self.add(name, address)
        self.free_slot()  # an episode waiting for one may go

    async def remove_replica(self, name: str, timeout: float) -> int:
        """Drain replica `name`: no new episodes; those on it finish (after `timeout` seconds its channel
        closes and they restart elsewhere). Returns the episodes that ended on it."""
        replica = self.replicas.get(name)
        if replica is None:
            return 0
        replica.draining = True
        deadline = time.monotonic() + timeout
        while replica.episodes > 0 and replica.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.remove(name)
        return replica.played

    async def wait_live(self, halted: Callable[[], bool]) -> bool:
        """Wait while no replica is live (a replacement, or a pool scaled to zero, is on its way), counted
        as waiting; False if `halted` said stop first."""
        if self.live():
            return True
        self.waiting += 1
        try:
            while not self.live():
                if halted():
                    return False
                await asyncio.sleep(0.05)
            return True
        finally:
            self.waiting -= 1

    def add(self, name: str, address: str) -> EnvironmentReplica:
        ch = channel(address, self.token)
        replica = self.replicas[name] = EnvironmentReplica(name, address, ch, pb_grpc.EnvironmentServiceStub(ch))
        return replica

    def add_remote(self, config: RemoteReward, token: str | None) -> None:
        """A `kind: remote` environment's endpoints, over TLS when it says so, with its bearer token."""
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        for i, address in enumerate(config.endpoints):
            if config.tls:
                roots = Path(config.ca_file).read_bytes() if config.ca_file else None
                credentials = grpc.ssl_channel_credentials(root_certificates=roots)
                ch = grpc.aio.secure_channel(address, credentials, options=CLIENT_OPTIONS)
            else:
                ch = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
            stub = pb_grpc.EnvironmentServiceStub(ch)
            self.replicas[f"endpoint-{i}"] = EnvironmentReplica(
                f"endpoint-{i}", address, ch, stub, metadata, supervised=False
            )

    async def remove(self, name: str) -> None:
        replica = self.replicas.pop(name, None)
        if replica is not None:
            replica.alive = False
            await replica.channel.close(grace=None)
        async with self._slot_freed:  # an episode waiting for a slot looks again: none may be live now
            self._slot_freed.notify_all()

    def live(self) -> list[EnvironmentReplica]:
        return [r for r in self.replicas.values() if r.alive]

    def pick(self) -> EnvironmentReplica | None:
        candidates = [r for r in self.live() if r.episodes < self.max_episodes and not r.draining]
        return min(candidates, key=lambda r: (r.episodes, r.name)) if candidates else None

    async def open_next(self) -> EpisodeStream | None:
        """An episode's stream on the least-loaded live replica, once one has room under maxEpisodesPerReplica
        (an episode waits for a slot, it is not an error, and is counted as waiting); None when no replica
        is live."""
        if (replica := self.pick()) is None:
            self.waiting += 1
            try:
                while (replica := self.pick()) is None:
                    if not self.live():
                        return None
                    async with self._slot_freed:
                        await self._slot_freed.wait()
            finally:
                self.waiting -= 1
        return self.open(replica)

    def open(self, replica: EnvironmentReplica) -> EpisodeStream:
        replica.episodes += 1
        call = replica.stub.Episode(metadata=replica.metadata or None)
        return EpisodeStream(replica, call, self.step_timeout, self)

    def free_slot(self) -> None:
        """An episode's slot is free (or a replica came): one episode waiting for a slot looks again."""

        async def notify() -> None:
            async with self._slot_freed:
                self._slot_freed.notify_all()

        self._notifying.add(task := asyncio.get_running_loop().create_task(notify()))
        task.add_done_callback(self._notifying.discard)

    async def info(self) -> EnvironmentInfo:
        """The environment's Info, from a live replica."""
        replica = self.live()[0]
        answer = await replica.stub.Info(
            pb.EnvironmentServiceInfoRequest(), timeout=self.step_timeout, metadata=replica.metadata or None
        )
        return EnvironmentInfo.from_info(answer)

    def take_latencies(self) -> list[float]:
        taken, self.latencies[:] = list(self.latencies), []
        return taken

    async def close(self) -> None:
        for name in list(self.replicas):
            await self.remove(name)
