"""The TypeScript environment server of examples/environment-server-ts: built with npm ci + tsc, listed and
described by reflection with grpcurl as a user would, played through rljob's environment client, and driving
the calculator example's episodes in a short `rljob run` against it over TLS (the job's bearer token on every
call, refused UNAUTHENTICATED without it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import struct_pb2
from lock_doors import Lock, doors, environment_episode, environment_info, expected, make_lock

from rljob.v1 import environment_service_pb2 as pb
from rljob_workers.driver.pools.environment import EnvironmentClients

from conftest import REPO, built_ts_example

EXAMPLE = REPO / "examples" / "environment-server-ts"
RLJOB = str(Path(sys.executable).parent / "rljob")
SERVICE = "rljob.v1.EnvironmentService"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example copied out of the repository, installed from its lock file and compiled."""
    return built_ts_example(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="module")
def lock(tmp_path_factory: pytest.TempPathFactory) -> Lock:
    return make_lock(tmp_path_factory.mktemp("lock"))


@contextlib.contextmanager
def ts_server(root: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """The built server on a free 127.0.0.1 port, with `env` (its lock: RLJOB_TOKEN_FILE, RLJOB_TLS_CERT,
    RLJOB_TLS_KEY); yields host:port; stopped with SIGTERM (it drains)."""
    env = {"PATH": str(Path(shutil.which("node") or "node").parent), **(env or {})}
    command = ["node", "dist/server.js", "--host", "127.0.0.1", "--port", "0", "--proto-dir", str(REPO / "proto")]
    with subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line, summary = proc.stdout.readline(), proc.stdout.readline()
            assert line.startswith("environment 'calculator' serving on 127.0.0.1:"), line
            locked = "RLJOB_TOKEN_FILE" in env
            assert summary.strip().startswith("calls need the job's token" if locked else "open: no token"), summary
            yield line.split()[-1]
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0, "the server should drain and exit cleanly on SIGTERM"
        finally:
            proc.kill()


def grpcurl() -> str:
    """grpcurl as e2e/grpcurl.sh builds it (CI builds it before the tests); skips, saying so, without it."""
    path = subprocess.run(["bash", str(REPO / "e2e" / "grpcurl.sh"), "path"], capture_output=True, text=True)
    built_at = Path(path.stdout.strip())
    found = str(built_at) if built_at.is_file() else shutil.which("grpcurl")
    if found is None:
        pytest.skip(f"grpcurl is not built: run e2e/grpcurl.sh (it would be at {built_at})")
    return found


def test_grpcurl_lists_and_describes_the_service_by_reflection(built: Path) -> None:
    tool = grpcurl()
    with ts_server(built) as address:
        listed = subprocess.run([tool, "-plaintext", address, "list"], capture_output=True, text=True, timeout=30)
        described = subprocess.run(
            [tool, "-plaintext", address, "describe", SERVICE], capture_output=True, text=True, timeout=30
        )
        info = subprocess.run(
            [tool, "-plaintext", "-d", "{}", address, f"{SERVICE}/Info"], capture_output=True, text=True, timeout=30
        )
    assert listed.returncode == 0, listed.stderr
    assert SERVICE in listed.stdout.split()
    assert described.returncode == 0, described.stderr
    assert "rpc Episode ( stream .rljob.v1.EpisodeRequest ) returns ( stream .rljob.v1.EpisodeResponse )" in (
        described.stdout
    )
    assert info.returncode == 0, info.stderr
    answer = json.loads(info.stdout)
    assert answer["name"] == "calculator" and answer["stop"] == [")"] and answer["tools"][0]["name"] == "calc"


async def _episode(clients: EnvironmentClients, answer: str | None, actions: list[str]) -> list[pb.EpisodeResponse]:
    stream = await clients.open_next()
    assert stream is not None
    task = struct_pb2.Struct()
    task.update({"prompt": "123+456"} | ({"answer": answer} if answer is not None else {}))
    try:
        start = pb.EpisodeRequest(start=pb.EpisodeStart(episode_id="e0-1/0", task=task, seed=7, prompt="123+456"))
        answers = [await stream.ask(start)]
        for turn, text in enumerate(actions, 1):
            answers.append(await stream.ask(pb.EpisodeRequest(action=pb.Action(text=text, turn=turn))))
        return answers
    finally:
        stream.close()


def test_the_server_plays_calculator_episodes_through_rljobs_client(built: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")

    async def go(address: str) -> None:
        clients = EnvironmentClients(max_episodes=8, step_timeout=5.0, token="s3cret")
        clients.add("ts", address)
        try:
            info = await clients.info()
            assert (info.name, info.tool_names, info.stop, info.max_turns) == ("calculator", ["calc"], (")",), 4)
            first, call, right = await _episode(clients, "579", ["calc(123+456)", "579</s>"])
            assert first.observation.text == "" and not first.done
            assert [(m.role, m.content) for m in call.observation.messages] == [("tool", "579")]
            assert call.tool == "calc" and not call.done
            assert right.done and right.final_reward == 1.0 and right.metrics["turns"] == 2
            *_, wrong = await _episode(clients, "579", ["578"])
            assert wrong.done and wrong.final_reward == 0.0
            [no_answer] = await _episode(clients, None, [])
            assert no_answer.error.kind == pb.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE
            assert "episode e0-1/0: its task has no answer field" in no_answer.error.message
        finally:
            await clients.close()

    with ts_server(built, {"RLJOB_TOKEN_FILE": str(tmp_path / "token")}) as address:
        asyncio.run(asyncio.wait_for(go(address), 30))


def test_the_server_locked_by_the_environment_refuses_a_call_without_the_jobs_token(built: Path, lock: Lock) -> None:
    """RLJOB_TOKEN_FILE, RLJOB_TLS_CERT and RLJOB_TLS_KEY lock it: over TLS, no token and a wrong one are refused
    UNAUTHENTICATED on every call but health (Info and the Episode stream), the job's token is let through,
    plain text gets nowhere."""
    with ts_server(built, lock.env()) as address:
        calls = [environment_info, environment_episode]
        assert doors(address, lock, calls) == expected(calls)


def test_the_calculator_example_plays_its_episodes_against_the_typescript_server_over_tls(
    built: Path, lock: Lock, calculator: dict[str, Path], tmp_path: Path
) -> None:
    """`rljob run` with the job's `tls: true`, `caFile` and `tokenFile`, the server locked by the environment."""
    model, data = calculator["model"], calculator["data"]
    with ts_server(built, lock.env()) as address:
        doc: dict[str, Any] = yaml.safe_load((EXAMPLE / "rljob.yaml").read_text())
        spec = doc["spec"]
        spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
        spec["data"].pop("eval")
        tls = {"tls": True, "caFile": str(lock.tls.ca)}
        spec["environment"]["remote"].update(endpoints=[address], tokenFile=str(lock.token), **tls)
        spec["algorithm"]["totalSteps"] = 4
        spec["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump(doc))
        out = tmp_path / "out"
        done = subprocess.run(
            [RLJOB, "run", str(job), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=600
        )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 4 and all(step["samples"] == 64 for step in steps), "8 groups of 8 episodes a step"
    assert steps[-1]["counts"]["environment_errors"] == 0
    calls = sum(step["episodes"].get("tool_calls_calc", 0) for step in steps)
    assert calls > 0 and max(step["episodes"]["turns_max"] for step in steps) >= 2, "the tool was called"


def test_the_server_keeps_the_image_contract_of_an_environment_pod(built: Path, tmp_path: Path) -> None:
    """As a `kind: image` environment's container in an environment pod (docs/environments.md): its port from
    RLJOB_ENVIRONMENT_PORT, the job's token from the file RLJOB_TOKEN_FILE names, its readiness its health check
    (what the pod's Ray actor waits for, environment/actor.py), and a step latency from RLJOB_STEP_LATENCY_SECONDS."""
    import socket
    import time

    from rljob_workers.environment.actor import container_serving

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "token").write_text("job-token\n")
    env = {
        "PATH": str(Path(shutil.which("node") or "node").parent),
        "RLJOB_TOKEN_FILE": str(tmp_path / "token"),
        "RLJOB_ENVIRONMENT_PORT": str(port),
        "RLJOB_STEP_LATENCY_SECONDS": "0.3",
    }
    command = ["node", "dist/server.js", "--host", "127.0.0.1", "--proto-dir", str(REPO / "proto")]

    async def go(address: str) -> tuple[float, list[pb.EpisodeResponse]]:
        await asyncio.wait_for(container_serving(address), 20)
        clients = EnvironmentClients(max_episodes=8, step_timeout=5.0, token="job-token")
        clients.add("pod", address)
        started = time.monotonic()
        try:
            answers = await _episode(clients, "579", ["calc(123+456)", "579"])
        finally:
            await clients.close()
        return time.monotonic() - started, answers

    with subprocess.Popen(command, cwd=built, env=env, stdout=subprocess.DEVNULL) as proc:
        try:
            took, answers = asyncio.run(go(f"127.0.0.1:{port}"))
        finally:
            proc.terminate()
            proc.wait(10)
    assert answers[-1].done and answers[-1].final_reward == 1.0
    assert took >= 0.6, took  # two steps of 0.3 s
