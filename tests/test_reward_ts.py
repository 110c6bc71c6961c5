"""The TypeScript reward server of examples/reward-server-ts: built with npm ci + tsc, scored through rljob's
router and `remote` reward client, locked by the environment (the job's token and TLS), and used by a short
RLJob on the real local launcher over TLS with the job's token."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from lock_doors import Lock, doors, expected, make_lock, reward_info, reward_score

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_api import parse_rljob
from rljob_api.reward import RewardFunction
from rljob_workers.common.grpc_server import channel
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.reward import RewardFunctionSet

from conftest import REPO, built_ts_example

EXAMPLE = REPO / "examples" / "reward-server-ts"
INVALID = sample_pb2.ERROR_CLASS_INVALID
FUNCTION = sample_pb2.ERROR_CLASS_FUNCTION
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT
DRAINING = sample_pb2.REFUSAL_REASON_DRAINING


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example copied out of the repository, installed from its lock file and compiled."""
    return built_ts_example(EXAMPLE, tmp_path_factory)


@pytest.fixture(scope="module")
def lock(tmp_path_factory: pytest.TempPathFactory) -> Lock:
    return make_lock(tmp_path_factory.mktemp("lock"))


@contextlib.contextmanager
def ts_server(root: Path, lock: Lock | None = None) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The built server on a free 127.0.0.1 port, locked by the environment (RLJOB_TOKEN_FILE, RLJOB_TLS_CERT,
    RLJOB_TLS_KEY) with `lock`; yields host:port and the process; stopped with SIGTERM (it drains)."""
    env = {"PATH": str(Path(shutil.which("node") or "node").parent), **(lock.env() if lock else {})}
    command = ["node", "dist/server.js", "--host", "127.0.0.1", "--port", "0", "--proto-dir", str(REPO / "proto")]
    with subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line, summary = proc.stdout.readline(), proc.stdout.readline()
            assert line.startswith("reward 'exact-match' serving on 127.0.0.1:"), line
            assert summary.strip().startswith("calls need the job's token" if lock else "open: no token"), summary
            yield line.split()[-1], proc
            proc.send_signal(signal.SIGTERM)  # a no-op when the test already stopped it
            assert proc.wait(10) == 0, "the server should drain and exit cleanly on SIGTERM"
        finally:
            proc.kill()


def sample(sid: str, completion: str, **fields: str) -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(
        sample_id=sid, prompt_id=sid.split("/")[0], prompt="2+3=", completion=completion, fields=fields
    )


def test_ts_server_scores_through_the_router_and_keeps_the_contract(built: Path) -> None:
    async def go(address: str) -> None:
        router = RewardRouter(replica_timeout=5)
        await router.add_replica("ts", address)
        right, eos, wrong, missing = await asyncio.gather(
            router.score(sample("p/0", " 5", answer="5")),
            router.score(sample("p/1", "5</s>junk", answer="5")),
            router.score(sample("p/2", "6", answer="5")),
            router.score(sample("p/3", "5")),
        )
        assert [(s.score, dict(s.components)) for s in (right, eos, wrong)] == [
            (1.0, {"exact-match": 1.0}),
            (1.0, {"exact-match": 1.0}),
            (0.0, {"exact-match": 0.0}),
        ]
        assert missing.error.error_class == FUNCTION and "sample 'p/3' has no answer field" in missing.error.message
        assert router.stats().replicas["ts"].scored == 4
        await router.close()

        async with channel(address) as ch:
            stub = reward_service_pb2_grpc.RewardServiceStub(ch)
            info = await stub.Info(reward_service_pb2.InfoRequest())
            assert (info.name, list(info.functions), info.min_score, info.max_score) == (
                "exact-match",
                ["exact-match"],
                0.0,
                1.0,
            )
            call = stub.Score()
            await call.write(reward_service_pb2.ScoreRequest(sample=sample("", "5", answer="5")))
            await call.done_writing()
            [empty] = [r.score async for r in call]
            assert empty.error.error_class == INVALID and "empty sample_id" in empty.error.message
            batch = [sample("x", "5", answer="5"), sample("x", "5", answer="5")]
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stub.ScoreBatch(reward_service_pb2.ScoreBatchRequest(samples=batch))
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "samples[1]: duplicate sample_id 'x'" in (exc.value.details() or "")
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.SERVING

    with ts_server(built) as (address, _):
        asyncio.run(asyncio.wait_for(go(address), 30))


def test_ts_server_reads_a_number_and_a_list_from_the_typed_values(built: Path) -> None:
    """#54: the driver sends each field with its JSON type (`values`) beside its text; the TypeScript server
    reads them: a numeric answer, and a list of other accepted answers."""
    from rljob_workers.common.field_values import to_texts, to_values

    def typed(sid: str, completion: str) -> sample_pb2.RewardSample:
        fields = {"answer": 5, "accepted": ["five", "V"]}
        return sample_pb2.RewardSample(
            sample_id=sid, prompt="2+3=", completion=completion, fields=to_texts(fields), values=to_values(fields)
        )

    async def go(address: str) -> list[float]:
        router = RewardRouter(replica_timeout=5)
        await router.add_replica("ts", address)
        scored = await asyncio.gather(*(router.score(typed(f"t/{i}", c)) for i, c in enumerate(["5", "five", "6"])))
        await router.close()
        assert not any(s.HasField("error") for s in scored), scored
        return [s.score for s in scored]

    with ts_server(built) as (address, _):
        assert asyncio.run(asyncio.wait_for(go(address), 30)) == [1.0, 1.0, 0.0]


async def until_draining(address: str) -> None:
    """Until the server's health is no longer SERVING (it then refuses new calls, or says NOT_SERVING)."""
    async with channel(address) as ch:
        while True:
            try:
                health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            except grpc.aio.AioRpcError:
                return
            if health.status != health_pb2.HealthCheckResponse.SERVING:
                return
            await asyncio.sleep(0.02)


def test_ts_server_refuses_with_the_typed_field_while_draining(built: Path) -> None:
    async def go(address: str, proc: subprocess.Popen[str]) -> None:
        async with channel(address) as ch:
            call = reward_service_pb2_grpc.RewardServiceStub(ch).Score()
            await call.write(reward_service_pb2.ScoreRequest(sample=sample("p/0", "5", answer="5")))
            first = await call.read()
            assert isinstance(first, reward_service_pb2.ScoreResponse) and first.score.score == 1.0
            proc.send_signal(signal.SIGTERM)  # drains: the open stream stays, its new samples are refused
            await until_draining(address)
            await call.write(reward_service_pb2.ScoreRequest(sample=sample("p/1", "5", answer="5")))
            late = await call.read()
            assert isinstance(late, reward_service_pb2.ScoreResponse)
            assert (late.score.error.refusal, late.score.error.error_class) == (DRAINING, TRANSIENT)
            assert late.score.error.message == "sample 'p/1' refused: reward server draining"
            await call.done_writing()
            end = await call.read()  # EOF: the stream ends once its samples are answered
            assert not isinstance(end, reward_service_pb2.ScoreResponse) and await call.code() == grpc.StatusCode.OK
        assert await asyncio.to_thread(proc.wait, 10) == 0, "the drained server exits cleanly"

    with ts_server(built) as (address, proc):
        asyncio.run(asyncio.wait_for(go(address, proc), 30))


def test_ts_server_locked_by_the_environment_refuses_a_call_without_the_jobs_token(built: Path, lock: Lock) -> None:
    """RLJOB_TOKEN_FILE, RLJOB_TLS_CERT and RLJOB_TLS_KEY lock it: over TLS, no token and a wrong one are refused
    UNAUTHENTICATED on every call but health, the job's token is let through, plain text gets nowhere."""
    with ts_server(built, lock) as (address, _):
        calls = [reward_info, reward_score]
        assert doors(address, lock, calls) == expected(calls)


def test_ts_server_as_a_remote_reward_over_tls_with_the_jobs_token(built: Path, lock: Lock) -> None:
    async def go(address: str) -> None:
        for token, ok in ((str(lock.token), True), (None, False)):
            tls = {"tls": True, "caFile": str(lock.tls.ca)}
            config: dict[str, Any] = {"endpoints": [address], **tls} | ({"tokenFile": token} if token else {})
            spec = RewardFunction.model_validate({"name": "ts", "kind": "remote", "remote": config})
            functions = RewardFunctionSet.from_spec([spec], 5.0)
            try:
                result = await functions.score(sample("p/0", "5", answer="5"))
            finally:
                await functions.aclose()
            if ok:
                assert (result.score, result.HasField("error")) == (1.0, False), result.error.message
            else:
                assert result.error.error_class == FUNCTION and "UNAUTHENTICATED" in result.error.message

    with ts_server(built, lock) as (address, _):
        asyncio.run(asyncio.wait_for(go(address), 30))


@pytest.mark.ray
def test_short_rljob_with_a_remote_reward_on_the_ts_server_over_tls(built: Path, lock: Lock, tmp_path: Path) -> None:
    from rljob_workers.driver.run.plan import plan_job
    from rljob_workers.driver.run.session import RunSession
    from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

    from tiny_models import char_llama

    char_llama(tmp_path / "model", eos_bias=3.0)
    write_jsonl(tmp_path / "train.jsonl", make_problems(32, seed=1))
    doc = yaml.safe_load((EXAMPLE / "rljob.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(tmp_path / "model")
    spec["data"]["path"] = str(tmp_path / "train.jsonl")
    spec["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "everySteps": 2}
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=2)
    spec["rollout"]["sampling"]["maxNewTokens"] = 6
    [function] = spec["reward"]["functions"]
    assert function["kind"] == "remote"

    with ts_server(built, lock) as (address, _):
        function["remote"].update(endpoints=[address], tls=True, caFile=str(lock.tls.ca), tokenFile=str(lock.token))
        job = parse_rljob(copy.deepcopy(doc))
        run = RunSession(plan_job(job, output=tmp_path / "out", display=False))
        rc = asyncio.run(run.main())
    assert rc == 0, run.view.message if run.view else "no view"
    assert [r.step for r in run.reports] == [1, 2]
    counts = run.reports[-1].counts
    assert counts.scored >= 2 * 4 * 4 and counts.excluded_reward_error == 0
    assert all(0.0 <= r.reward_mean <= 1.0 for r in run.reports)
