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
from rljob_operator.control import ControlClients

POLL_EVERY = 0.5
DRIVER_STARTS_FOR = 16.0  # seconds of failed polls before the controller answers


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
                assert await clients.snapshot(address, "token") is None
                await asyncio.sleep(POLL_EVERY)
        server = aio.server()
        control_grpc.add_ControlServiceServicer_to_server(_Controller(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        up = time.monotonic()
        try:
            while (status := await clients.snapshot(address, "token")) is None:
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
