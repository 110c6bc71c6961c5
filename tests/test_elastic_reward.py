"""The elastic reward pool on real reward servers: a burst scales it up, an idle stretch drains it
down, and every sample is scored exactly once across the changes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rljob.v1 import sample_pb2
from rljob_api.reward import ReplicaRange, RewardFunction, RuleReward, ScalingSpec
from rljob_workers.driver.pools.elastic import ElasticPool
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.server import start_reward_server


@dataclass
class ServerPool:
    """Reward replicas as in-process gRPC servers (the launcher uses Ray actors the same way)."""

    actors: dict[str, Any] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    count: int = 0

    async def add(self) -> tuple[str, str]:
        fn = RewardFunction(name="slow", kind="rule", rule=RuleReward(function="reward_fns:slow"))
        functions = RewardFunctionSet.from_spec([fn], 10.0)
        server, servicer = await start_reward_server(functions, name="slow", max_in_flight=4)
        name = f"reward-{self.count}"
        self.count += 1
        self.actors[name] = (server, servicer)
        return name, f"127.0.0.1:{server.port}"

    async def stop(self, name: str) -> str:
        server, servicer = self.actors.pop(name)
        await server.stop(None)
        await servicer.functions.aclose()
        self.stopped.append(name)
        return name


def sample(i: int) -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(sample_id=f"p{i}/0", prompt_id=f"p{i}", completion="x", fields={"delay": "0.05"})


async def scenario() -> tuple[list[int], list[str], int, int]:
    router = RewardRouter(replica_timeout=10.0)
    pool = ServerPool()
    name, address = await pool.add()
    await router.add_replica(name, address)
    sent = 0
    scaling = ScalingSpec(
        target_backlog_per_replica=4,
        cooldown_seconds=0.0,
        max_step_up=2,
        interval_seconds=0.05,
        scale_down_window_seconds=0,
    )
    elastic = ElasticPool(router, pool, ReplicaRange(min=1, max=4), scaling, arrivals=lambda: sent)
    sizes: list[int] = []
    scores: list[sample_pb2.SampleScore] = []

    async def score(i: int) -> None:
        scores.append(await router.score(sample(i)))

    burst = [asyncio.create_task(score(i)) for i in range(48)]
    sent = 48
    for _ in range(8):  # the burst: a backlog of 48 against 4 per replica
        await asyncio.sleep(0.05)
        sizes.append((await elastic.step()).replicas)
    await asyncio.gather(*burst)
    for _ in range(6):  # idle: nothing waiting
        sizes.append((await elastic.step()).replicas)
    by_replica = elastic.scored_by_replica()
    await router.close()
    remaining = list(pool.actors)
    for name in remaining:
        await pool.stop(name)
    ids = [s.sample_id for s in scores]
    assert all(not s.HasField("error") and s.score == 1.0 for s in scores)
    # every score counted once against the replica that gave it, the drained replicas' included
    assert sum(by_replica.values()) == len(ids) and set(elastic.retired) <= set(by_replica), by_replica
    assert sorted(elastic.retired) == sorted(set(pool.stopped) - set(remaining)), (elastic.retired, pool.stopped)
    assert any(elastic.retired.values()), elastic.retired
    return sizes, pool.stopped, len(ids), len(set(ids))


def test_burst_scales_up_then_idle_drains_down_without_losing_a_score():
    sizes, stopped, scored, unique = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert max(sizes) == 4, sizes  # capped at max
    assert sizes[0] == 3  # one step up of at most maxStepUp
    assert sizes[-1] == 1  # back to min
    assert all(1 <= s <= 4 for s in sizes)
    assert scored == unique == 48
    assert len(stopped) >= 3


def timed(i: int, delay: float) -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(sample_id=f"t{i}/0", prompt_id=f"t{i}", completion="x", fields={"delay": str(delay)})


async def latency_after_a_slow_stretch() -> tuple[float | None, float | None]:
    """Two replicas score a slow stretch (0.3 s a sample) together, then fast samples one at a time: the router
    gives each to the replica with the lower latency, so the other scores none and keeps its 0.3 s. What
    latency does the policy see, during the stretch and after it?"""
    router, pool = RewardRouter(replica_timeout=10.0), ServerPool()
    for _ in range(2):
        await router.add_replica(*(await pool.add()))
    elastic = ElasticPool(router, pool, ReplicaRange(min=1, max=2), ScalingSpec(), arrivals=lambda: 0)
    try:
        await router.score_many([timed(i, 0.3) for i in range(8)])
        during = elastic.observe(1.0).latency_seconds
        for i in range(8, 28):
            await router.score(timed(i, 0.0))
        scored = {name: r.scored for name, r in router.stats().replicas.items()}
        assert sorted(scored.values())[0] == 4, scored  # one replica had none of the fast samples
        return during, elastic.observe(2.0).latency_seconds
    finally:
        await router.close()
        for name in list(pool.actors):
            await pool.stop(name)


def test_the_policy_sees_the_latency_of_the_samples_answered_lately():
    """The mean over the samples answered since the last look, not the replicas' own averages (one of which
    would still say 0.3 s: half the stretch's latency, held after it, kept the pool up on the real node)."""
    during, after = asyncio.run(asyncio.wait_for(latency_after_a_slow_stretch(), 30))
    assert during is not None and 0.3 <= during < 0.45, during
    assert after is not None and after < 0.05, after
