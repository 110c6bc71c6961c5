"""Move each new policy version from the trainer to every live rollout replica.

The bulk path is a bucketed collective broadcast in a group of the trainer (rank 0) and
the live replicas, set up over gRPC (JoinWeightGroup) and re-formed whenever the set of
replicas changes. A replica that joins late first pulls the current version from the
trainer's WeightService, then joins the group at the next sync.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

import grpc

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.driver.controller.rollout_clients import Replica, RolloutClients

log = logging.getLogger(__name__)

BACKENDS = {"gloo": pb.WEIGHT_BACKEND_GLOO, "nccl": pb.WEIGHT_BACKEND_NCCL}


class WeightSource(Protocol):
    """The trainer side of the checkpoint engine."""

    weight_address: str

    async def publish(self, version: int, broadcast: bool = False) -> None: ...
    def broadcast_source(self, group_id: str) -> pb.BroadcastSource: ...
    async def open_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]: ...
    async def join_group(self) -> None: ...
    async def broadcast(self) -> int: ...


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

    async def __call__(self, version: int) -> None:
        """Publish `version` and deliver it to every live replica (re-forming the group if needed)."""
        started = time.monotonic()
        for _attempt in range(3):
            live = self.rollout.live()
            if not live:
                await self._publish_only(version)
                return
            if tuple(r.name for r in live) != self.members:
                await self._form_group(live)
            failed = await self._broadcast(live, version)
            if not failed:
                self.seconds.append(time.monotonic() - started)
                return
            # A broken broadcast fails every member; only those that stopped answering are gone.
            for replica in failed:
                replica.alive = await _answers(replica)
            self.members = ()
        raise RuntimeError(f"could not deliver policy version {version} to the rollout pool")

    async def _form_group(self, live: list[Replica]) -> None:
        self.group_id = uuid.uuid4().hex[:12]
        world = len(live) + 1
        host, port = await self.trainer.open_group(self.group_id, world, self.backend, self.timeout)
        joins = [
            r.stub.JoinWeightGroup(
                pb.JoinWeightGroupRequest(
                    group_id=self.group_id,
                    master_address=host,
                    master_port=port,
                    rank=rank,
                    world_size=world,
                    backend=BACKENDS[self.backend],
                    timeout_seconds=self.timeout,
                ),
                timeout=self.timeout,
            )
            for rank, r in enumerate(live, start=1)
        ]
        await asyncio.gather(self.trainer.join_group(), *joins)
        self.members = tuple(r.name for r in live)

    async def _broadcast(self, live: list[Replica], version: int) -> list[Replica]:
        """Run one broadcast; returns the replicas that failed to take it."""
        request = pb.UpdateWeightsRequest(version=version, broadcast=self.trainer.broadcast_source(self.group_id))
        calls = [r.stub.UpdateWeights(request, timeout=self.timeout) for r in live]
        # First attempt: pack and send bucket by bucket (overlapped); a retry re-sends the snapshot.
        first = self.published < version
        send = self.trainer.publish(version, broadcast=True) if first else self.trainer.broadcast()
        results = await asyncio.gather(send, *calls, return_exceptions=True)
        if not isinstance(results[0], BaseException):
            self.published = version
        failed = [r for r, result in zip(live, results[1:], strict=True) if isinstance(result, BaseException)]
        if isinstance(results[0], BaseException) and not failed:
            raise results[0]
        for replica, result in zip(live, results[1:], strict=True):
            if isinstance(result, BaseException):
                log.warning("weight update of %s failed: %s", replica.name, result)
        return failed

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
        except grpc.aio.AioRpcError as exc:
            raise RuntimeError(f"replica {replica.name} could not pull version {version}: {exc.details()}") from None


async def _answers(replica: Replica) -> bool:
    try:
        await replica.stub.GetRolloutInfo(pb.GetRolloutInfoRequest(), timeout=5.0)
    except grpc.aio.AioRpcError:
        return False
    return True
