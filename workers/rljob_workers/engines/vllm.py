"""vLLM behind the Engine protocol: a thin adapter over its `AsyncLLM`, on GPUs or on its CPU build.

vllm is imported inside the constructor, so importing this module never imports it.

- Every sample is its own request (its own seed), so samples stream back as each finishes.
- Log-probs: `logprobs_mode="processed_logprobs"` reports log_softmax(logits / temperature) of the
  sampled token after any top-p/top-k cut; rljob's contract is the uncut distribution, so the schema
  refuses a cut with vllm, and this adapter refuses one in a request as well.
- Weights never cross a process as tensors: vLLM's worker processes receive them themselves, one member of
  the job's weight group each (`vllm_worker.WeightReceiver`, called by name through `collective_rpc`),
  and reload them there; the prefix cache is reset before the new version serves, so no KV of the old
  version is reused. `weightUpdate: drain` receives at once and loads at the next moment no request is
  running (`VersionGate`): every sample comes from one version. `inflight` pauses generation in place
  (requests kept), loads, and resumes: a sample then spans versions, which vLLM records per output token
  (`weight_versions`) and which the sample carries as its first and last version.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rljob.v1 import rollout_service_pb2 as pb
from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig, WeightGroupMembership, derive_seed
from rljob_workers.engines.streaming import PerSampleEngine, finish_reason
from rljob_workers.weights.buckets import BucketPlan, to_proto

EXTENSION = "rljob_workers.engines.vllm_worker.WeightReceiver"
# The KV cache of an engine on the CPU, unless VLLM_CPU_KVCACHE_SPACE (GiB) says otherwise: vLLM's own
# default takes most of the machine's memory, which the other pools need.
CPU_KV_CACHE_BYTES = 512 * 1024 * 1024
# The KV block of an engine on the CPU, in tokens: the smallest its attention kernel takes. The prefix cache
# reuses whole blocks only, and vLLM's CPU default of 128 leaves an agent's short turns nothing to reuse (the
# tiny models' whole context is 64 tokens); GPU engines keep vLLM's own (16).
CPU_BLOCK_TOKENS = 32
# Where a pulled version is handed to the workers as a safetensors file: memory, where Linux has it.
HANDOFF_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def engine_args(config: RolloutWorkerConfig) -> dict[str, Any]:
    """AsyncEngineArgs of a replica (a pure function of its config and the environment)."""
    args: dict[str, Any] = {
        "model": config.model_path,
        "dtype": "auto" if config.dtype == "auto" else config.dtype,
        "tensor_parallel_size": config.tensor_parallel_size,
        "pipeline_parallel_size": config.pipeline_parallel_size,
        "data_parallel_size": config.data_parallel_size,
        "seed": config.seed,
        "max_num_seqs": config.max_concurrent_prompts,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": EXTENSION,
        "disable_log_stats": True,
    }
    if config.gpus > 0:
        args["gpu_memory_utilization"] = config.gpu_memory_utilization
    else:
        args["enforce_eager"] = True  # no graph capture on the CPU
        # vLLM 0.32 on a CPU: a prefill split over steps rewinds its seeded sample's generator, which a CPU
        # generator cannot do, and the engine dies ("CPU Generator does not use offset"); every rljob sample
        # is seeded. Unsplit, a step takes whole prompts only (a longer one waits for a step of its own).
        args["enable_chunked_prefill"] = False
        args["block_size"] = CPU_BLOCK_TOKENS
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            args["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    return args


class VLLMEngine(PerSampleEngine):
    """vLLM's AsyncLLM with rljob's sampling, log-prob and version contract."""

    name = "vllm"

    def __init__(self, config: RolloutWorkerConfig) -> None:
        if config.gpus == 0:
            # One engine process that also runs the worker: on the CPU a separate worker process costs a
            # second interpreter and its start for nothing.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        super().__init__(config.model_path)
        self.weight_update = config.weight_update
        self._engine: Any = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args(config)))
        self._seed = config.seed
        self._request_ids = itertools.count()
        self._ranks = config.tensor_parallel_size * config.pipeline_parallel_size * config.data_parallel_size
        self._version = 0  # served now (inflight); the gate's under drain
        # One weight operation in the workers at a time: a version received while the one before is still
        # being loaded at its safe point would otherwise replace the buffers that load reads.
        self._weights = asyncio.Lock()

    # ---- generation -----------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._version if self.weight_update == "inflight" else self._gate.version

    @property
    def weights_device(self) -> str:
        return "cpu"  # where a pulled version is assembled before its workers read it

    def check_sampling(self, sampling: SamplingConfig) -> None:
        if sampling.top_p < 1.0 or sampling.top_k > 0:
            raise ValueError(
                "the vllm engine reports log-probs after the top_p/top_k cut; use top_p 1 and top_k 0, or engine hf"
            )

    async def _one(self, prompt: PromptInput, index: int, sampling: SamplingConfig) -> FinishedSample:
        if self.weight_update == "inflight":
            first, last, completion, cached = await self._generate(prompt, index, sampling)
        else:
            async with self._gate.request() as version:
                _, _, completion, cached = await self._generate(prompt, index, sampling)
            first = last = version
        tokens = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], tokens, strict=True)]
        return FinishedSample(
            prompt_id=prompt.prompt_id,
            index=index,
            prompt_token_ids=prompt.token_ids,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            policy_version=first,
            last_policy_version=last,
            finish_reason=finish_reason(completion.finish_reason),
            text=completion.text,
            cached_prompt_tokens=cached,
        )

    async def _generate(self, prompt: PromptInput, index: int, sampling: SamplingConfig) -> tuple[int, int, Any, int]:
        """One request to its end: (first version, last version, vLLM's completion, its prompt tokens served from
        the prefix cache)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=1.0,
            top_k=0,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            seed=derive_seed(sampling.seed or self._seed, f"{prompt.prompt_id}/{index}"),
            logprobs=0,  # the sampled token's log-prob only
        )
        started = self._version
        request_id = f"{prompt.prompt_id}/{index}#{next(self._request_ids)}"
        final = None
        async for output in self._engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt.token_ids)), params, request_id
        ):
            final = output
        if final is None:
            raise RuntimeError(f"vllm returned nothing for {prompt.prompt_id}/{index}")
        completion = final.outputs[0]
        spans = [_version_of(span.version, started) for span in getattr(completion, "weight_versions", None) or []]
        cached = int(getattr(final, "num_cached_tokens", None) or 0)
        return (spans[0] if spans else started), (spans[-1] if spans else started), completion, cached

    # ---- weights: received in the workers --------------------------------------------------------
    @property
    def weight_ranks(self) -> int:
        return self._ranks

    async def join_weight_group(self, membership: WeightGroupMembership) -> None:
        await self._engine.collective_rpc(
            "rljob_join_group",
            args=(
                membership.group_id,
                membership.master_address,
                membership.master_port,
                membership.first_rank,
                membership.world_size,
                membership.backend,
                membership.timeout_seconds,
            ),
        )

    async def leave_weight_group(self) -> None:
        await self._engine.collective_rpc("rljob_leave_group")

    async def receive_broadcast(self, version: int, plans: Sequence[BucketPlan]) -> int:
        source = pb.BroadcastSource(buckets=[to_proto(plan) for plan in plans]).SerializeToString()
        if self.weight_update == "inflight":
            counters = await self._in_flight(version, "rljob_receive", source, version, True)
        else:
            async with self._weights:
                counters = await self._engine.collective_rpc("rljob_receive", args=(source, version, False))
            self._gate.stage(version, lambda: self._switch(None, "rljob_load_staged"))
        return sum(plan.nbytes for plan in plans) * len(counters)

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """A version this process holds (pulled over the WeightService stream by a replica that joined late),
        handed to the workers as a safetensors file in memory, which each loads."""
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="rljob-weights-", dir=HANDOFF_DIR) as folder:
            path = os.path.join(folder, f"version-{version}.safetensors")
            await asyncio.to_thread(save_file, {n: t.contiguous() for n, t in tensors.items()}, path)
            if self.weight_update == "inflight":
                await self._in_flight(version, "rljob_load_file", path)
            else:
                loaded = asyncio.get_running_loop().create_future()

                async def switch() -> int:
                    try:
                        served = await self._switch(version, "rljob_load_file", path)
                        loaded.set_result(None)
                        return served
                    except BaseException as exc:
                        loaded.set_exception(exc)
                        raise

                self._gate.stage(version, switch)
                await loaded  # the file must outlive the load

    async def worker_counters(self) -> list[dict[str, Any]]:
        """Each worker's receiver counters (bytes and buckets received, tensors loaded, loads)."""
        counters: list[dict[str, Any]] = await self._engine.collective_rpc("rljob_counters")
        return counters

    async def _switch(self, version: int | None, method: str, *args: Any) -> int:
        """Load in every worker (no request running, under drain), then serve what loaded with no old KV:
        `version`, or (None) the version the workers had received, which may be newer than the one staged
        when this switch was scheduled. Returns the version served."""
        async with self._weights:
            counters: list[dict[str, Any]] = await self._engine.collective_rpc(method, args=args)
            loaded = counters[0]["loaded_version"] if version is None else version
            if loaded is None:  # an earlier switch already loaded what was received
                return self._version
            await self._engine.reset_prefix_cache()
            await self._engine.update_weight_version(str(loaded))
            self._version = loaded
            return loaded

    async def _in_flight(self, version: int, method: str, *args: Any) -> list[dict[str, Any]]:
        """Pause with the running requests kept (their KV dropped, recomputed on the new weights), load,
        resume: requests go on with the new version."""
        async with self._weights:
            await self._engine.pause_generation(mode="keep")
            try:
                counters: list[dict[str, Any]] = await self._engine.collective_rpc(method, args=args)
                await self._engine.reset_prefix_cache()
                await self._engine.update_weight_version(str(version))
                self._version = self._gate.version = version  # the gate's too, should the mode change
            finally:
                await self._engine.resume_generation()
        return counters

    async def close(self) -> None:
        self._engine.shutdown()


def _version_of(name: str, initial: int) -> int:
    """A vLLM weight version name as rljob's version; "default" (no update yet) is the one it started with."""
    return int(name) if name.isdigit() else initial
