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
# (a dropped SYN waits on the kernel's retransmissions), so a driver that came up would be seen long
# after. Here a connect attempt gets 1 s and the next one follows within 1 s.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 1000),  # also the least time a connect attempt is given
    ("grpc.max_reconnect_backoff_ms", 1000),
)


Key = tuple[str, str]  # (namespace, RLJob name)


class ControlClients:
    """One channel per RLJob, reused across its polls.

    Per job, not per address: forgetting a deleted job closes its channel, and a closed channel cancels
    the calls in flight on it. Shared by address (two jobs' controllers at one address, as the e2e
    tests' stand-in is), that would cancel another job's poll, and its CancelledError would end the poller.
    """

    def __init__(self, timeout_seconds: float) -> None:
        self.timeout = timeout_seconds
        self._channels: dict[Key, tuple[str, aio.Channel]] = {}  # job -> (address, channel)

    async def _channel(self, job: Key, address: str) -> aio.Channel:
        known = self._channels.get(job)
        if known is not None and known[0] == address:
            return known[1]
        await self.forget(job)  # the job's controller moved: its old channel serves no one now
        channel = aio.insecure_channel(address, options=RECONNECT_OPTIONS)
        self._channels[job] = (address, channel)
        return channel

    async def snapshot(self, job: Key, address: str, token: str) -> control_pb.JobStatus | None:
        """The controller's status, or None if it does not answer in time (not up yet, gone, unreachable).
        `token` is the job's (its Secret): the ControlService answers no one without it."""
        stub = control_grpc.ControlServiceStub(await self._channel(job, address))
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

    async def forget(self, job: Key) -> None:
        """Close a deleted job's channel. A poll of the job still in flight ends by its own deadline: a
        close without grace would cancel it, raising CancelledError into the poller."""
        known = self._channels.pop(job, None)
        if known is not None:
            await known[1].close(grace=self.timeout)

    async def close(self) -> None:
        for job in list(self._channels):
            await self.forget(job)
