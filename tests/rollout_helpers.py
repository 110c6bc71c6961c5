"""Helpers of the engine and rollout-server tests: a reference forward pass, perturbed weights,
an engine that pauses its batches."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import LlamaForCausalLM

from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines.base import (
    Engine,
    FinishedSample,
    PromptInput,
    SamplingConfig,
)
from rljob_workers.engines.hf import HFEngine

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def reference(model_dir: Path, state: dict[str, torch.Tensor] | None = None) -> LlamaForCausalLM:
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def recompute(model: LlamaForCausalLM, sample: FinishedSample, temperature: float) -> torch.Tensor:
    """What the trainer computes: log_softmax(logits / T) at each sampled token, one unpadded forward pass."""
    ids = torch.tensor([[*sample.prompt_token_ids, *sample.token_ids]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(sample.prompt_token_ids) - 1 : -1]
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)


def perturbed(model_dir: Path) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in reference(model_dir).state_dict().items()}


async def collect(engine: Engine, prompts: list[PromptInput], sampling: SamplingConfig) -> list[FinishedSample]:
    return [sample async for sample in engine.generate(prompts, sampling)]


class PausedEngine(HFEngine):
    """Holds every batch at its start until `release` is set, so a test can act while a batch is in flight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = threading.Event()
        self.release = threading.Event()

    def _generate_batch(self, batch: list) -> list[FinishedSample]:
        self.started.set()
        self.release.wait(10)
        return super()._generate_batch(batch)


# --- the hf engine --------------------------------------------------------------------------


def rollout_config(model_dir: Path) -> RolloutWorkerConfig:
    return RolloutWorkerConfig(
        model_path=str(model_dir),
        dtype="auto",
        engine="hf",
        gpus=0,
        tensor_parallel_size=1,
        max_concurrent_prompts=16,
        gpu_memory_utilization=0.5,
        seed=3,
    )
