"""The rollout replica's gRPC server: streams, refusals, drain, and weight updates by pull and by broadcast."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rollout_helpers import PausedEngine, perturbed, rollout_config, run

from rljob.v1 import rollout_service_pb2 as pb
from rljob.v1 import rollout_service_pb2_grpc as pb_grpc
from rljob.v1 import sample_pb2
from rljob_workers.common.grpc_server import channel, start_server
from rljob_workers.engines.base import FinishedSample, FinishReason
from rljob_workers.rollout import server as rollout_server
from rljob_workers.rollout.server import SERVICE_NAME, responses, serve_rollout, to_completion
from rljob_workers.weights import WeightGroup, WeightPublisher, host_store, to_proto, weight_service

from tiny_models import EOS, char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~80K-parameter Llama with a character tokenizer; EOS is made likely (~5% a step) so samples end both ways."""
    return char_llama(tmp_path_factory.mktemp("tiny-llama"))


def _request(*prompts: pb.PromptRequest, max_new_tokens: int = 6) -> pb.GenerateRequest:
    sampling = sample_pb2.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    return pb.GenerateRequest(prompts=prompts, sampling=sampling)


def test_server_streams_completions_and_reports_info(model_dir: Path) -> None:
    async def body() -> tuple[list[pb.GenerateResponse], pb.GetRolloutInfoResponse]:
        server, servicer = await serve_rollout(rollout_config(model_dir))
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.RolloutServiceStub(ch)
                request = _request(
                    pb.PromptRequest(prompt_id="ids", token_ids=[5, 6, 7], n=2),
                    pb.PromptRequest(prompt_id="text", text="12+3=", n=1, first_index=2),
                )
                messages = [r async for r in stub.Generate(request)]
                info = await stub.GetRolloutInfo(pb.GetRolloutInfoRequest())
            return messages, info
        finally:
            await server.stop(None)
            await servicer.close()

    messages, info = run(body())
    # The hf engine runs the three samples as one batch: they finish together and share a message.
    assert len(messages) == 1 and not messages[0].HasField("completion")
    completions = list(messages[0].completions)
    assert sorted(c.sample_id for c in completions) == ["ids/0", "ids/1", "text/2"]
    text_prompt = next(c for c in completions if c.prompt_id == "text").prompt_token_ids
    assert len(text_prompt) == 5
    for c in completions:
        assert len(c.logprobs) == len(c.token_ids) > 0 and c.policy_version == 0
        assert c.finish_reason in (sample_pb2.FINISH_REASON_STOP, sample_pb2.FINISH_REASON_LENGTH)
    assert (info.engine, info.model, info.policy_version, info.in_flight) == ("hf", str(model_dir), 0, 0)
    assert info.eos_token_id == EOS and not info.draining


@pytest.mark.parametrize(
    ("prompts", "named"),
    [
        ([pb.PromptRequest(prompt_id="blank", n=1)], "'blank' is empty"),
        ([pb.PromptRequest(prompt_id="none", token_ids=[5], n=0)], "'none': n must be at least 1"),
        ([pb.PromptRequest(prompt_id="twice", token_ids=[5], n=1)] * 2, "'twice' appears more than once"),
    ],
)
def test_server_rejects_bad_requests_naming_the_prompt(
    model_dir: Path, prompts: list[pb.PromptRequest], named: str
) -> None:
    async def body() -> grpc.aio.AioRpcError:
        server, servicer = await serve_rollout(rollout_config(model_dir))
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    [r async for r in pb_grpc.RolloutServiceStub(ch).Generate(_request(*prompts))]
            return caught.value
        finally:
            await server.stop(None)
            await servicer.close()

    error = run(body())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (error.details() or "")


def test_drain_refuses_new_work_and_waits_for_in_flight(model_dir: Path) -> None:
    async def body() -> None:
        engine = PausedEngine(str(model_dir))
        server, servicer = await serve_rollout(rollout_config(model_dir), engine=engine)
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.RolloutServiceStub(ch)
                request = _request(pb.PromptRequest(prompt_id="busy", token_ids=[5, 6], n=3))
                in_flight = asyncio.create_task(_drain_stream(stub.Generate(request)))
                assert await asyncio.to_thread(engine.started.wait, 10)
                drain = asyncio.ensure_future(stub.Drain(pb.DrainRequest(timeout_seconds=10)))
                await asyncio.sleep(0.2)
                assert not drain.done()  # waits for the three samples in flight
                health = health_pb2_grpc.HealthStub(ch)
                for name in ("", SERVICE_NAME):
                    checked = await health.Check(health_pb2.HealthCheckRequest(service=name))
                    assert checked.status == health_pb2.HealthCheckResponse.NOT_SERVING
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await _drain_stream(stub.Generate(request))
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                engine.release.set()
                assert sum(len(m.completions) for m in await in_flight) == 3  # nothing lost
                assert (await drain).in_flight == 0
                assert (await stub.GetRolloutInfo(pb.GetRolloutInfoRequest())).draining
        finally:
            engine.release.set()
            await server.stop(None)
            await servicer.close()

    run(body())


def test_samples_that_finished_together_share_messages_under_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = [
        FinishedSample("p", i, (1, 2), (3,) * 40, (-0.5,) * 40, 0, FinishReason.LENGTH, "x" * 40) for i in range(10)
    ]
    one = max(to_completion(s).ByteSize() for s in samples)
    assert [len(m.completions) for m in responses(samples)] == [10]
    monkeypatch.setattr(rollout_server, "MESSAGE_BUDGET_BYTES", 3 * one)
    messages = list(responses(samples))
    assert [len(m.completions) for m in messages] == [3, 3, 3, 1]
    assert [c.sample_id for m in messages for c in m.completions] == [s.sample_id for s in samples]
    monkeypatch.setattr(rollout_server, "MESSAGE_BUDGET_BYTES", one // 2)  # one sample over the budget still goes
    assert [len(m.completions) for m in responses(samples)] == [1] * 10


async def _drain_stream(call: Any) -> list[pb.GenerateResponse]:
    return [response async for response in call]


def test_update_weights_by_pull_then_serves_the_new_version(model_dir: Path) -> None:
    async def body() -> tuple[pb.UpdateWeightsResponse, list[sample_pb2.Completion]]:
        publisher = WeightPublisher(bucket_bytes=1 << 16)
        publisher.publish(3, perturbed(model_dir).items())
        weights = await start_server([weight_service(publisher)])
        server, servicer = await serve_rollout(rollout_config(model_dir))
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.RolloutServiceStub(ch)
                pull = pb.PullSource(address=f"127.0.0.1:{weights.port}")
                reply = await stub.UpdateWeights(pb.UpdateWeightsRequest(version=3, pull=pull))
                request = _request(pb.PromptRequest(prompt_id="p", token_ids=[5, 6], n=2))
                completions = [c async for r in stub.Generate(request) for c in r.completions]
            return reply, completions
        finally:
            await server.stop(None)
            await weights.stop(None)
            await servicer.close()

    reply, completions = run(body())
    assert reply.staged_version == 3 and reply.bytes > 0
    assert {c.policy_version for c in completions} == {3}


def test_update_weights_by_broadcast_over_gloo(model_dir: Path) -> None:
    """The trainer (rank 0, a thread here) and the replica (JoinWeightGroup, UpdateWeights) over loopback gloo."""
    new_state = perturbed(model_dir)

    async def body() -> tuple[pb.UpdateWeightsResponse, grpc.StatusCode, int]:
        server, servicer = await serve_rollout(rollout_config(model_dir))
        store = host_store("127.0.0.1", 0, timeout=15)
        publisher = WeightPublisher(bucket_bytes=1 << 16)
        publisher.publish(4, new_state.items())
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                stub = pb_grpc.RolloutServiceStub(ch)
                join = pb.JoinWeightGroupRequest(
                    group_id="g1",
                    master_address="127.0.0.1",
                    master_port=store.port,
                    rank=1,
                    world_size=2,
                    backend=pb.WEIGHT_BACKEND_GLOO,
                    timeout_seconds=15,
                )
                trainer_join = asyncio.to_thread(
                    WeightGroup.create, "g1", "127.0.0.1", store.port, 0, 2, "gloo", 15, store
                )
                trainer, _ = await asyncio.gather(trainer_join, stub.JoinWeightGroup(join))
                broadcast = pb.BroadcastSource(group_id="g1", buckets=[to_proto(p) for p in publisher.plan])
                update = stub.UpdateWeights(pb.UpdateWeightsRequest(version=4, broadcast=broadcast))
                reply, _ = await asyncio.gather(update, asyncio.to_thread(publisher.broadcast, trainer))
                wrong = pb.BroadcastSource(group_id="other", buckets=broadcast.buckets)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.UpdateWeights(pb.UpdateWeightsRequest(version=5, broadcast=wrong))
                trainer.close()
            return reply, refused.value.code(), servicer.engine.policy_version
        finally:
            await server.stop(None)
            await servicer.close()

    reply, refused, serving = run(body())
    assert reply.staged_version == 4 and reply.bytes == sum(t.numel() * 4 for t in new_state.values())
    assert refused == grpc.StatusCode.FAILED_PRECONDITION
    assert serving == 4


def test_joining_an_nccl_group_with_weights_on_the_cpu_is_refused_naming_both(model_dir: Path) -> None:
    async def body() -> grpc.aio.AioRpcError:
        server, servicer = await serve_rollout(rollout_config(model_dir))  # the hf engine, on the CPU
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                join = pb.JoinWeightGroupRequest(
                    group_id="g", master_address="127.0.0.1", master_port=1, rank=1, world_size=2,
                    backend=pb.WEIGHT_BACKEND_NCCL, timeout_seconds=30,
                )  # fmt: skip
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await pb_grpc.RolloutServiceStub(ch).JoinWeightGroup(join, timeout=10)
            return refused.value
        finally:
            await server.stop(None)
            await servicer.close()

    error = run(body())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "backend 'nccl' carries cuda buckets, but these are on cpu" in str(error.details())


# --- vllm and sglang ------------------------------------------------------------------------
