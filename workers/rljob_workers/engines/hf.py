"""The transformers engine: runs any local causal LM on a CPU or one GPU, everywhere, for every test.

Concurrent `generate` calls feed one queue of samples; an engine loop takes up to
`max_batch_sequences` samples that share sampling parameters, left-pads them into one batch and
runs `model.generate` in a worker thread (torch releases the GIL, so the asyncio gRPC server
stays responsive). Weights staged meanwhile are loaded between batches: the safe point.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.common.device import resolve_dtype
from rljob_workers.common.tokenizer import load_tokenizer
from rljob_workers.engines.base import (
    FinishedSample,
    FinishReason,
    PromptInput,
    SamplingConfig,
    cut_at_stop,
    derive_seed,
    sample_slots,
)

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    """One sample to generate, and the queue of the `generate` call waiting for it."""

    prompt: PromptInput
    index: int
    sampling: SamplingConfig
    results: asyncio.Queue[FinishedSample | BaseException] = field(repr=False)


class HFEngine:
    """transformers `generate` behind the Engine protocol, with dynamic batching."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        seed: int = 0,
        max_batch_sequences: int = 64,
        initial_version: int = 0,
    ) -> None:
        self.model_path = model_path
        self.device = device
        self.seed = seed
        self.max_batch_sequences = max_batch_sequences
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # recent batch sizes, for metrics and tests
        self.tokenizer, self._eos_ids = load_tokenizer(model_path)
        # Any: transformers' generate() returns a union mypy cannot narrow, and its `to` is mistyped.
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=resolve_dtype(dtype, device), local_files_only=True
        )
        self.model: Any = model.to(device).eval()
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self._eos_ids[0]
        # Only our GenerationConfig applies: a checkpoint's own defaults (repetition penalty, top-k 50,
        # ...) would change the sampled distribution without the trainer knowing.
        self.model.generation_config = GenerationConfig(eos_token_id=self._eos_ids, pad_token_id=self._pad_id)
        self._version = initial_version
        self._staged: tuple[int, dict[str, torch.Tensor]] | None = None
        self._pending: deque[_Slot] = deque()
        self._running: list[_Slot] = []
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._batches_run = 0
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")

    @classmethod
    def from_config(cls, config: RolloutWorkerConfig) -> HFEngine:
        if config.gpus > 0 and not torch.cuda.is_available():
            raise RuntimeError(f"the rollout replica asks for {config.gpus} GPU(s) but torch sees no CUDA device")
        return cls(
            config.model_path,
            device="cuda" if config.gpus > 0 else "cpu",
            dtype=config.dtype,
            seed=config.seed,
            max_batch_sequences=config.max_concurrent_prompts,
        )

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def eos_token_id(self) -> int:
        return self._eos_ids[0]

    @property
    def weights_device(self) -> str:
        return self.device

    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    async def generate(self, prompts: Sequence[PromptInput], sampling: SamplingConfig) -> AsyncIterator[FinishedSample]:
        for prompt in prompts:
            if not prompt.token_ids:
                raise ValueError(f"prompt {prompt.prompt_id!r} is empty")
        results: asyncio.Queue[FinishedSample | BaseException] = asyncio.Queue()
        slots = [_Slot(p, i, sampling, results) for p, i in sample_slots(prompts)]
        self._submit(slots)
        try:
            for _ in slots:
                item = await results.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # A caller that stops listening (cancelled RPC) frees its queued samples.
            self._pending = deque(s for s in self._pending if s.results is not results)

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        self._check_tensors(tensors)
        self._staged = (version, dict(tensors))
        self._submit([])  # an idle engine switches at once

    async def close(self) -> None:
        stranded = [*self._running, *self._pending]  # nobody waits forever on a closed engine
        self._pending.clear()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        for slot in stranded:
            slot.results.put_nowait(RuntimeError("the rollout engine was closed"))
        await asyncio.to_thread(self._thread.shutdown, wait=True)

    def _submit(self, slots: list[_Slot]) -> None:
        self._pending.extend(slots)
        if self._loop_task is None or self._loop_task.done():
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._engine_loop(), name="hf-engine-loop")
        assert self._wake is not None
        self._wake.set()

    async def _engine_loop(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                if self._staged is not None:  # the safe point: no batch is running
                    await self._switch(loop)
                batch = self._take_batch()
                if not batch:
                    break
                await self._run(batch, loop)

    async def _switch(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._staged is not None
        (version, tensors), self._staged = self._staged, None
        try:
            await loop.run_in_executor(self._thread, self._apply, version, tensors)
        except Exception:  # the replica keeps serving the old version, and says so
            log.exception("loading policy version %d failed; still serving %d", version, self._version)

    async def _run(self, batch: list[_Slot], loop: asyncio.AbstractEventLoop) -> None:
        self.batch_sizes.append(len(batch))
        self._running = batch
        try:
            samples = await loop.run_in_executor(self._thread, self._generate_batch, batch)
        except Exception as error:  # a failed batch fails its callers, not the engine
            groups = _by_prompt(batch)
            if len(groups) > 1:  # one bad prompt must not fail the others it was batched with: each alone
                log.warning("a batch of %d prompts failed (%s); each is generated alone", len(groups), error)
                for group in groups:
                    await self._run(group, loop)
                return
            log.exception("generation of a batch of %d failed", len(batch))
            for slot in batch:
                slot.results.put_nowait(error)
            return
        finally:
            self._running = []
        for slot, sample in zip(batch, samples, strict=True):
            slot.results.put_nowait(sample)

    def _take_batch(self) -> list[_Slot]:
        """The oldest sample and up to max_batch_sequences-1 more with the same sampling parameters."""
        if not self._pending:
            return []
        key = self._pending[0].sampling
        batch: list[_Slot] = []
        rest: deque[_Slot] = deque()
        for slot in self._pending:
            (batch if slot.sampling == key and len(batch) < self.max_batch_sequences else rest).append(slot)
        self._pending = rest
        return batch

    def _check_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Refuse at staging, not at the safe point, so UpdateWeights fails with a useful message."""
        if not tensors:
            raise ValueError("no tensors to stage")
        state = self.model.state_dict()
        for name, tensor in tensors.items():
            if name not in state:
                raise ValueError(f"weight {name!r} is not a parameter of {self.model_path}")
            if tuple(tensor.shape) != tuple(state[name].shape):
                expected = tuple(state[name].shape)
                raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {expected}")

    def _apply(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Runs in the engine thread between batches."""
        state = self.model.state_dict()  # includes tied names; each shares its parameter's storage
        with torch.no_grad():
            for name, tensor in tensors.items():
                state[name].copy_(tensor)
        self._version = version
        log.info("serving policy version %d", version)

    def _generate_batch(self, batch: list[_Slot]) -> list[FinishedSample]:
        """Runs in the engine thread: one `model.generate` over the batch, then per-sample cutting."""
        sampling = batch[0].sampling
        version = self._version
        input_ids, attention_mask = self._left_pad([slot.prompt.token_ids for slot in batch])
        torch.manual_seed(self._batch_seed(batch))
        self._batches_run += 1
        sampled = _SampledLogprobs(sampling.temperature)
        hook = self.model.register_forward_hook(sampled, with_kwargs=True)
        try:
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=_generation_config(sampling)
                )
        finally:
            hook.remove()
        new_tokens = out.sequences[:, input_ids.shape[1] :]
        logprobs = sampled.result(new_tokens)
        return [
            self._finish(slot, new_tokens[row].tolist(), logprobs[row].tolist(), version)
            for row, slot in enumerate(batch)
        ]

    def _batch_seed(self, batch: list[_Slot]) -> int:
        """Reproducible for a seeded request, and different for each batch a request is split over."""
        first = batch[0]
        if first.sampling.seed:
            return derive_seed(first.sampling.seed, f"{first.prompt.prompt_id}/{first.index}")
        return derive_seed(self.seed, str(self._batches_run))

    def _left_pad(self, prompts: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _finish(self, slot: _Slot, tokens: list[int], logprobs: list[float], version: int) -> FinishedSample:
        reason = FinishReason.LENGTH
        eos_at = next((i for i, t in enumerate(tokens) if t in self._eos_ids), None)
        if eos_at is not None:  # keep the EOS token (the policy sampled it), drop the padding after it
            tokens, reason = tokens[: eos_at + 1], FinishReason.STOP
        text = self._decode(tokens)
        if slot.sampling.stop:
            tokens, text, stopped = cut_at_stop(tokens, self._decode, slot.sampling.stop)
            reason = FinishReason.STOP if stopped else reason
        return FinishedSample(
            prompt_id=slot.prompt.prompt_id,
            index=slot.index,
            prompt_token_ids=slot.prompt.token_ids,
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs[: len(tokens)]),
            policy_version=version,
            finish_reason=reason,
            text=text,
        )

    def _decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))


def _generation_config(sampling: SamplingConfig) -> GenerationConfig:
    common = {
        "max_new_tokens": sampling.max_new_tokens,
        "return_dict_in_generate": True,
    }
    if sampling.greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,  # 0 disables it; None would fall back to transformers' default of 50
        **common,
    )


class _SampledLogprobs:
    """log_softmax(raw_logits / T) of each sampled token (greedy: T=1), taken as generation goes.

    A forward hook on the model sees each step's raw logits (before temperature and top-p/top-k),
    keeps that step's log-softmax until the next step's input names the token sampled from it, and
    then only that token's value: one [batch, vocab] row at a time, where `output_logits` kept
    every step's (about 159 GB at 64 sequences x 4,096 tokens x 152k vocabulary).
    """

    def __init__(self, temperature: float) -> None:
        self.scale = temperature if temperature > 0 else 1.0
        self.pending: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        if self.pending is not None:  # this step's input is the token sampled from the last one
            self.steps.append(self.pending.gather(-1, kwargs["input_ids"][:, -1:]).squeeze(-1))
        self.pending = torch.log_softmax(output.logits[:, -1, :].float() / self.scale, dim=-1)

    def result(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[batch, new tokens]: the last step's token is only in the output."""
        if self.pending is not None and len(self.steps) < new_tokens.shape[1]:
            last = len(self.steps)
            self.steps.append(self.pending.gather(-1, new_tokens[:, last : last + 1]).squeeze(-1))
        self.pending = None
        return torch.stack(self.steps, dim=1).cpu()


def _by_prompt(batch: list[_Slot]) -> list[list[_Slot]]:
    """The batch's slots grouped by prompt, in order."""
    groups: dict[str, list[_Slot]] = {}
    for slot in batch:
        groups.setdefault(slot.prompt.prompt_id, []).append(slot)
    return list(groups.values())
