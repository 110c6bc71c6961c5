"""Several samples per Score message, over real gRPC on 127.0.0.1: the router batches only for a replica
whose Info declares max_samples_per_message > 1, never past it; the server answers such a stream in
batches, refuses what is over its limit by name, and every sample is answered exactly once."""

from __future__ import annotations

import asyncio

import pytest
from reward_helpers import run, sample
from test_reward_router import slow_replicas, third_party

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_workers.common.grpc_server import channel
from rljob_workers.driver.pools.reward.router import RewardRouter


class _Recording(reward_service_pb2_grpc.RewardServiceServicer):
    """A third-party replica that records how many samples each message carried and answers in kind."""

    def __init__(self, max_samples_per_message: int) -> None:
        self.limit, self.messages = max_samples_per_message, list[tuple[str, int]]()

    async def Score(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            if request.samples:
                self.messages.append(("samples", len(request.samples)))
                scores = [sample_pb2.SampleScore(sample_id=s.sample_id, score=0.5) for s in request.samples]
                yield reward_service_pb2.ScoreResponse(scores=scores)
            else:
                self.messages.append(("sample", 1))
                score = sample_pb2.SampleScore(sample_id=request.sample.sample_id, score=0.5)
                yield reward_service_pb2.ScoreResponse(score=score)

    async def Info(self, request, context):  # type: ignore[no-untyped-def]
        return reward_service_pb2.InfoResponse(name="rec", max_in_flight=64, max_samples_per_message=self.limit)


async def _score_all(servicer: _Recording, n: int) -> list[sample_pb2.SampleScore]:
    server = await third_party(servicer)
    router = RewardRouter()
    await router.add_replica("r0", f"127.0.0.1:{server.port}")
    try:
        return await asyncio.gather(*(router.score(sample(f"p/{i}")) for i in range(n)))
    finally:
        await router.close()


@pytest.mark.parametrize(("declared", "most"), [(0, 1), (1, 1), (8, 8), (256, 256)])
def test_the_router_batches_only_as_far_as_the_replica_declares(declared: int, most: int) -> None:
    servicer = _Recording(declared)
    scores = run(_score_all(servicer, 40))
    assert sorted(s.sample_id for s in scores) == sorted(f"p/{i}" for i in range(40))  # each once
    assert sum(n for _, n in servicer.messages) == 40
    assert max(n for _, n in servicer.messages) <= most
    if most == 1:  # a replica that declares nothing gets exactly what it got before: `sample`
        assert {kind for kind, _ in servicer.messages} == {"sample"}
    else:  # the 40 sent in one moment go in ceil(40 / limit) messages
        assert {kind for kind, _ in servicer.messages} == {"samples"}
        assert len(servicer.messages) == -(-40 // most)


def test_the_server_answers_a_batched_stream_in_batches_and_refuses_the_extra_by_name() -> None:
    async def go() -> list[reward_service_pb2.ScoreResponse]:
        [server] = await slow_replicas(1)  # max_in_flight 64: its max_samples_per_message
        async with channel(f"127.0.0.1:{server.port}") as ch:
            stub = reward_service_pb2_grpc.RewardServiceStub(ch)
            info = await stub.Info(reward_service_pb2.InfoRequest())
            assert info.max_samples_per_message == 64
            batch = [sample(f"p/{i}", delay="0.2") for i in range(66)]
            return [r async for r in stub.Score(iter([reward_service_pb2.ScoreRequest(samples=batch)]))]

    replies = run(go())
    assert not any(r.HasField("score") for r in replies)
    scores = [s for r in replies for s in r.scores]
    assert sorted(s.sample_id for s in scores) == sorted(f"p/{i}" for i in range(66))
    over = [s for s in scores if s.HasField("error")]
    assert sorted(s.sample_id for s in over) == ["p/64", "p/65"]
    assert all("over Info's max_samples_per_message 64" in s.error.message for s in over)
    assert all(s.error.error_class == sample_pb2.ERROR_CLASS_INVALID for s in over)
    # the 64 that slept together finished close together: far fewer messages than answers. How
    # close depends on the machine's load (CI saw 5 messages on 2 busy cores), so the bound is a
    # quarter of the answers: one message per answer, the unbatched stream, is 66.
    assert len(replies) * 4 <= len(scores), [len(r.scores) for r in replies]
