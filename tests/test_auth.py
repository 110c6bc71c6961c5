"""Only the job's own processes may call its pools: every internal gRPC service of a running
`rljob run`, found by its open ports, refuses every RPC without the job's token or with a wrong one
(UNAUTHENTICATED), lets it through with the token, and keeps its health check open; `rljob status`
reads the token from the file the run wrote."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rljob.v1 import control_service_pb2, reward_service_pb2, rollout_service_pb2, weight_service_pb2

from conftest import REPO, kill_process_tree

pytestmark = pytest.mark.ray

SERVICES = {
    module.DESCRIPTOR.services_by_name[name].full_name: module.DESCRIPTOR.services_by_name[name]
    for module, name in (
        (rollout_service_pb2, "RolloutService"),
        (reward_service_pb2, "RewardService"),
        (weight_service_pb2, "WeightService"),
        (control_service_pb2, "ControlService"),
    )
}
# Called last with the token: they take the replica or the run out of service.
LAST = ("rljob.v1.RolloutService/Drain", "rljob.v1.ControlService/Stop")


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def listening_ports(pids: set[int]) -> set[int]:
    """TCP ports that the processes `pids` listen on (all of them reachable on 127.0.0.1 here)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # gRPC binds 127.0.0.1 as ::ffff:127.0.0.1
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


async def find_services(ports: set[int]) -> dict[str, int]:
    """Which port serves which rljob service, asked of each port's (open) health service."""
    found: dict[str, int] = {}
    for port in sorted(ports):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for name in SERVICES:
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=1)
                except grpc.aio.AioRpcError:
                    continue
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    found[name] = port
    return found


async def call(port: int, method: Any, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    """One call of `method` with an empty request; the status it ends with (OK or the error's code)."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    request = method.input_type._concrete_class()
    parse = method.output_type._concrete_class.FromString
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        kind = (
            ("stream" if method.client_streaming else "unary")
            + "_"
            + ("stream" if method.server_streaming else "unary")
        )
        stub = getattr(ch, kind)(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=parse)
        sent = iter([request]) if method.client_streaming else request
        try:
            if method.server_streaming:
                async for _ in stub(sent, metadata=metadata, timeout=5):
                    pass
            else:
                await stub(sent, metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def running(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`rljob run` of the shipped example (on the plumbing model), long enough to be probed, until its
    first step is trained."""
    work = tmp_path_factory.mktemp("auth")
    out, log, job_file = work / "run", work / "run.log", work / "job.yaml"
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["model"]["path"] = str(assets / "model")
    doc["spec"]["data"]["path"] = str(assets / "train.jsonl")
    doc["spec"]["checkpoint"] = {"dir": str(work / "ckpt"), "everySteps": 1000}
    doc["spec"]["algorithm"].update({"groupSize": 4, "promptsPerStep": 4})
    job_file.write_text(yaml.safe_dump(doc))
    command = [sys.executable, "-m", "rljob_workers.driver.cli", "run", str(job_file)]
    command += ["--output", str(out), "--steps", "100000", "--no-display", "--stop-timeout", "20"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, f"rljob run exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step trained in 240 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    try:
        yield proc, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                kill_process_tree(proc.pid)
                proc.wait()


def test_run_writes_its_token_for_its_owner_only(running: tuple[subprocess.Popen[bytes], Path]) -> None:
    _, out = running
    token = out / "token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert len(token.read_text().strip()) >= 40  # 32 random bytes, URL-safe base64


def test_every_internal_rpc_needs_the_token(running: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, out = running
    token = (out / "token").read_text().strip()
    found = asyncio.run(find_services(listening_ports(descendants(proc.pid))))
    assert set(found) == set(SERVICES), f"found {found}"  # health answered without a token
    methods = [(m, found[s]) for s, d in SERVICES.items() for m in d.methods]
    methods.sort(key=lambda mp: f"{mp[0].containing_service.full_name}/{mp[0].name}" in LAST)
    outcomes: dict[str, tuple[str, str, str]] = {}

    async def probe() -> None:
        for method, port in methods:
            name = f"{method.containing_service.full_name}/{method.name}"
            none = await call(port, method, ())
            wrong = await call(port, method, (("authorization", "Bearer " + "x" * len(token)),))
            right = await call(port, method, (("authorization", f"Bearer {token}"),))
            outcomes[name] = (none.name, wrong.name, right.name)

    asyncio.run(probe())
    print(json.dumps(outcomes, indent=1))
    assert len(outcomes) == sum(len(d.methods) for d in SERVICES.values()) == 13  # every RPC of the four
    for name, (none, wrong, right) in outcomes.items():
        assert none == "UNAUTHENTICATED", name
        assert wrong == "UNAUTHENTICATED", name
        assert right != "UNAUTHENTICATED", name
    # Stop with the token went through: the run stops, cleanly.
    assert proc.wait(90) == 0


def test_rljob_status_needs_the_token_file(tmp_path: Path) -> None:
    """`rljob status` of a run: refused without the token, answered with --token-file."""
    from rljob.v1 import control_service_pb2_grpc
    from rljob_workers.common.auth import JobToken
    from rljob_workers.common.grpc_server import Service, start_server

    class Control(control_service_pb2_grpc.ControlServiceServicer):
        async def GetJobStatus(self, request: Any, context: Any) -> Any:
            return control_service_pb2.GetJobStatusResponse(status=control_service_pb2.JobStatus(step=12))

    token = JobToken.new(tmp_path)

    async def go() -> list[subprocess.CompletedProcess[str]]:
        service = Service(
            control_service_pb2_grpc.add_ControlServiceServicer_to_server, Control(), "rljob.v1.ControlService"
        )
        server = await start_server([service], token=token.value)
        base = [sys.executable, "-m", "rljob_workers.driver.cli", "status", f"127.0.0.1:{server.port}"]
        try:
            runs = []
            for extra in ([], ["--token-file", token.path]):
                proc = await asyncio.create_subprocess_exec(
                    *base, *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
                )
                stdout, stderr = await proc.communicate()
                runs.append(
                    subprocess.CompletedProcess(base + extra, proc.returncode or 0, stdout.decode(), stderr.decode())
                )
            return runs
        finally:
            await server.stop(None)

    without, with_token = asyncio.run(go())
    assert without.returncode == 1
    assert "UNAUTHENTICATED: /rljob.v1.ControlService/GetJobStatus: no job token" in without.stderr
    assert "--token-file" in without.stderr
    assert with_token.returncode == 0, with_token.stderr
    assert "12" in with_token.stdout


def test_a_refused_client_stream_is_told_unauthenticated_not_internal() -> None:
    """A client still writing when its stream is refused saw INTERNAL (grpcio's aio client lets a failed
    write overwrite the server's status, grpc/grpc#36066): 27 of 30 such streams before the refusal
    read the stream out first. Now every one is told why."""
    from rljob.v1 import reward_service_pb2_grpc, sample_pb2
    from rljob_workers.common.grpc_server import Service, start_server

    class Reward(reward_service_pb2_grpc.RewardServiceServicer):
        async def Score(self, requests: Any, context: Any) -> Any:
            async for request in requests:
                yield reward_service_pb2.ScoreResponse(score=sample_pb2.SampleScore(sample_id=request.sample.sample_id))

    def stream(call: int) -> Iterator[reward_service_pb2.ScoreRequest]:
        for i in range(64):  # 4 MiB in all: the client is still writing when the refusal comes
            sample = sample_pb2.RewardSample(sample_id=f"{call}/{i}", completion="x" * 65536)
            yield reward_service_pb2.ScoreRequest(sample=sample)

    async def go() -> dict[str, int]:
        service = Service(
            reward_service_pb2_grpc.add_RewardServiceServicer_to_server, Reward(), "rljob.v1.RewardService"
        )
        server = await start_server([service], token="the-job-token")
        seen: dict[str, int] = {}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                stub = reward_service_pb2_grpc.RewardServiceStub(channel)
                for call in range(20):
                    try:
                        async for _ in stub.Score(stream(call), timeout=20):
                            pass
                        outcome = "OK"
                    except grpc.aio.AioRpcError as exc:
                        outcome = f"{exc.code().name}: {exc.details()}"
                    seen[outcome] = seen.get(outcome, 0) + 1
        finally:
            await server.stop(None)
        return seen

    assert asyncio.run(go()) == {
        "UNAUTHENTICATED: /rljob.v1.RewardService/Score: no job token (authorization: Bearer <token>)": 20
    }


def test_a_channel_with_the_token_sends_it_after_the_callers_own_metadata_on_every_call_shape() -> None:
    """`channel(address, token)`: unary and streaming calls alike pass the server's token check, and what a
    caller puts in a call's metadata still arrives; without the token the same server refuses them."""
    from rljob_workers.common.auth import TokenCheck
    from rljob_workers.common.grpc_server import channel

    async def unary(request: bytes, context: Any) -> bytes:
        return b",".join(
            f"{k}={v}".encode() for k, v in context.invocation_metadata() if k in ("x-trace", "authorization")
        )

    async def stream(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request.upper()

    async def go() -> tuple[bytes, list[bytes], str]:
        handlers = {
            "Get": grpc.unary_unary_rpc_method_handler(unary),
            "Echo": grpc.stream_stream_rpc_method_handler(stream),
        }
        server = grpc.aio.server(interceptors=[TokenCheck("s3cret")])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Test", handlers),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with channel(f"127.0.0.1:{port}", "s3cret") as authorized:
                got = await authorized.unary_unary("/t.Test/Get", None, None)(b"", metadata=(("x-trace", "7"),))
                echoed = [r async for r in authorized.stream_stream("/t.Test/Echo", None, None)(iter([b"a", b"b"]))]
            async with channel(f"127.0.0.1:{port}") as plain:
                try:
                    await plain.unary_unary("/t.Test/Get", None, None)(b"")
                    refused = "OK"
                except grpc.aio.AioRpcError as exc:
                    refused = exc.code().name
        finally:
            await server.stop(None)
        return got, echoed, refused

    assert asyncio.run(go()) == (b"x-trace=7,authorization=Bearer s3cret", [b"A", b"B"], "UNAUTHENTICATED")
