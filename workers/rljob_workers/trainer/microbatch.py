"""A micro-batch as the trainer's tensors: ids, attention, and per-position tensors aligned with the
next-token logits (pure: samples in, tensors out)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from rljob_workers.trainer.samples import TrainSample


def collate(samples: Sequence[TrainSample], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """Right-padded prompt+completion ids, and per-position tensors aligned with next-token logits.

    Position t of `mask`/`behaviour` refers to the token at t+1 of `input_ids`, which the
    logits at t predict; only completion tokens are masked in (of an episode, only
    its model turns: `loss_mask`). `advantages` is one per sample, or one
    per position where any sample carries `token_advantages`; `proximal`, where samples carry the trainer's
    log-probs of the step's start; `lag`, each sample's (-1: it spans versions).
    """
    lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s in samples]
    width = max(lengths)
    input_ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    behaviour = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for row, sample in enumerate(samples):
        prompt, completion = len(sample.prompt_token_ids), len(sample.token_ids)
        input_ids[row, : prompt + completion] = torch.tensor(sample.prompt_token_ids + sample.token_ids)
        attention[row, : prompt + completion] = 1
        weights = torch.tensor(sample.loss_mask, dtype=torch.float32) if sample.loss_mask is not None else 1.0
        mask[row, prompt - 1 : prompt - 1 + completion] = weights
        behaviour[row, prompt - 1 : prompt - 1 + completion] = torch.tensor(sample.behaviour_logprobs)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    if any(s.token_advantages is not None for s in samples):
        advantages = _per_token(
            samples, width, [s.token_advantages or [s.advantage] * len(s.token_ids) for s in samples]
        )
    batch = {"input_ids": input_ids, "attention_mask": attention, "mask": mask, "behaviour": behaviour}
    batch["lag"] = torch.tensor([-1 if s.lag is None else s.lag for s in samples])
    if any(s.proximal_logprobs is not None for s in samples):
        batch["proximal"] = _per_token(samples, width, [s.proximal_logprobs or [] for s in samples])
    return {k: v.to(device) for k, v in {**batch, "advantages": advantages}.items()}


def _per_token(samples: Sequence[TrainSample], width: int, values: Sequence[Sequence[float]]) -> Tensor:
    """One value per completion token of each sample, aligned as `collate`'s per-position tensors."""
    out = torch.zeros((len(samples), width - 1), dtype=torch.float32)
    for row, (sample, row_values) in enumerate(zip(samples, values, strict=True)):
        start = len(sample.prompt_token_ids) - 1
        out[row, start : start + len(row_values)] = torch.tensor(list(row_values), dtype=torch.float32)
    return out
