"""The controller's Generate calls: one prompt group per call, spread over the replicas by load,
never more in flight on a replica than it has room for. Real rollout and reward servers on loopback, the real
Controller, RolloutClients and RewardRouter; the engine does no work and logs each call it gets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from rljob_workers.driver.controller.data import PromptSource, Row
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.driver.pools.rollout import RolloutClients
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.callables import WeightedFunction
from rljob_workers.reward.server import start_reward_server
from rljob_workers.rollout.server import serve_rollout

from conftest import REPO, load_script

bench = load_script(REPO / "benchmarks" / "controller" / "run.py", "bench_controller_calls")


class LoggingEngine(bench.NullEngine):  # type: ignore[misc,name-defined]
    """The benchmark's null engine, logging the prompt ids of each generate call it serves."""

    def __init__(self, calls: list[list[str]]) -> None:
        super().__init__()
        self.calls = calls

    async def generate(self, prompts: Sequence[PromptInput], sampling: SamplingConfig) -> AsyncIterator[FinishedSample]:
        self.calls.append(sorted({prompt.prompt_id for prompt in prompts}))
        async for sample in super().generate(prompts, sampling):
            yield sample


async def run_job(steps: int, per_step: int, group: int, max_in_flight: int) -> tuple[dict[str, list[list[str]]], Any]:
    configs = bench.job_configs(steps, group, per_step, 1)
    calls: dict[str, list[list[str]]] = {"rollout-0": [], "rollout-1": []}
    servers = [
        await serve_rollout(configs.rollout, "127.0.0.1", 0, engine=LoggingEngine(log)) for log in calls.values()
    ]
    functions = RewardFunctionSet([WeightedFunction("one", lambda prompt, completion, **fields: 1.0)], 60.0)
    reward, _ = await start_reward_server(functions, name="one", max_in_flight=64, port=0)
    clients = RolloutClients(max_in_flight)
    router = RewardRouter(replica_timeout=30.0)
    trainer = bench.NullTrainer(clients, timeout=30)
    weights = await trainer.serve()
    try:
        for name, (running, _) in zip(calls, servers, strict=True):
            clients.add(name, f"127.0.0.1:{running.port}")
        await router.add_replica("reward-0", f"127.0.0.1:{reward.port}")
        controller = Controller(
            config=configs.controller,
            prompts=PromptSource([Row(f"{i}+{i}=", {"answer": str(2 * i)}) for i in range(256)], seed=0),
            rollout=clients,
            scorer=router,
            trainer=trainer,
            sync_weights=trainer.sync_weights,
        )
        await trainer.publish(0)
        await asyncio.wait_for(controller.run(), 60)
    finally:
        await router.close()
        await clients.close()
        await weights.stop()
        await reward.stop(None)
        for running, _ in servers:
            await running.stop(None)
    return calls, controller


def test_each_call_is_one_prompt_group_and_the_replicas_share_them() -> None:
    steps, per_step, group = 4, 8, 4
    calls, controller = asyncio.run(run_job(steps, per_step, group, max_in_flight=64))
    every = [call for log in calls.values() for call in log]
    prompts = [prompt for call in every for prompt in call]
    assert controller.counts.trained == steps * per_step * group
    assert len(prompts) == len(set(prompts)) >= steps * per_step, "each dispatched prompt is generated once"
    assert all(len(call) == 1 for call in every), calls
    # maxStaleness 1: the first 16 prompts start together, each on the replica with fewer in flight.
    assert sorted(len(log) for log in calls.values())[0] >= per_step - 1, calls


def test_a_call_takes_no_more_prompts_than_the_replica_has_room_for() -> None:
    calls, controller = asyncio.run(run_job(steps=3, per_step=8, group=2, max_in_flight=3))
    every = [call for log in calls.values() for call in log]
    assert controller.counts.trained == 3 * 8 * 2
    assert max(len(call) for call in every) <= 3, calls
    assert all(log for log in calls.values()), "both replicas generate"
