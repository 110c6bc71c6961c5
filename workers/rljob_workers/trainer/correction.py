"""The rollout correction: the engine that sampled a token and the trainer disagree a little on its probability
even at the same weights (other kernels, precision, batching), and a stale sample was sampled by older weights
still. Pure tensor functions, shapes as in `grpo.py` (``[B, T]`` per token, with a mask).

With a correction, the clipped surrogate's ratio is taken against the trainer's own log-probs of the batch at
the step's start (the proximal policy, before any update of the step), and each token's loss is weighted by
``r = π_proximal(y_t) / π_sampler(y_t)`` (detached):

- ``tis``: truncated importance sampling, ``min(r, high)`` (Yao et al. 2025, "Your Efficient RL Framework
  Secretly Brings You Off-Policy RL Training");
- ``icepop``: ``r`` where ``low <= r <= high``, 0 elsewhere: a token the two disagree on too much is left out
  (Ling Team 2025, IcePop, in "Every Step Evolves: Scaling Reinforcement Learning for Trillion-Scale
  Thinking Model").

The mismatch itself, ``|log π_sampler - log π_trainer|`` over tokens both computed at the same weights, is what
`mismatch` measures each step.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Correction = Literal["none", "tis", "icepop"]
# exp() of a log-ratio beyond this overflows float32 long before it means anything (as in grpo.py).
_MAX_LOG_RATIO = 20.0


def correction_weights(
    proximal: Tensor, behaviour: Tensor, mask: Tensor, mode: Correction, low: float, high: float
) -> Tensor:
    """Each token's weight ``[B, T]`` under `mode` (see the module); 0 where masked, 1 everywhere for none."""
    valid = mask != 0
    if mode == "none":
        return valid.to(proximal.dtype)
    log_r = (proximal - behaviour).masked_fill(~valid, 0.0).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_r)
    if mode == "tis":
        weights = ratio.clamp(max=high)
    elif mode == "icepop":
        weights = ratio * ((ratio >= low) & (ratio <= high)).to(ratio.dtype)
    else:
        raise ValueError(f"rollout correction must be none, tis or icepop, got {mode!r}")
    return weights.masked_fill(~valid, 0.0).detach()


def mismatch(trainer: Tensor, behaviour: Tensor, mask: Tensor, rows: Tensor) -> tuple[float, float, int]:
    """(sum, max, count) of ``|behaviour - trainer|`` over the masked-in tokens of the selected `rows` ``[B]``
    (the samples the trainer's weights generated: only there is the gap the engine's, not the policy's
    change)."""
    selected = (mask != 0) & rows.bool().unsqueeze(-1)
    gaps = (behaviour - trainer.detach()).abs().masked_fill(~selected, 0.0)
    count = int(selected.sum())
    return (float(gaps.sum()), float(gaps.max()) if count else 0.0, count)
