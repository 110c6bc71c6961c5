"""The driver's client of the reward pool over real gRPC on 127.0.0.1: routing, fail-over, refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from reward_helpers import run, sample, started

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.driver.pools.reward.router import NoReplicaError, RewardRouter
from rljob_workers.reward import RewardFunctionSet, load_function
from rljob_workers.reward.callables import WeightedFunction
from rljob_workers.reward.server import start_reward_server

INVALID = sample_pb2.ERROR_CLASS_INVALID
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT
DRAINING = sample_pb2.REFUSAL_REASON_DRAINING
RESOURCE_EXHAUSTED = sample_pb2.REFUSAL_REASON_RESOURCE_EXHAUSTED


async def slow_replicas(n: int) -> list[RunningServer]:
    """`n` replicas of the `slow` rule; `run` stops them."""
    servers = []
    for _ in range(n):
        functions = RewardFunctionSet([WeightedFunction("s", load_function("s", "reward_fns:slow"))], 5.0)
        running, _ = await start_reward_server(functions, name="s", max_in_flight=64)
        servers.append(running)
    started.extend(servers)
    return servers


async def routed(servers: list[RunningServer], **kw: Any) -> RewardRouter:
    """A router over `servers`, named r0, r1, ... in order (on a tie the first takes the sample)."""
    router = RewardRouter(**kw)
    for i, server in enumerate(servers):
        await router.add_replica(f"r{i}", f"127.0.0.1:{server.port}")
    return router


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_router_sends_to_least_outstanding_replica() -> None:
    async def go() -> None:
        servers = await slow_replicas(2)
        router = await routed(servers)
        tasks = [asyncio.create_task(router.score(sample(f"p/{i}", delay="0.4"))) for i in range(10)]
        await until(lambda: sum(r.outstanding for r in router.stats().replicas.values()) == 10)
        assert [r.outstanding for r in router.stats().replicas.values()] == [5, 5]
        scores = await asyncio.gather(*tasks)
        assert all(s.score == 1.0 and not s.HasField("error") for s in scores)
        stats = router.stats()
        assert [(r.scored, r.outstanding) for r in stats.replicas.values()] == [(5, 0), (5, 0)]
        assert all(r.latency_ewma_seconds and r.latency_ewma_seconds >= 0.4 for r in stats.replicas.values())
        await router.close()

    run(go())


def test_killed_replica_loses_no_score() -> None:
    async def go() -> None:
        servers = await slow_replicas(2)
        router = await routed(servers)
        tasks = [asyncio.create_task(router.score(sample(f"p/{i}", delay="0.3"))) for i in range(12)]
        await until(lambda: router.stats().replicas["r0"].outstanding == 6)
        await servers[0].stop(0)  # killed with samples in flight
        scores = await asyncio.gather(*tasks)
        assert sorted(s.sample_id for s in scores) == sorted(f"p/{i}" for i in range(12))
        assert all(s.score == 1.0 and not s.HasField("error") for s in scores)
        stats = router.stats()
        assert (stats.requeued, stats.duplicates_dropped, list(stats.replicas)) == (6, 0, ["r1"])
        assert stats.replicas["r1"].scored == 12
        await router.close()

    run(go())


def test_router_refuses_an_oversized_sample_naming_it_and_keeps_the_stream() -> None:
    async def go() -> None:
        [server] = await slow_replicas(1)
        router = await routed([server], max_sample_bytes=4096)
        normal = asyncio.create_task(router.score(sample("p/0", delay="0.2")))
        big = await router.score(sample("p/1", "9" * 5000))
        assert big.error.error_class == INVALID
        assert big.error.message.startswith("sample 'p/1' is 50") and "over the 4096-byte limit" in big.error.message
        ok = await normal
        assert ok.score == 1.0 and not ok.HasField("error"), "the sample in flight beside it is unharmed"
        assert router.stats().requeued == 0
        await router.close()

    run(go())


class _AnswersTwice(reward_service_pb2_grpc.RewardServiceServicer):
    """A buggy third-party replica: every answer is sent twice."""

    async def Score(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            score = sample_pb2.SampleScore(sample_id=request.sample.sample_id, score=0.5)
            for _ in range(2):
                yield reward_service_pb2.ScoreResponse(score=score)

    async def Info(self, request, context):  # type: ignore[no-untyped-def]
        return reward_service_pb2.InfoResponse(name="twice", max_in_flight=8)


async def third_party(servicer: reward_service_pb2_grpc.RewardServiceServicer) -> RunningServer:
    """`servicer` as a replica; `run` stops it."""
    server = await start_server([Service(reward_service_pb2_grpc.add_RewardServiceServicer_to_server, servicer, "x")])
    started.append(server)
    return server


class _Declines(reward_service_pb2_grpc.RewardServiceServicer):
    """A third-party replica that answers every sample with `error`, and records the samples it saw."""

    def __init__(self, error: sample_pb2.ScoreError) -> None:
        self.error, self.seen = error, list[str]()

    async def Score(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            self.seen.append(request.sample.sample_id)
            yield reward_service_pb2.ScoreResponse(
                score=sample_pb2.SampleScore(sample_id=request.sample.sample_id, error=self.error)
            )

    async def Info(self, request, context):  # type: ignore[no-untyped-def]
        return reward_service_pb2.InfoResponse(name="declines", max_in_flight=8)


@pytest.mark.parametrize(("reason", "draining"), [(DRAINING, True), (RESOURCE_EXHAUSTED, False)])
def test_router_sends_a_typed_refusal_to_another_replica(reason: int, draining: bool) -> None:
    async def go() -> None:
        declines = _Declines(sample_pb2.ScoreError(error_class=TRANSIENT, message="not now", refusal=reason))  # type: ignore[arg-type]
        servers = [await third_party(declines), *await slow_replicas(1)]
        router = await routed(servers)
        result = await router.score(sample("p/0"))
        assert result.score == 1.0 and not result.HasField("error")
        stats = router.stats()
        assert (declines.seen, stats.refused, stats.requeued, stats.replicas["r1"].scored) == (["p/0"], 1, 0, 1)
        assert stats.replicas["r0"].draining is draining, "a draining replica gets no more samples"
        await router.close()

    run(go())


def test_router_reads_no_refusal_into_an_error_message() -> None:
    async def go() -> None:
        message = "UNAVAILABLE: sample 'p/0' refused: reward replica draining"
        declines = _Declines(sample_pb2.ScoreError(error_class=TRANSIENT, message=message))
        servers = [await third_party(declines), *await slow_replicas(1)]
        router = await routed(servers)
        result = await router.score(sample("p/0"))
        assert (result.error.error_class, result.error.message) == (TRANSIENT, message), "answered, not re-sent"
        stats = router.stats()
        assert (declines.seen, stats.refused, stats.replicas["r0"].draining) == (["p/0"], 0, False)
        await router.close()

    run(go())


def test_router_drops_duplicate_answers_and_waits_for_a_replica() -> None:
    async def go() -> None:
        server = await third_party(_AnswersTwice())
        router = RewardRouter(replica_timeout=1.0)
        with pytest.raises(NoReplicaError, match="sample 'p/0' within 1s"):
            await router.score(sample("p/0"))
        waiting = asyncio.create_task(router.score(sample("p/1")))  # waits (bounded) until a replica comes
        await asyncio.sleep(0.1)
        await router.add_replica("twice", f"127.0.0.1:{server.port}")
        more = await asyncio.gather(*(router.score(sample(f"q/{i}")) for i in range(4)))
        scores = [await waiting, *more]
        assert [s.score for s in scores] == [0.5] * 5
        await until(lambda: router.stats().duplicates_dropped == 5)
        await router.remove_replica("twice", timeout=2)
        assert router.stats().replicas == {} and router.stats().requeued == 0
        await router.close()

    run(go())


def test_a_full_pool_wakes_one_waiter_per_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """200 samples on one replica that takes 4 at a time: each answer lets the next waiter in. Waking
    every waiter on every answer (the old way) looked for a replica about 5,000 times, not ~400."""

    async def go() -> None:
        servers = await slow_replicas(1)
        router = RewardRouter()
        await router.add_replica("r0", f"127.0.0.1:{servers[0].port}", max_in_flight=4)
        picks = 0
        pick = router._pick

        def counted() -> Any:
            nonlocal picks
            picks += 1
            return pick()

        monkeypatch.setattr(router, "_pick", counted)
        finished: list[str] = []

        async def one(sid: str) -> None:
            score = await router.score(sample(sid, delay="0"))
            assert score.score == 1.0 and not score.HasField("error"), score
            finished.append(sid)

        sids = [f"p/{i}" for i in range(200)]
        tasks = [asyncio.create_task(one(sid)) for sid in sids]
        await asyncio.gather(*tasks)
        await router.close()
        assert sorted(finished) == sorted(sids) and router.stats().waiting == 0
        assert picks <= 3 * len(sids), f"{picks} looks for a replica for {len(sids)} samples"

    run(go())


def test_score_many_answers_each_sample_once_in_order_when_its_replica_is_killed() -> None:
    """Six of ten samples fit on r0 and go together; r0 is killed with them outstanding and they move
    to r1, the other four are routed one by one; a refused sample (empty id, too big, already being
    scored) is answered in its place without being sent."""

    async def go() -> None:
        servers = await slow_replicas(2)
        router = RewardRouter(max_sample_bytes=4096)
        await router.add_replica("r0", f"127.0.0.1:{servers[0].port}", max_in_flight=6)
        await router.add_replica("r1", f"127.0.0.1:{servers[1].port}", max_in_flight=64)
        samples = [sample(f"p/{i}", delay="0.3") for i in range(10)]
        refused = [sample(""), sample("p/big", "9" * 5000), sample("p/3")]
        batch = asyncio.create_task(router.score_many([*samples[:5], *refused, *samples[5:]]))
        await until(lambda: router.stats().replicas["r0"].outstanding == 6)
        await servers[0].stop(0)
        results = await batch
        ids = [r.sample_id for r in results]
        assert ids == [*(f"p/{i}" for i in range(5)), "", "p/big", "p/3", *(f"p/{i}" for i in range(5, 10))]
        answered = results[:5] + results[8:]
        assert all(r.score == 1.0 and not r.HasField("error") for r in answered), answered
        assert [r.error.error_class for r in results[5:8]] == [INVALID] * 3
        assert "over the 4096-byte limit" in results[6].error.message
        assert "already being scored" in results[7].error.message
        stats = router.stats()
        assert (stats.requeued, stats.duplicates_dropped, list(stats.replicas)) == (6, 0, ["r1"])
        assert stats.replicas["r1"].scored == 10 and stats.replicas["r1"].outstanding == 0
        await router.close()

    run(go())


class _CountsMessages(reward_service_pb2_grpc.RewardServiceServicer):
    """A replica that takes 16 samples per message and records how many each message held."""

    def __init__(self) -> None:
        self.messages = list[int]()

    async def Score(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            self.messages.append(len(request.samples) + request.HasField("sample"))
            scores = [sample_pb2.SampleScore(sample_id=s.sample_id, score=0.25) for s in request.samples]
            yield reward_service_pb2.ScoreResponse(scores=scores)

    async def Info(self, request, context):  # type: ignore[no-untyped-def]
        return reward_service_pb2.InfoResponse(name="counts", max_in_flight=64, max_samples_per_message=16)


def test_score_many_sends_a_group_in_one_message() -> None:
    async def go() -> None:
        counting = _CountsMessages()
        router = await routed([await third_party(counting)])
        results = await router.score_many([sample(f"p/{i}") for i in range(16)])
        assert [r.score for r in results] == [0.25] * 16 and counting.messages == [16]
        await router.close()

    run(go())
