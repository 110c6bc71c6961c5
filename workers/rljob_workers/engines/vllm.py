"""vLLM behind the Engine protocol: a thin adapter over its in-process `AsyncLLMEngine`.

vllm is imported inside the constructor, so importing this module never imports it.

- Every sample is its own request (its own seed), so samples stream back as each finishes.
- Log-probs: the engine runs with `logprobs_mode="processed_logprobs"` (vLLM >= 0.10.2), which
  reports log_softmax(logits / temperature) of the sampled token *after* top-p/top-k truncation.
  That equals rljob's contract only without truncation, so requests with top_p < 1 or top_k > 0
  are refused (the hf engine serves them).
- Weights: `collective_rpc` runs `model.load_weights` in every worker (tensor-parallel ranks
  shard the full tensors themselves), then the prefix cache is reset: cached KV of the old
  version must not leak into samples stamped with the new one. `VersionGate` makes the switch
  wait until no request is in flight, so each sample comes from exactly one version.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch

from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig, derive_seed
from rljob_workers.engines.streaming import PerSampleEngine, finish_reason


def _load_weights_in_worker(worker: Any, named: list[tuple[str, torch.Tensor]]) -> None:
    """Runs inside each vLLM worker process (sent by collective_rpc, so it must be module-level)."""
    model = worker.model_runner.model
    model.load_weights(weights=[(name, tensor.to(worker.device)) for name, tensor in named])


class VLLMEngine(PerSampleEngine):
    """vLLM's AsyncLLMEngine with rljob's sampling, log-prob and version contract."""

    name = "vllm"

    def __init__(self, config: RolloutWorkerConfig) -> None:
        from vllm import AsyncEngineArgs, AsyncLLMEngine

        super().__init__(config.model_path)
        args = AsyncEngineArgs(
            model=config.model_path,
            dtype="auto" if config.dtype == "auto" else config.dtype,
            tensor_parallel_size=config.tensor_parallel_size,
            gpu_memory_utilization=config.gpu_memory_utilization,
            seed=config.seed,
            logprobs_mode="processed_logprobs",
        )
        self._engine = AsyncLLMEngine.from_engine_args(args)
        self._seed = config.seed
        self._request_ids = itertools.count()

    @property
    def weights_device(self) -> str:
        # Weights cross into vLLM's worker processes by serialization, which takes CPU tensors.
        return "cpu"

    def check_sampling(self, sampling: SamplingConfig) -> None:
        if sampling.top_p < 1.0 or sampling.top_k > 0:
            raise ValueError(
                "the vllm engine reports truncated log-probs under top_p/top_k; use top_p 1 and top_k 0, or engine hf"
            )

    async def _one(self, prompt: PromptInput, index: int, sampling: SamplingConfig) -> FinishedSample:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=1.0,
            top_k=-1,  # disabled; -1 is accepted by every vLLM release (0 only by newer ones)
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            seed=derive_seed(sampling.seed or self._seed, f"{prompt.prompt_id}/{index}"),
            logprobs=0,  # the sampled token's log-prob only
        )
        inputs = TokensPrompt(prompt_token_ids=list(prompt.token_ids))
        request_id = f"{prompt.prompt_id}/{index}#{next(self._request_ids)}"
        final = None
        async with self._gate.request() as version:
            async for output in self._engine.generate(inputs, params, request_id):
                final = output
        if final is None:
            raise RuntimeError(f"vllm returned nothing for {prompt.prompt_id}/{index}")
        completion = final.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs or [], tokens, strict=True)]
        return FinishedSample(
            prompt_id=prompt.prompt_id,
            index=index,
            prompt_token_ids=prompt.token_ids,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            policy_version=version,
            finish_reason=finish_reason(completion.finish_reason),
            text=completion.text,
        )

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        named = [(name, tensor.detach().cpu()) for name, tensor in tensors.items()]

        async def load() -> None:
            await self._engine.collective_rpc(_load_weights_in_worker, args=(named,))
            await self._engine.reset_prefix_cache()

        self._gate.stage(version, load)

    async def close(self) -> None:
        self._engine.shutdown()
