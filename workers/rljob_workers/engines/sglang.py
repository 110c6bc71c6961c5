"""SGLang behind the Engine protocol: a thin adapter over its in-process `sglang.Engine`. NOT RUN HERE:
SGLang has no CPU build (its kernels are CUDA only) and the GPU machine has no registry to install it
from, so this adapter is tested only against a stand-in of the SGLang calls it makes
(tests/test_engines.py); nothing claims it works.

sglang is imported inside the constructor, so importing this module never imports it.

- Every sample is its own `async_generate` request, so samples stream back as each finishes.
- Log-probs: SGLang reports log_softmax(logits / temperature) of the sampled token before
  top-p/top-k filtering, which is rljob's contract, as long as SGLANG_RETURN_ORIGINAL_LOGPROB
  is unset (it switches SGLang to pre-temperature log-probs); the constructor refuses it.
  Tokens are read from the same `output_token_logprobs` entries, so tokens and log-probs align.
- Seeds: SGLang honours per-request seeds only in its deterministic-inference mode; the replica
  seed goes to `random_seed`.
- Weights: the rollout server receives each version over the weight group onto this GPU (NCCL), and
  hands it to SGLang's scheduler processes by CUDA IPC handle (`update_weights_from_tensor`, one
  serialized handle list per tensor-parallel rank), the KV cache flushed. SGLang's own distributed update
  takes one broadcast per tensor, where rljob's trainer sends flat buckets. `weightUpdate: drain` waits
  for no request in flight (`VersionGate`); `inflight` pauses generation in place
  (`pause_generation`), loads, and continues (`continue_generation`); SGLang records no per-token version,
  so an in-flight sample is stamped with the versions current when it started and when it ended.
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

    def __init__(self, config: RolloutWorkerConfig, engine: Any = None) -> None:
        """`engine`: an sglang.Engine made elsewhere (a stand-in of one, in the contract tests)."""
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in {"1", "true"}:
            raise RuntimeError(
                "unset SGLANG_RETURN_ORIGINAL_LOGPROB: rljob needs log-probs at the sampling temperature"
            )
        super().__init__(config.model_path)
        self.weight_update = config.weight_update
        self._tp_size = config.tensor_parallel_size
        self._version = 0  # served now (inflight); the gate's under drain
        if engine is None:
            import sglang

            engine = sglang.Engine(
                model_path=config.model_path,
                dtype=config.dtype,
                tp_size=config.tensor_parallel_size,
                dp_size=config.data_parallel_size,
                mem_fraction_static=config.gpu_memory_utilization,
                random_seed=config.seed,
                log_level="error",
            )
        self._engine: Any = engine

    @property
    def policy_version(self) -> int:
        return self._version if self.weight_update == "inflight" else self._gate.version

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
        if self.weight_update == "inflight":
            first = self._version
            out = await self._generate(prompt, params)
            last = self._version
        else:
            async with self._gate.request() as first:
                out = await self._generate(prompt, params)
            last = first
        meta = out["meta_info"]
        entries = meta["output_token_logprobs"]  # (logprob, token_id, text) per generated token
        finish = (meta.get("finish_reason") or {}).get("type", "abort")
        return FinishedSample(
            prompt_id=prompt.prompt_id,
            index=index,
            prompt_token_ids=prompt.token_ids,
            token_ids=tuple(int(entry[1]) for entry in entries),
            logprobs=tuple(float(entry[0]) for entry in entries),
            policy_version=first,
            last_policy_version=last,
            finish_reason=finish_reason(finish),
            text=str(out["text"]),
        )

    async def _generate(self, prompt: PromptInput, params: dict[str, Any]) -> Any:
        return await self._engine.async_generate(
            input_ids=list(prompt.token_ids), sampling_params=params, return_logprob=True
        )

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        named = [(name, tensor.detach()) for name, tensor in tensors.items()]
        if self.weight_update == "inflight":
            manager = self._engine.tokenizer_manager
            await manager.pause_generation()
            try:
                await self._load(version, named)
            finally:
                await manager.continue_generation()
            return
        self._gate.stage(version, lambda: self._load(version, named))

    async def _load(self, version: int, named: list[tuple[str, torch.Tensor]]) -> None:
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
        from sglang.srt.utils import MultiprocessingSerializer

        request = UpdateWeightsFromTensorReqInput(
            serialized_named_tensors=[MultiprocessingSerializer.serialize(named) for _ in range(self._tp_size)],
            load_format=None,
            flush_cache=True,  # cached KV of the old version must not serve the new one
        )
        result = await self._engine.tokenizer_manager.update_weights_from_tensor(request, None)
        success, message = result[:2] if isinstance(result, tuple) else (getattr(result, "success", True), "")
        if not success:
            raise RuntimeError(f"sglang refused the weights of version {version}: {message}")
        self._version = version

    async def close(self) -> None:
        await asyncio.to_thread(self._engine.shutdown)
