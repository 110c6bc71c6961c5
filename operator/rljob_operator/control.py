"""The operator's client of a job's ControlService: one snapshot per poll, a short deadline, never an error."""

from __future__ import annotations

import logging

import grpc
from grpc import aio

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc

log = logging.getLogger(__name__)

# A driver's ControlService is polled for the tens of seconds its pod takes to start. gRPC's defaults
# would grow the reconnect backoff to 2 minutes over those failures and give a connect attempt 20 s
# (a dropped SYN waits on the kernel's retransmissions), so a driver that came up was seen 6-28 s
# late. Here a connect attempt gets 1 s and the next one follows within 1 s.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 1000),  # also the least time a connect attempt is given
    ("grpc.max_reconnect_backoff_ms", 1000),
)


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
            channel = self._channels[address] = aio.insecure_channel(address, options=RECONNECT_OPTIONS)
        stub = control_grpc.ControlServiceStub(channel)
        try:
            response = await stub.GetJobStatus(
                control_pb.GetJobStatusRequest(), timeout=self.timeout, metadata=(("authorization", f"Bearer {token}"),)
            )
        except aio.AioRpcError as exc:
            log.debug("ControlService at %s: %s", address, exc.code())
            if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                log.warning("ControlService at %s answered %s: %s", address, exc.code().name, exc.details())
            return None
        return response.status

    async def forget(self, address: str) -> None:
        channel = self._channels.pop(address, None)
        if channel is not None:
            await channel.close(grace=None)

    async def close(self) -> None:
        for address in list(self._channels):
            await self.forget(address)
