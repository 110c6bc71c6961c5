"""SGLang behind the Engine protocol: a thin adapter over its in-process `sglang.Engine`.

sglang is imported inside the constructor, so importing this module never imports it.

- Every sample is its own `async_generate` request, so samples stream back as each finishes.
- Log-probs: SGLang reports log_softmax(logits / temperature) of the sampled token before
  top-p/top-k filtering, which is rljob's contract, as long as SGLANG_RETURN_ORIGINAL_LOGPROB
  is unset (it switches SGLang to pre-temperature log-probs); the constructor refuses it.
  Tokens are read from the same `output_token_logprobs` entries, so tokens and log-probs align.
- Seeds: SGLang honours per-request seeds only in its deterministic-inference mode; the replica
  seed goes to `random_seed`.
- Weights: `update_weights_from_tensor` through the tokenizer manager (the Engine's own method
  of that name drives a private event loop and cannot be awaited), with the KV cache flushed.
  `VersionGate` makes the switch wait until no request is in flight.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from typing import Any

import torch

from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig
from rljob_workers.engines.streaming import PerSampleEngine, finish_reason


class SGLangEngine(PerSampleEngine):
    """sglang.Engine with rljob's sampling, log-prob and version contract."""

    name = "sglang"

    def __init__(self, config: RolloutWorkerConfig) -> None:
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in {"1", "true"}:
            raise RuntimeError(
                "unset SGLANG_RETURN_ORIGINAL_LOGPROB: rljob needs log-probs at the sampling temperature"
            )
        import sglang

        super().__init__(config.model_path)
        self._tp_size = config.tensor_parallel_size
        self._engine: Any = sglang.Engine(
            model_path=config.model_path,
            dtype=config.dtype,
            tp_size=config.tensor_parallel_size,
            mem_fraction_static=config.gpu_memory_utilization,
            random_seed=config.seed,
            log_level="error",
        )

    @property
    def weights_device(self) -> str:
        # SGLang's tensor serializer passes CUDA tensors to its scheduler processes by IPC handle.
        return "cuda"

    async def _one(self, prompt: PromptInput, index: int, sampling: SamplingConfig) -> FinishedSample:
        params = {
            "n": 1,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,  # -1 disables it
            "max_new_tokens": sampling.max_new_tokens,
            "stop": list(sampling.stop),
        }
        async with self._gate.request() as version:
            out = await self._engine.async_generate(
                input_ids=list(prompt.token_ids), sampling_params=params, return_logprob=True
            )
        meta = out["meta_info"]
        entries = meta["output_token_logprobs"]  # (logprob, token_id, text) per generated token
        finish = (meta.get("finish_reason") or {}).get("type", "abort")
        return FinishedSample(
            prompt_id=prompt.prompt_id,
            index=index,
            prompt_token_ids=prompt.token_ids,
            token_ids=tuple(int(entry[1]) for entry in entries),
            logprobs=tuple(float(entry[0]) for entry in entries),
            policy_version=version,
            finish_reason=finish_reason(finish),
            text=str(out["text"]),
        )

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        named = [(name, tensor.detach()) for name, tensor in tensors.items()]

        async def load() -> None:
            request = UpdateWeightsFromTensorReqInput(
                serialized_named_tensors=[MultiprocessingSerializer.serialize(named) for _ in range(self._tp_size)],
                load_format=None,
                flush_cache=True,  # cached KV of the old version must not serve the new one
            )
            result = await self._engine.tokenizer_manager.update_weights_from_tensor(request, None)
            success, message = result[:2] if isinstance(result, tuple) else (getattr(result, "success", True), "")
            if not success:
                raise RuntimeError(f"sglang refused the weights of version {version}: {message}")

        self._gate.stage(version, load)

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.shutdown)
