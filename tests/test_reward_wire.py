"""The RewardService on the wire, through a real gRPC client on loopback: messages that do not
decode, Info's "no range", and reflection as grpcurl asks for it (v1 first)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2

from rljob.v1 import reward_service_pb2 as pb
from rljob.v1 import sample_pb2
from rljob_api.reward import RewardFunction, RuleReward
from rljob_api.workercfg import RewardWorkerConfig
from rljob_workers.reward import serve_reward

T = TypeVar("T")
MARK = b"MARKMARK"


def _config() -> RewardWorkerConfig:
    exact = RewardFunction(
        name="exact", kind="rule", rule=RuleReward(function="rljob_workers.tasks.arithmetic:exact_match")
    )
    return RewardWorkerConfig(functions=[exact], timeout_seconds=5.0, max_in_flight=8, gpus=0)


def _sample(sample_id: str, prompt: str = "1+1=") -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(sample_id=sample_id, prompt=prompt, completion="2", fields={"answer": "2"})


def _bad_utf8(message: bytes) -> bytes:
    """The message with its prompt made of bytes that are not UTF-8 (what a buggy client sends)."""
    assert MARK in message
    return message.replace(MARK, b"\xff\xfe\xff\xfe\xff\xfe\xff\xfe")


async def _with_server(body: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
    server, servicer = await serve_reward(_config(), "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            return await asyncio.wait_for(body(channel), 30)
    finally:
        await server.stop(None)
        await servicer.functions.aclose()


def _raw(channel: grpc.aio.Channel, method: str, response: Any) -> grpc.aio.StreamStreamMultiCallable:
    return channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=response.FromString)


def test_an_undecodable_message_on_the_stream_ends_it_with_invalid_argument_after_the_answers():
    async def body(channel: grpc.aio.Channel) -> tuple[list[str], grpc.StatusCode, str]:
        async def requests() -> AsyncIterator[bytes]:
            yield pb.ScoreRequest(sample=_sample("first")).SerializeToString()
            await asyncio.sleep(0.2)  # the first is in flight when the bad one comes
            yield _bad_utf8(pb.ScoreRequest(sample=_sample("bad", prompt=MARK.decode())).SerializeToString())
            yield pb.ScoreRequest(sample=_sample("after")).SerializeToString()

        call = _raw(channel, "/rljob.v1.RewardService/Score", pb.ScoreResponse)(requests())
        answered = []
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for response in call:
                answered.append(response.score.sample_id)
        return answered, failed.value.code(), failed.value.details() or ""

    answered, code, details = asyncio.run(_with_server(body))
    assert answered == ["first"], "the sample before the bad message is answered, not dropped"
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "message 2 on this stream does not decode" in details and "UTF-8" in details


def test_an_undecodable_batch_is_invalid_argument():
    async def body(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
        batch = pb.ScoreBatchRequest(samples=[_sample("a"), _sample("b", prompt=MARK.decode())]).SerializeToString()
        call = channel.unary_unary(
            "/rljob.v1.RewardService/ScoreBatch",
            request_serializer=lambda b: b,
            response_deserializer=pb.ScoreBatchResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call(_bad_utf8(batch))
        return failed.value

    error = asyncio.run(_with_server(body))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "ScoreBatch" in (error.details() or "")


def test_info_declares_no_range_as_both_zero():
    async def body(channel: grpc.aio.Channel) -> pb.InfoResponse:
        info = channel.unary_unary(
            "/rljob.v1.RewardService/Info",
            request_serializer=pb.InfoRequest.SerializeToString,
            response_deserializer=pb.InfoResponse.FromString,
        )
        return await info(pb.InfoRequest())

    info = asyncio.run(_with_server(body))
    assert (info.min_score, info.max_score) == (0.0, 0.0)
    assert list(info.functions) == ["exact"]


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_the_services_on_v1_and_v1alpha(version):
    async def body(channel: grpc.aio.Channel) -> list[str]:
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        call = channel.stream_stream(
            method,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        replies = [reply async for reply in call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
        return [service.name for service in replies[0].list_services_response.service]

    names = asyncio.run(_with_server(body))
    assert "rljob.v1.RewardService" in names and "grpc.health.v1.Health" in names
