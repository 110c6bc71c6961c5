"""Bounded servers (#53): every gRPC server of the job refuses calls past its limit instead of taking memory and
tasks without bound; a reward Score stream whose client reads no answers stops taking samples (back-pressure);
a FetchWeights stream whose reader stalls ends and lets its snapshot go. Real servers on loopback."""

from __future__ import annotations

import asyncio
import time

import grpc
import torch

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob.v1 import weight_service_pb2 as wpb
from rljob.v1 import weight_service_pb2_grpc as wgrpc
from rljob_workers.common.grpc_server import HEADROOM_RPCS, channel, start_server
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.callables import WeightedFunction
from rljob_workers.reward.server import start_reward_server
from rljob_workers.weights.publisher import WeightPublisher, WeightServicer, as_service

MAX_IN_FLIGHT = 4


async def open_streams(count: int) -> list[str]:
    """`count` Score streams at once, each on a connection of its own; what each got."""
    functions = RewardFunctionSet([WeightedFunction("one", lambda prompt, completion, **_: 1.0)], 60.0)
    server, _ = await start_reward_server(functions, name="one", max_in_flight=MAX_IN_FLIGHT, port=0)
    # A connection each (grpcio shares one among channels to the same address by default, and that one
    # connection's stream limit would queue the calls past it in the client instead)
    own = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=own) for _ in range(count)]
    calls = [reward_service_pb2_grpc.RewardServiceStub(ch).Score() for ch in channels]
    try:

        async def first_answer(call: object) -> str:
            try:
                await call.write(reward_service_pb2.ScoreRequest(sample=sample_pb2.RewardSample(sample_id="s")))  # type: ignore[attr-defined]
                await asyncio.wait_for(call.read(), 10)  # type: ignore[attr-defined]
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name

        return await asyncio.gather(*(first_answer(call) for call in calls))
    finally:
        for call in calls:
            call.cancel()
        for ch in channels:
            await ch.close(None)
        await server.stop(None)


def test_a_server_refuses_calls_past_its_limit() -> None:
    """Before: no limit at all. A reward replica takes max_in_flight streams plus the headroom; on one
    connection the calls past it wait in the client (HTTP/2's stream limit), over several they are refused."""
    limit = MAX_IN_FLIGHT + HEADROOM_RPCS
    answers = asyncio.run(open_streams(limit + 3))
    assert answers.count("RESOURCE_EXHAUSTED") == 3 and answers.count("OK") == limit, answers


async def unread_answers(samples: int) -> tuple[int, int, int]:
    """A client writes `samples` samples without reading an answer until its writes stall; how many the server
    had scored then, how many writes went through, and how many answers came once it read them all."""
    scored: list[int] = []

    def count(prompt: str, completion: str, **_: str) -> float:
        scored.append(1)
        return 1.0

    functions = RewardFunctionSet([WeightedFunction("count", count)], 60.0)
    server, _ = await start_reward_server(functions, name="count", max_in_flight=MAX_IN_FLIGHT, port=0)
    padding = "x" * 2048  # so that the transport's own buffers hold few samples
    # A small receive window that does not grow: the answers the client does not read stay on the server
    small = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}", options=small) as ch:
        call = reward_service_pb2_grpc.RewardServiceStub(ch).Score()
        written, stalled = 0, None
        for i in range(samples):
            sample = sample_pb2.RewardSample(sample_id=f"s{i}", prompt=padding, completion="1")
            write = asyncio.ensure_future(call.write(reward_service_pb2.ScoreRequest(sample=sample)))
            done, _ = await asyncio.wait({write}, timeout=2.0)  # not cancelled: that would end the call
            if not done:
                stalled = write  # the server stopped reading: back-pressure
                break
            written += 1
        await asyncio.sleep(1.0)
        scored_while_unread = len(scored)
        reading = asyncio.ensure_future(_count_answers(call))
        if stalled is not None:
            await stalled  # goes through once answers are read
            written += 1
        await call.done_writing()
        answers = await reading
    await server.stop(None)
    return scored_while_unread, written, answers


async def _count_answers(call: object) -> int:
    answers = 0
    async for _ in call:  # type: ignore[attr-defined]
        answers += 1
    return answers


def test_a_score_stream_whose_answers_are_not_read_stops_taking_samples() -> None:
    """Before: the answer queue grew with every sample the client wrote."""
    scored, written, answers = asyncio.run(unread_answers(20000))
    print(f"{written} samples written before the writes stalled; {scored} scored meanwhile; {answers} answered")
    assert written < 20000, "the server kept reading: no back-pressure"
    assert scored < 2000, scored  # the bounded queue and what the transports hold
    assert answers == written  # each sample written is answered once its client reads


async def stalled_fetch(stall: float) -> tuple[str, float, int]:
    """A reader that takes one chunk of a 48 MiB model and stops; what it gets when it reads again, when, and
    the snapshot's readers then."""
    publisher = WeightPublisher(8 * 1024 * 1024)
    publisher.publish(1, [("w", torch.zeros(12 * 1024 * 1024))])
    servicer = WeightServicer(publisher, chunk_bytes=1024 * 1024, stall_seconds=stall)
    server = await start_server([as_service(servicer)])
    with publisher.acquire() as snapshot:
        pass  # the published version, to watch its readers
    try:
        async with channel(f"127.0.0.1:{server.port}") as ch:
            stream = wgrpc.WeightServiceStub(ch).FetchWeights(wpb.FetchWeightsRequest())
            await stream.read()
            started = time.monotonic()
            while snapshot.readers and time.monotonic() - started < 30:
                await asyncio.sleep(0.1)
            freed_after, readers = time.monotonic() - started, snapshot.readers
            try:
                eof = grpc.aio.EOF  # type: ignore[attr-defined]  # in grpc.aio, missing in grpc-stubs
                while (await stream.read()) is not eof:
                    pass
                outcome = "OK"
            except grpc.aio.AioRpcError as exc:
                outcome = f"{exc.code().name}: {exc.details()}"
        return outcome, freed_after, readers
    finally:
        await server.stop(None)


def test_a_stalled_weight_fetch_ends_and_lets_its_snapshot_go() -> None:
    """Before: the stream waited on its reader for ever, holding the version's buffers."""
    outcome, freed_after, readers = asyncio.run(stalled_fetch(stall=1.0))
    assert readers == 0 and freed_after < 10, (readers, freed_after)
    assert outcome.startswith("DEADLINE_EXCEEDED") and "took no chunk" in outcome, outcome
