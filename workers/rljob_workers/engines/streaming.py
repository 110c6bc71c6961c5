"""The shared half of the engines that batch continuously in a process of their own (vllm, sglang).

Each sample is its own request, so samples stream back as each finishes; `VersionGate` gives
those engines their safe point. A subclass only starts its engine, runs one request
(`_one`) and loads weights (`stage_weights`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from rljob_workers.common.tokenizer import load_tokenizer
from rljob_workers.engines.base import (
    FinishedSample,
    FinishReason,
    PromptInput,
    SamplingConfig,
    VersionGate,
    sample_slots,
)

FINISH_REASONS = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def finish_reason(name: object) -> FinishReason:
    """An engine's finish reason by name; anything unknown is an abort."""
    return FINISH_REASONS.get(str(name), FinishReason.ABORT)


class PerSampleEngine:
    """Tokenizer, version gate and per-sample fan-out shared by the vllm and sglang adapters."""

    name = "per-sample"

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.tokenizer: Any
        self.tokenizer, self._eos_ids = load_tokenizer(model_path)
        self._gate = VersionGate()

    @property
    def policy_version(self) -> int:
        return self._gate.version

    @property
    def eos_token_id(self) -> int:
        return self._eos_ids[0]

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def check_sampling(self, sampling: SamplingConfig) -> None:
        """Raise ValueError for sampling parameters this engine cannot serve under rljob's contract."""

    async def generate(self, prompts: Sequence[PromptInput], sampling: SamplingConfig) -> AsyncIterator[FinishedSample]:
        self.check_sampling(sampling)
        tasks = [asyncio.ensure_future(self._one(p, i, sampling)) for p, i in sample_slots(prompts)]
        try:
            for finished in asyncio.as_completed(tasks):
                yield await finished
        finally:
            for task in tasks:
                task.cancel()

    async def _one(self, prompt: PromptInput, index: int, sampling: SamplingConfig) -> FinishedSample:
        raise NotImplementedError
