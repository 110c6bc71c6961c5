"""`disrm`: a discriminative reward model (transformers sequence classification, one label) with dynamic batching.

The model reads ``prompt + completion`` (truncated from the left to `maxLength` tokens, so the
completion's end is kept) and its single logit is the score. Concurrent requests are collected
up to `batchSize` or `maxWaitMs` and scored in one padded forward pass in a worker thread.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rljob.v1 import sample_pb2
from rljob_api.reward import DisRMReward
from rljob_workers.common.device import resolve_dtype
from rljob_workers.reward.base import RewardConfigError
from rljob_workers.reward.batcher import DynamicBatcher


class DisRMScorer:
    """A sequence-classification reward model behind a dynamic batcher."""

    kind = "disrm"
    manages_deadline = False

    def __init__(self, name: str, config: DisRMReward, *, device: str = "cpu") -> None:
        self.name = name
        self.config = config
        self.device = device
        self.tokenizer, self.model = _load(name, config.model_path, device)
        self.batcher: DynamicBatcher[tuple[str, str], float] = DynamicBatcher(
            self.forward, batch_size=config.batch_size, max_wait_s=config.max_wait_ms / 1000
        )

    @property
    def batch_sizes(self) -> deque[int]:
        return self.batcher.batch_sizes

    async def score_sample(self, sample: sample_pb2.RewardSample) -> float:
        return await self.score_text(sample.prompt, sample.completion)

    async def score_text(self, prompt: str, completion: str) -> float:
        """The model's score of one (prompt, completion), batched with concurrent calls."""
        return await self.batcher.submit((prompt, completion))

    def forward(self, pairs: list[tuple[str, str]]) -> list[float]:
        """One padded forward pass (blocking); also the unbatched reference when given one pair."""
        encoded = self.tokenizer(
            [prompt + completion for prompt, completion in pairs],
            padding=True,
            truncation=True,
            max_length=self.config.max_length,
            return_tensors="pt",
        ).to(self.device)
        with torch.no_grad():
            logits = self.model(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask).logits
        return [float(v) for v in logits[:, 0].float().cpu()]

    async def close(self) -> None:
        await self.batcher.close()


def _load(name: str, path: str, device: str) -> tuple[Any, Any]:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model: Any = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=resolve_dtype("auto", device), local_files_only=True
        )
    except (OSError, ValueError) as exc:
        raise RewardConfigError(f"reward function {name!r}: cannot load the disrm model at {path!r}: {exc}") from exc
    if model.config.num_labels != 1:
        raise RewardConfigError(
            f"reward function {name!r}: the disrm model at {path!r} has {model.config.num_labels} labels; "
            "a reward model has exactly one (num_labels=1)"
        )
    tokenizer.truncation_side = "left"  # keep the completion's end
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:  # the model finds each row's last real token by it
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device).eval()
