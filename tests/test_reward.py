"""The reward pool over real gRPC on 127.0.0.1: rule functions and the RewardService server.

The driver's client of the pool, the router, is tested in test_reward_router.py."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from reward_helpers import run, sample

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_api.reward import RemoteReward, RewardFunction, RuleReward
from rljob_api.workercfg import RewardWorkerConfig
from rljob_workers.common.grpc_server import channel
from rljob_workers.reward import (
    RewardConfigError,
    RewardFunctionSet,
    RewardServicer,
    load_function,
    serve_reward,
)

INVALID = sample_pb2.ERROR_CLASS_INVALID
FUNCTION = sample_pb2.ERROR_CLASS_FUNCTION
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT
NOT_REFUSED = sample_pb2.REFUSAL_REASON_UNSPECIFIED
DRAINING = sample_pb2.REFUSAL_REASON_DRAINING
RESOURCE_EXHAUSTED = sample_pb2.REFUSAL_REASON_RESOURCE_EXHAUSTED


def rule(name: str, ref: str, weight: float = 1.0) -> RewardFunction:
    return RewardFunction(name=name, kind="rule", weight=weight, rule=RuleReward(function=ref))


@contextlib.asynccontextmanager
async def reward_server(
    *functions: RewardFunction, timeout: float = 5.0, max_in_flight: int = 64
) -> AsyncIterator[tuple[RewardServicer, reward_service_pb2_grpc.RewardServiceStub]]:
    config = RewardWorkerConfig(functions=list(functions), timeout_seconds=timeout, max_in_flight=max_in_flight, gpus=0)
    running, servicer = await serve_reward(config)
    try:
        async with channel(f"127.0.0.1:{running.port}") as ch:
            yield servicer, reward_service_pb2_grpc.RewardServiceStub(ch)
    finally:
        await running.stop(None)
        servicer.functions.close()


async def stream(
    stub: reward_service_pb2_grpc.RewardServiceStub, samples: list[sample_pb2.RewardSample]
) -> list[sample_pb2.SampleScore]:
    call = stub.Score()
    for s in samples:
        await call.write(reward_service_pb2.ScoreRequest(sample=s))
    await call.done_writing()
    return [response.score async for response in call]


def scored(functions: list[RewardFunction], samples: list[sample_pb2.RewardSample], **kw: float) -> list:
    """Scores of `samples` over one Score stream."""
    out: list[sample_pb2.SampleScore] = []

    async def go() -> None:
        async with reward_server(*functions, **kw) as (_, stub):  # type: ignore[arg-type]
            out.extend(await stream(stub, samples))

    run(go())
    return out


# -- loading -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("reward_fns:missing", "has no attribute 'missing'"),
        ("reward_fns:NOT_A_FUNCTION", "is a int, not a callable"),
    ],
)
def test_load_errors_name_function_and_path(ref: str, says: str) -> None:
    with pytest.raises(RewardConfigError, match="reward function 'acc'") as info:
        load_function("acc", ref)
    assert says in str(info.value) and ref in str(info.value)


def test_bad_kind_config_is_refused_naming_the_function() -> None:
    token = RemoteReward(endpoints=["judge:50052"], token_file="/nonexistent", tls=True)
    remote = RewardFunction(name="judge", kind="remote", remote=token)
    with pytest.raises(RewardConfigError, match="reward function 'judge': bearer token file '/nonexistent' does not"):
        RewardFunctionSet.from_spec([rule("acc", "reward_fns:exact"), remote], 1.0)


# -- the server ----------------------------------------------------------------------------------


def test_score_stream_weighted_sum_and_components() -> None:
    functions = [rule("acc", "reward_fns:exact", 2.0), rule("len", "reward_fns:length", -0.5)]
    scores = scored(functions, [sample("p/0", "42", answer="42"), sample("p/1", "41 ", answer="42")])
    by_id = {s.sample_id: s for s in scores}
    assert dict(by_id["p/0"].components) == {"acc": 1.0, "len": 2.0}
    assert by_id["p/0"].score == pytest.approx(2.0 * 1 - 0.5 * 2)
    assert by_id["p/1"].score == pytest.approx(-1.5)
    assert not any(s.HasField("error") for s in scores)
    assert all(s.latency_seconds > 0 for s in scores)


def test_async_function() -> None:
    [score] = scored([rule("acc", "reward_fns:async_exact")], [sample("p/0", "42", answer="42")])
    assert score.score == 1.0 and not score.HasField("error")


def test_function_that_declares_sample_gets_the_reward_sample() -> None:
    with_meta = sample("p/0", "42", sample="a data field of this name is not passed")
    with_meta.policy_version, with_meta.token_ids[:] = 7, [5, 6, 7]
    [score] = scored([rule("meta", "reward_fns:newer_is_better")], [with_meta])
    assert not score.HasField("error") and score.score == pytest.approx(7.03)


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("reward_fns:boom", "raised ValueError on sample 'p/3': no answer field"),
        ("reward_fns:nan", "returned nan for sample 'p/3'"),
        ("reward_fns:text", "returned str 'high' for sample 'p/3', not a number"),
    ],
)
def test_function_failures_are_errors_never_zero(ref: str, says: str) -> None:
    [score] = scored([rule("acc", "reward_fns:exact"), rule("bad", ref)], [sample("p/3")])
    assert score.error.error_class == FUNCTION
    assert score.error.function == "bad"
    assert says in score.error.message and "'bad'" in score.error.message


def test_timeout_is_transient() -> None:
    [score] = scored([rule("slow", "reward_fns:sleepy")], [sample("p/0", delay="1")], timeout=0.2)
    assert score.error.error_class == TRANSIENT
    assert "'slow' timed out after 0.2s on sample 'p/0'" in score.error.message


def test_stream_invalid_ids_and_in_flight_limit() -> None:
    samples = [sample("a", delay="0.3"), sample("a"), sample(""), sample("b", delay="0.3"), sample("c")]
    scores = scored([rule("s", "reward_fns:slow")], samples, max_in_flight=2)
    errors = Counter((s.sample_id, s.error.error_class) for s in scores if s.HasField("error"))
    assert errors == Counter({("a", INVALID): 1, ("", INVALID): 1, ("c", TRANSIENT): 1})
    [refused] = [s for s in scores if s.sample_id == "c"]
    assert refused.error.refusal == RESOURCE_EXHAUSTED and refused.error.message.startswith("sample 'c' refused: 2")
    assert {s.error.refusal for s in scores if s.sample_id != "c"} == {NOT_REFUSED}
    assert sorted(s.sample_id for s in scores if not s.HasField("error")) == ["a", "b"]


def test_score_batch_and_info() -> None:
    async def go() -> None:
        async with reward_server(rule("acc", "reward_fns:exact"), max_in_flight=2) as (_, stub):
            batch = [sample("p/0", "42", answer="42"), sample("p/1", "7", answer="42")]
            reply = await stub.ScoreBatch(reward_service_pb2.ScoreBatchRequest(samples=batch))
            assert [(s.sample_id, s.score) for s in reply.scores] == [("p/0", 1.0), ("p/1", 0.0)]
            info = await stub.Info(reward_service_pb2.InfoRequest())
            assert (info.name, list(info.functions), info.max_in_flight, info.max_batch_size) == ("acc", ["acc"], 2, 2)
            for samples, code, says in [
                ([sample("x"), sample("x")], grpc.StatusCode.INVALID_ARGUMENT, "samples[1]: duplicate sample_id 'x'"),
                ([sample("")], grpc.StatusCode.INVALID_ARGUMENT, "samples[0] has an empty sample_id"),
                ([sample(str(i)) for i in range(3)], grpc.StatusCode.RESOURCE_EXHAUSTED, "3 samples is over"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as info_exc:
                    await stub.ScoreBatch(reward_service_pb2.ScoreBatchRequest(samples=samples))
                assert info_exc.value.code() == code and says in (info_exc.value.details() or "")

    run(go())


def test_drain_finishes_in_flight_and_refuses_new_work() -> None:
    async def go() -> None:
        async with reward_server(rule("s", "reward_fns:slow")) as (servicer, stub):
            call = stub.Score()
            await call.write(reward_service_pb2.ScoreRequest(sample=sample("a", delay="0.3")))
            await asyncio.sleep(0.1)
            drained = asyncio.create_task(servicer.drain(5))
            await asyncio.sleep(0.05)
            await call.write(reward_service_pb2.ScoreRequest(sample=sample("late")))
            await call.done_writing()
            answers = {r.score.sample_id: r.score async for r in call}
            assert await drained
            assert answers["a"].score == 1.0 and answers["late"].error.refusal == DRAINING
            assert answers["late"].error.error_class == TRANSIENT
            assert answers["late"].error.message == "sample 'late' refused: reward replica draining"
            refused = servicer.metrics.registry.get_sample_value("rljob_reward_refused_total", {"reason": "draining"})
            assert refused == 1
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await stream(stub, [sample("new")])
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE

    run(go())


def test_serve_function_helper_in_a_process() -> None:
    script = (
        "from rljob_workers.reward import serve_function\n"
        "def score(prompt, completion, **fields): return float(completion.strip() == fields['answer'])\n"
        "serve_function(score, name='exact', port=0, host='127.0.0.1')\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("reward 'exact' serving on 127.0.0.1:"), line
            address = line.split()[-1]

            async def go() -> None:
                async with channel(address) as ch:
                    stub = reward_service_pb2_grpc.RewardServiceStub(ch)
                    [score] = await stream(stub, [sample("p/0", " 42\n", answer="42")])
                    assert (score.score, dict(score.components)) == (1.0, {"exact": 1.0})

            run(go())
            proc.send_signal(signal.SIGTERM)  # drains, then exits cleanly
            assert proc.wait(10) == 0
        finally:
            proc.kill()


def test_non_finite_weighted_sum_is_an_error() -> None:
    functions = [rule("len", "reward_fns:length", 1e308), rule("len2", "reward_fns:length", 1e308)]
    [score] = scored(functions, [sample("p/0", "42")])
    assert score.error.error_class == FUNCTION and "weighted sum of sample 'p/0' is inf" in score.error.message
    assert math.isfinite(score.components["len"])
