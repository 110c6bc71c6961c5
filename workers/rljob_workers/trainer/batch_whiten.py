"""REINFORCE++'s advantages on the trainer: each sample's per-token return (its reward, or its reward less its
group's mean for the baseline variant, less klCoef × the KL to come from each token on with klIn reward),
whitened over the tokens of the whole batch, every rank's share of it (an all-reduce of the moments)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from rljob_workers.trainer.grpo import KLKind, kl_folded_returns, kl_per_token, moments, whiten
from rljob_workers.trainer.samples import TrainSample


@torch.no_grad()
def whitened_token_advantages(
    samples: Sequence[TrainSample],
    *,
    collate: Callable[[list[TrainSample]], dict[str, Tensor]],
    micro_size: int,
    kl_coef: float,
    kl_estimator: KLKind,
    reference_logprobs: Callable[[dict[str, Tensor]], Tensor],
    world_size: int,
) -> tuple[list[TrainSample], float]:
    """Each sample with its `token_advantages`; and the KL summed over the batch's tokens (0 without klCoef)."""
    parts = [list(samples[i : i + micro_size]) for i in range(0, len(samples), micro_size)]
    returns, kl_sum = [], 0.0
    for part in parts:
        batch = collate(part)
        kl = torch.zeros_like(batch["mask"])
        if kl_coef > 0:
            # π_old is the sampler's (behaviour) policy: the KL of what was generated to the reference
            kl = kl_per_token(batch["behaviour"], reference_logprobs(batch), batch["mask"], kl_estimator)
            kl_sum += float(kl.sum())
        returns.append((kl_folded_returns(batch["advantages"], kl, batch["mask"], kl_coef), batch["mask"]))
    device = returns[0][1].device if returns else None
    totals = sum((moments(r, m) for r, m in returns), torch.zeros(3, dtype=torch.float64, device=device))
    if world_size > 1:
        torch.distributed.all_reduce(totals)
    out = []
    for part, (part_returns, mask) in zip(parts, returns, strict=True):
        advantages = whiten(part_returns, mask, totals)
        for row, sample in enumerate(part):
            start = len(sample.prompt_token_ids) - 1
            values = advantages[row, start : start + len(sample.token_ids)].tolist()
            out.append(replace(sample, token_advantages=values))
    return out, kl_sum
