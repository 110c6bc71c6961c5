"""Nothing waits for ever (#53): a rollout replica that takes a Generate call and never answers, and a reward
replica that accepts samples and never answers, are each taken for hung within their deadline (real gRPC servers
on loopback, the driver's real clients); the run's progress and active deadlines (the pure policy); a blocked
event loop measured and named. The whole run under `rljob run` is tests/test_hung_replica.py's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import rollout_service_pb2 as rollout_pb
from rljob.v1 import sample_pb2
from rljob_workers.common.loop_watch import LoopWatch
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.driver.pools.rollout import ReplicaLost, RolloutClients
from rljob_workers.driver.run.deadlines import Deadlines
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.callables import WeightedFunction
from rljob_workers.reward.server import start_reward_server
from rljob_workers.rollout.server import serve_rollout

from conftest import REPO, load_script

bench = load_script(REPO / "benchmarks" / "controller" / "run.py", "bench_controller_deadlines")


class SilentEngine(bench.NullEngine):  # type: ignore[misc,name-defined]
    """Takes every request and never produces a sample: a wedged engine."""

    async def generate(self, prompts: Sequence[PromptInput], sampling: SamplingConfig) -> AsyncIterator[FinishedSample]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]  # an async generator that never gets here


async def hung_generate(timeout: float) -> tuple[float, str, bool]:
    configs = bench.job_configs(1, 2, 1, 1)
    running, _ = await serve_rollout(configs.rollout, "127.0.0.1", 0, engine=SilentEngine())
    clients = RolloutClients(max_in_flight=4, request_timeout=timeout)
    replica = clients.add("rollout-0", f"127.0.0.1:{running.port}")
    sampling = sample_pb2.SamplingParams(temperature=1.0, max_new_tokens=4)
    prompt = rollout_pb.PromptRequest(prompt_id="p0", token_ids=[1, 2], n=2)
    request = rollout_pb.GenerateRequest(prompts=[prompt], sampling=sampling)
    started = time.monotonic()
    try:
        with pytest.raises(ReplicaLost) as lost:
            async for _ in clients.generate(replica, request):
                pass
        return time.monotonic() - started, str(lost.value), replica.alive
    finally:
        await clients.close()
        await running.stop(None)


def test_a_generate_call_past_its_deadline_loses_its_replica() -> None:
    """Before: no deadline, and the controller waited on the stream for ever."""
    took, why, alive = asyncio.run(hung_generate(timeout=1.5))
    assert 1.4 <= took < 10, took
    assert "rollout.requestTimeoutSeconds" in why and "hung" in why, why
    assert not alive  # out of the pool: the supervisor replaces it, the prompts go elsewhere


async def reward_answers(deadline: float) -> tuple[float, sample_pb2.SampleScore, RewardRouter]:
    """Two reward replicas: `silent` accepts samples and never answers (its own timeout is an hour), `fine`
    answers at once. A sample first sent to `silent` is answered by `fine`, once `silent` is taken for hung."""

    async def never(prompt: str, completion: str, **_: str) -> float:
        await asyncio.Event().wait()
        return 0.0

    silent_fns = RewardFunctionSet([WeightedFunction("never", never)], 3600.0)
    fine_fns = RewardFunctionSet([WeightedFunction("one", lambda prompt, completion, **_: 1.0)], 60.0)
    silent, _ = await start_reward_server(silent_fns, name="never", max_in_flight=8, port=0)
    fine, _ = await start_reward_server(fine_fns, name="one", max_in_flight=8, port=0)
    router = RewardRouter(replica_timeout=30.0, answer_deadline=deadline)
    try:
        await router.add_replica("silent", f"127.0.0.1:{silent.port}")
        sample = sample_pb2.RewardSample(sample_id="s0", prompt="1+1=", completion="2")
        started = time.monotonic()
        first = asyncio.ensure_future(router.score(sample))
        await asyncio.sleep(0.2)  # sent to `silent`, the only replica
        await router.add_replica("fine", f"127.0.0.1:{fine.port}")
        score = await asyncio.wait_for(first, 30)
        return time.monotonic() - started, score, router
    finally:
        await router.close()
        await silent.stop(None)
        await fine.stop(None)
        silent_fns.close()
        fine_fns.close()


def test_a_reward_replica_that_never_answers_is_lost_at_the_deadline_and_its_sample_scored_elsewhere() -> None:
    """Before: the router awaited the answer for ever, and so did the step."""
    took, score, router = asyncio.run(reward_answers(deadline=1.5))
    assert 1.4 <= took < 10, took
    assert score.score == 1.0 and not score.HasField("error")  # answered once, by the other replica
    assert router.requeued == 1 and not router.has_replica("silent")


def test_the_progress_deadline_counts_from_the_last_step_and_names_what_the_run_waits_on() -> None:
    deadlines = Deadlines(progress_seconds=100, active_seconds=None, started=0.0, last_progress=0.0)
    assert deadlines.expired(99.0, "prompts generating on rollout-0 (4)") is None
    deadlines.progressed(50.0)
    assert deadlines.expired(149.0, "") is None
    reason, message = deadlines.expired(150.0, "prompts generating on rollout-0 (4)") or (0, "")
    assert reason == control_pb.FAILURE_REASON_PROGRESS_DEADLINE
    assert "no train step completed for 100 s" in message and "rollout-0 (4)" in message


def test_the_active_deadline_bounds_the_whole_run_however_it_progresses() -> None:
    deadlines = Deadlines(progress_seconds=100, active_seconds=300, started=0.0, last_progress=0.0)
    for now in range(10, 300, 10):
        deadlines.progressed(float(now))
        assert deadlines.expired(float(now), "") is None
    reason, message = deadlines.expired(300.0, "") or (0, "")
    assert reason == control_pb.FAILURE_REASON_ACTIVE_DEADLINE and "activeDeadlineSeconds (300 s)" in message


async def blocked_loop() -> tuple[str, str, float]:
    watch = LoopWatch(lambda: ["slow_rule"])
    watch.start()
    await asyncio.sleep(0.5)
    time.sleep(1.6)  # what an async rule with a time.sleep inside does to its replica
    await asyncio.sleep(0.5)
    first, again = watch.report(), watch.report()
    watch.stop()
    await asyncio.sleep(0)  # its task ends with the loop's next turn
    return first, again, watch.worst


def test_a_blocked_event_loop_is_measured_and_its_async_functions_named_once() -> None:
    first, again, worst = asyncio.run(blocked_loop())
    assert "event loop blocked for 1." in first and "slow_rule" in first, first
    assert again == "" and 1.3 <= worst < 3.0
