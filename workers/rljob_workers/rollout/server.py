"""RolloutService over an Engine: generation streams, weight updates from the checkpoint engine, drain."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import NoReturn

import grpc
import torch
from grpc_health.v1 import health_pb2

from rljob.v1 import rollout_service_pb2 as pb
from rljob.v1 import rollout_service_pb2_grpc as pb_grpc
from rljob.v1 import sample_pb2
from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.common.batching import MESSAGE_BUDGET_BYTES, ready_batches
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.engines import make_engine
from rljob_workers.engines.base import (
    Engine,
    FinishedSample,
    FinishReason,
    PromptInput,
    ReceivingEngine,
    SamplingConfig,
    WeightGroupMembership,
)
from rljob_workers.weights.buckets import BucketPlan, from_proto
from rljob_workers.weights.group import WeightGroup, bucket_device
from rljob_workers.weights.receiver import pull_weights, receive_broadcast

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["RolloutService"].full_name
_FINISH = {
    FinishReason.STOP: sample_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: sample_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: sample_pb2.FINISH_REASON_ABORT,
}


def parse_prompts(request: pb.GenerateRequest, tokenize: Callable[[str], list[int]]) -> list[PromptInput]:
    """The request's prompts, text tokenised; ValueError names the prompt that is malformed."""
    prompts: list[PromptInput] = []
    seen: set[str] = set()
    for position, prompt in enumerate(request.prompts):
        name = f"prompt {prompt.prompt_id!r}"
        if not prompt.prompt_id:
            raise ValueError(f"prompts[{position}]: prompt_id is empty")
        if prompt.prompt_id in seen:
            raise ValueError(f"{name} appears more than once in the request")
        seen.add(prompt.prompt_id)
        if prompt.n < 1:
            raise ValueError(f"{name}: n must be at least 1, got {prompt.n}")
        if prompt.first_index < 0:
            raise ValueError(f"{name}: first_index must not be negative, got {prompt.first_index}")
        token_ids = list(prompt.token_ids) or (tokenize(prompt.text) if prompt.text else [])
        if not token_ids:
            raise ValueError(f"{name} is empty: set token_ids or a text that tokenises to something")
        prompts.append(PromptInput(prompt.prompt_id, tuple(token_ids), prompt.n, prompt.first_index))
    if not prompts:
        raise ValueError("the request has no prompts")
    return prompts


def parse_sampling(params: sample_pb2.SamplingParams) -> SamplingConfig:
    """SamplingParams with proto3's zero defaults resolved; ValueError names the bad field."""
    if params.temperature < 0:
        raise ValueError(f"sampling.temperature must not be negative, got {params.temperature}")
    if not 0 <= params.top_p <= 1:
        raise ValueError(f"sampling.top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"sampling.top_k must not be negative, got {params.top_k}")
    if params.max_new_tokens < 1:
        raise ValueError(f"sampling.max_new_tokens must be at least 1, got {params.max_new_tokens}")
    return SamplingConfig(
        temperature=params.temperature,
        top_p=params.top_p or 1.0,  # unset (0) means no nucleus cut, as 1 does
        top_k=params.top_k,
        max_new_tokens=params.max_new_tokens,
        stop=tuple(params.stop),
        seed=params.seed,
    )


def to_completion(sample: FinishedSample) -> sample_pb2.Completion:
    return sample_pb2.Completion(
        sample_id=sample.sample_id,
        prompt_id=sample.prompt_id,
        index=sample.index,
        prompt_token_ids=sample.prompt_token_ids,
        token_ids=sample.token_ids,
        logprobs=sample.logprobs,
        policy_version=sample.policy_version,
        last_policy_version=sample.newest_version,
        finish_reason=_FINISH[sample.finish_reason],
        text=sample.text,
        cached_prompt_tokens=sample.cached_prompt_tokens,
    )


def responses(batch: list[FinishedSample]) -> Iterator[pb.GenerateResponse]:
    """The samples that finished together, in as few messages as MESSAGE_BUDGET_BYTES allows."""
    completions: list[sample_pb2.Completion] = []
    size = 0
    for sample in batch:
        completion = to_completion(sample)
        grows = completion.ByteSize()
        if completions and size + grows > MESSAGE_BUDGET_BYTES:
            yield pb.GenerateResponse(completions=completions)
            completions, size = [], 0
        completions.append(completion)
        size += grows
    if completions:
        yield pb.GenerateResponse(completions=completions)


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    """One rollout replica's RolloutService. `on_drain` runs when Drain starts (marks health NOT_SERVING)."""

    def __init__(
        self, engine: Engine, on_drain: Callable[[], Awaitable[None]] | None = None, token: str | None = None
    ) -> None:
        self.engine = engine
        self.on_drain = on_drain
        self.token = token  # the job's: sent when pulling weights from the trainer's WeightService
        self.draining = False
        self.in_flight = 0  # samples asked for and not yet streamed back
        self.max_completions_per_message = 0  # 0: all that finished together (1: one per message)
        self._calls = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._group: WeightGroup | None = None  # the group this process joined (engines without their own)
        self._group_id = ""  # the group joined, by this process or the engine's workers
        self._update_lock = asyncio.Lock()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        if self.draining:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, "this rollout replica is draining; use another one")
        try:
            prompts = parse_prompts(request, self.engine.tokenize)
            sampling = parse_sampling(request.sampling)
        except ValueError as error:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        wanted = sum(p.n for p in prompts)
        self._start_call(wanted)
        try:
            async for batch in ready_batches(self.engine.generate(prompts, sampling), self.max_completions_per_message):
                wanted -= len(batch)
                self.in_flight -= len(batch)
                for response in responses(batch):
                    yield response
        except ValueError as error:  # the engine cannot serve these parameters
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except Exception as error:  # engine failure (out of memory, dead worker): the caller retries elsewhere
            log.exception("generation failed")
            await _abort(context, grpc.StatusCode.INTERNAL, f"generation failed: {error}")
        finally:
            self._end_call(wanted)

    async def GetRolloutInfo(
        self, request: pb.GetRolloutInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRolloutInfoResponse:
        return pb.GetRolloutInfoResponse(
            engine=self.engine.name,
            model=self.engine.model_path,
            policy_version=self.engine.policy_version,
            in_flight=self.in_flight,
            draining=self.draining,
            eos_token_id=self.engine.eos_token_id,
            weight_ranks=self.engine.weight_ranks if isinstance(self.engine, ReceivingEngine) else 1,
            weight_update=getattr(self.engine, "weight_update", "drain"),
        )

    async def Drain(self, request: pb.DrainRequest, context: grpc.aio.ServicerContext) -> pb.DrainResponse:
        """Refuse new work, then wait for the in-flight calls; 0 seconds waits as long as they take."""
        self.draining = True
        if self.on_drain is not None:
            await self.on_drain()
        timeout = request.timeout_seconds if request.timeout_seconds > 0 else None
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("drain: %d samples still in flight after %.1fs", self.in_flight, request.timeout_seconds)
        return pb.DrainResponse(in_flight=self.in_flight)

    async def JoinWeightGroup(
        self, request: pb.JoinWeightGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.JoinWeightGroupResponse:
        try:
            if isinstance(self.engine, ReceivingEngine):  # its own workers join, one member each
                await self.engine.join_weight_group(membership(request))
                self._group_id = request.group_id
            else:  # blocks until every member has joined: off the event loop, so generation goes on
                group = await asyncio.to_thread(self._join, request)
                old, self._group = self._group, group
                self._group_id = group.group_id
                if old is not None:
                    old.close()
        except ValueError as error:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except Exception as error:  # rendezvous timeout, unreachable store: the trainer may retry
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"joining weight group {request.group_id!r}: {error}")
        return pb.JoinWeightGroupResponse(group_id=request.group_id)

    async def UpdateWeights(
        self, request: pb.UpdateWeightsRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateWeightsResponse:
        async with self._update_lock:  # one transfer at a time; generation continues meanwhile
            started = time.perf_counter()
            source, version = request.WhichOneof("source"), request.version
            try:
                if source == "broadcast":
                    plans = await self._broadcast_plans(request.broadcast, context)
                    if isinstance(self.engine, ReceivingEngine):  # into the engine's own workers
                        received = await self.engine.receive_broadcast(version, plans)
                    else:
                        tensors = await asyncio.to_thread(self._receive_broadcast, self._group, plans)
                        received = await self._stage(version, tensors)
                elif source == "pull":
                    version, tensors = await self._pull(request, context)
                    received = await self._stage(version, tensors)
                else:
                    await _abort(
                        context, grpc.StatusCode.INVALID_ARGUMENT, "UpdateWeightsRequest.source: set broadcast or pull"
                    )
            except ValueError as error:  # weights that do not fit the model
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"version {version}: {error}")
        return pb.UpdateWeightsResponse(
            staged_version=version,
            serving_version=self.engine.policy_version,
            bytes=received,
            seconds=time.perf_counter() - started,
        )

    async def close(self) -> None:
        """Leave the weight group and stop the engine."""
        if self._group is not None:
            self._group.close()
        if isinstance(self.engine, ReceivingEngine) and self._group_id:
            await self.engine.leave_weight_group()
        await self.engine.close()

    def _join(self, request: pb.JoinWeightGroupRequest) -> WeightGroup:
        device = self.engine.weights_device
        if device.startswith("cuda"):  # NCCL binds to the calling thread's current device
            torch.cuda.set_device(torch.device(device))
        return WeightGroup.from_request(request, weights_device=device)

    async def _broadcast_plans(self, source: pb.BroadcastSource, context: grpc.aio.ServicerContext) -> list[BucketPlan]:
        """The bucket plan of a broadcast in the group this replica joined; FAILED_PRECONDITION for another."""
        if self._group_id != source.group_id:
            message = f"broadcast group {source.group_id!r} was not joined (joined: {self._group_id or 'none'})"
            await _abort(context, grpc.StatusCode.FAILED_PRECONDITION, message)
        try:
            return [from_proto(bucket) for bucket in source.buckets]
        except ValueError as error:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"broadcast.buckets: {error}")

    async def _pull(
        self, request: pb.UpdateWeightsRequest, context: grpc.aio.ServicerContext
    ) -> tuple[int, dict[str, torch.Tensor]]:
        try:
            return await pull_weights(
                request.pull.address, request.version, self.engine.weights_device, token=self.token
            )
        except grpc.aio.AioRpcError as error:
            await _abort(context, error.code(), f"pull from {request.pull.address}: {error.details()}")

    async def _stage(self, version: int, tensors: dict[str, torch.Tensor]) -> int:
        """Hand tensors this process received to the engine; the bytes handed."""
        await self.engine.stage_weights(version, tensors)
        return _nbytes(tensors)

    def _receive_broadcast(self, group: WeightGroup | None, plans: list[BucketPlan]) -> dict[str, torch.Tensor]:
        assert group is not None  # _broadcast_plans checked it was joined
        device = self.engine.weights_device
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        tensors = receive_broadcast(group, plans, bucket_device(group.backend, device))
        return {name: tensor.to(device) for name, tensor in tensors.items()}  # gloo: staged on the CPU

    def _start_call(self, samples: int) -> None:
        self._calls += 1
        self.in_flight += samples
        self._idle.clear()

    def _end_call(self, unfinished: int) -> None:
        self._calls -= 1
        self.in_flight -= unfinished
        if self._calls == 0:
            self._idle.set()


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def membership(request: pb.JoinWeightGroupRequest) -> WeightGroupMembership:
    """A JoinWeightGroup request as an engine that receives weights itself takes it."""
    backend = {pb.WEIGHT_BACKEND_GLOO: "gloo", pb.WEIGHT_BACKEND_NCCL: "nccl"}.get(request.backend)
    if backend is None:
        raise ValueError(f"JoinWeightGroupRequest.backend: unsupported value {request.backend}")
    return WeightGroupMembership(
        group_id=request.group_id,
        master_address=request.master_address,
        master_port=request.master_port,
        first_rank=request.rank,
        world_size=request.world_size,
        backend=backend,
        timeout_seconds=request.timeout_seconds if request.timeout_seconds > 0 else 300.0,
    )


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # it raises; this tells the type checker


async def serve_rollout(
    config: RolloutWorkerConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    engine: Engine | None = None,
    *,
    token: str | None = None,
) -> tuple[RunningServer, RolloutServicer]:
    """Load the engine (off the event loop) and serve RolloutService with health and reflection; with a
    `token` (the job's) every call must carry it, and weight pulls send it."""
    if engine is None:
        engine = await asyncio.to_thread(make_engine, config)
    servicer = RolloutServicer(engine, token=token)
    running = await start_server(
        [Service(pb_grpc.add_RolloutServiceServicer_to_server, servicer, SERVICE_NAME)],
        host,
        port,
        token=token,
        max_rpcs=config.max_calls,
    )

    async def not_serving() -> None:
        await running.set_serving(False)
        await running.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)

    servicer.on_drain = not_serving
    log.info("rollout replica (%s, %s) serving on %s:%d", engine.name, engine.model_path, host, running.port)
    return running, servicer
