"""The operator's ControlService client over real gRPC on 127.0.0.1: a driver that comes up after many
failed polls is seen at the next poll. Its pod starts for tens of seconds, during which a poll is
refused (nothing listens) or its SYN goes unanswered (dropped on the way); a channel kept across
those polls carries gRPC's reconnect backoff and a connect attempt still waiting on the kernel's SYN
retransmissions (1, 2, 4, 8, 16 s apart), so the driver would be seen seconds or minutes late.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from grpc import aio

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_operator.kube.control import ControlClients

POLL_EVERY = 0.5
DRIVER_STARTS_FOR = 16.0  # seconds of failed polls before the controller answers
JOB = ("ns", "job")


class _Controller(control_grpc.ControlServiceServicer):
    async def GetJobStatus(self, request, context):  # type: ignore[no-untyped-def]
        return control_pb.GetJobStatusResponse(status=control_pb.JobStatus(step=7))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _syns_dropped(port: int) -> Iterator[None]:
    rule = ["INPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(port), "-j", "DROP"]
    rule += ["-m", "comment", "--comment", "rljob-test-control-client"]
    subprocess.run(["iptables", "-w", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-w", "-D", *rule], check=True)


def _can_drop_syns() -> bool:
    if not shutil.which("iptables"):
        return False
    return subprocess.run(["iptables", "-w", "-S", "INPUT"], capture_output=True).returncode == 0


async def _seen_after(port: int, drop: bool) -> float:
    """Poll while the driver starts (nothing listens; with `drop`, SYNs vanish), then serve; how long
    after it was up a poll saw it."""
    address = f"localhost:{port}"  # a name, as the operator's is (the control Service's)
    clients = ControlClients(0.5)
    try:
        with _syns_dropped(port) if drop else contextlib.nullcontext():
            deadline = time.monotonic() + DRIVER_STARTS_FOR
            while time.monotonic() < deadline:
                assert await clients.snapshot(JOB, address, "token") is None
                await asyncio.sleep(POLL_EVERY)
        server = aio.server()
        control_grpc.add_ControlServiceServicer_to_server(_Controller(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        up = time.monotonic()
        try:
            while (status := await clients.snapshot(JOB, address, "token")) is None:
                if time.monotonic() - up > 30:
                    break
                await asyncio.sleep(POLL_EVERY)
            assert status is not None and status.step == 7, "the controller was up and not seen for 30 s"
            return time.monotonic() - up
        finally:
            await server.stop(None)
    finally:
        await clients.close()


@pytest.mark.parametrize("drop", [False, True], ids=["refused", "syn-dropped"])
def test_a_driver_that_comes_up_late_is_seen_at_the_next_poll(drop: bool) -> None:
    if drop and not _can_drop_syns():
        pytest.skip("needs root and iptables to drop the SYNs of one local port")
    seen_after = asyncio.run(_seen_after(_free_port(), drop))
    print(f"controller seen {seen_after:.1f}s after it came up")
    assert seen_after < 3.0, "seen late: the channel kept a long reconnect backoff or connect attempt"


class _HeldController(control_grpc.ControlServiceServicer):
    """Answers every GetJobStatus once `release` is set: a poll held in flight as long as a test needs."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def GetJobStatus(self, request, context):  # type: ignore[no-untyped-def]
        self.arrived.set()
        await self.release.wait()
        return control_pb.GetJobStatusResponse(status=control_pb.JobStatus(step=7))


async def _forget_during_poll(polled: tuple[str, str], forgotten: tuple[str, str]) -> control_pb.JobStatus | None:
    """Poll job `polled` at a held controller, forget job `forgotten` meanwhile, then release the answer;
    what the poll returned. Both jobs' controllers are at one address, as the e2e tests' stand-in is."""
    server = aio.server()
    controller = _HeldController()
    control_grpc.add_ControlServiceServicer_to_server(controller, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    clients = ControlClients(2.0)
    try:
        poll = asyncio.create_task(clients.snapshot(polled, address, "token"))
        await asyncio.wait_for(controller.arrived.wait(), 5)
        forgetting = asyncio.create_task(clients.forget(forgotten))
        await asyncio.sleep(0.2)  # the forget is under way while the poll waits for its answer
        controller.release.set()
        await asyncio.wait_for(forgetting, 5)
        return await asyncio.wait_for(poll, 5)
    finally:
        await clients.close()
        await server.stop(None)


def test_forgetting_a_job_leaves_another_jobs_poll_alone() -> None:
    """Forgetting a deleted RLJob closed the channel of its address, which the stand-in's jobs share: a
    poll of another job in flight then raised CancelledError, which ended the operator's poller, and no
    status was refreshed again (the scale test's jobs stayed Provisioning)."""
    status = asyncio.run(_forget_during_poll(polled=("ns", "kept"), forgotten=("ns", "deleted")))
    assert status is not None and status.step == 7


def test_forgetting_a_job_during_its_own_poll_ends_that_poll_quietly() -> None:
    """The RLJob deleted while its controller is polled: the poll ends (answered or not), not cancelled."""
    asyncio.run(_forget_during_poll(polled=("ns", "deleted"), forgotten=("ns", "deleted")))
