"""The operator's client of a job's ControlService: one snapshot per poll, a short deadline, never an error."""

from __future__ import annotations

import logging

import grpc
from grpc import aio

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc

log = logging.getLogger(__name__)


class ControlClients:
    """One channel per controller address, reused across polls."""

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout = timeout_seconds
        self._channels: dict[str, aio.Channel] = {}

    async def snapshot(self, address: str, token: str) -> control_pb.JobStatus | None:
        """The controller's status, or None if it does not answer in time (not up yet, gone, unreachable).
        `token` is the job's (its Secret): the ControlService answers no one without it."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = aio.insecure_channel(address)
        stub = control_grpc.ControlServiceStub(channel)
        try:
            response = await stub.GetJobStatus(
                control_pb.GetJobStatusRequest(), timeout=self.timeout, metadata=(("authorization", f"Bearer {token}"),)
            )
        except aio.AioRpcError as exc:
            log.debug("ControlService at %s: %s", address, exc.code())
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                log.warning("ControlService at %s answered %s: %s", address, exc.code().name, exc.details())
            # The next poll starts afresh: this channel would keep gRPC's reconnect backoff (growing to
            # 2 minutes over a driver's start) and a connect attempt waiting on SYN retransmissions.
            await self.forget(address)
            return None
        return response.status

    async def forget(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close(grace=None)

    async def close(self) -> None:
        for address in list(self._channels):
            await self.forget(address)
