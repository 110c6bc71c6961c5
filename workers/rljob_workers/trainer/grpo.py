"""The GRPO family as pure tensor functions: log-probs, the clipped surrogate at the token or sequence
level, the loss aggregations, KL estimators and REINFORCE++'s per-token returns (the group advantages,
plain Python for the torch-free controller, are in `samples.py`).

Shapes: ``B`` sequences (completions), ``T`` completion tokens, ``V`` vocabulary.
Per-token tensors are ``[B, T]`` and come with a ``mask`` of the same shape (1 for a real
completion token, 0 for padding); masked positions may hold anything, even ``-inf``,
and never reach a result or a gradient.

Nothing here holds state, reads config or touches a device it was not given, so the
trainer, the tests and the benchmarks share one definition of the loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Aggregation = Literal["token-mean", "sequence-mean", "token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]
RatioLevel = Literal["token", "sequence"]

# exp() of a log-ratio beyond this overflows float32 long before it means anything;
# clamping keeps one wild token from turning a whole batch's loss into inf.
_MAX_LOG_RATIO = 20.0


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is non-zero (``mask`` may weight them).

    An all-masked slice gives 0, not NaN, so an empty batch is harmless.
    """
    m = mask.to(x.dtype)
    # masked_fill, not x * m: a masked -inf (or NaN) times 0 is NaN.
    num = x.masked_fill(m == 0, 0.0) * m
    if dim is None:
        return num.sum() / m.sum().clamp_min(1e-8)
    return num.sum(dim) / m.sum(dim).clamp_min(1e-8)


def aggregate(
    per_token: Tensor, mask: Tensor, aggregation: Aggregation = "token-mean", norm_tokens: float | None = None
) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    ``token-mean`` averages over every real token in the batch (DAPO): long completions
    weigh more. ``sequence-mean`` averages within each completion, then over
    completions (the original GRPO): every completion weighs the same. ``token-sum-norm``
    sums each completion's tokens and divides by the constant ``norm_tokens`` (the generation
    budget), then averages over completions (Dr. GRPO): no completion's tokens are weighted
    by its own length.
    """
    if aggregation == "token-mean":
        return masked_mean(per_token, mask)
    if aggregation == "sequence-mean":
        return masked_mean(per_token, mask, dim=-1).mean()
    if aggregation == "token-sum-norm":
        if not norm_tokens or norm_tokens <= 0:
            raise ValueError(f"token-sum-norm needs norm_tokens > 0, got {norm_tokens}")
        m = mask.to(per_token.dtype)
        return ((per_token.masked_fill(m == 0, 0.0) * m).sum(-1) / norm_tokens).mean()
    raise ValueError(f"aggregation must be token-mean, sequence-mean or token-sum-norm, got {aggregation!r}")


def token_logprobs(logits: Tensor, target_ids: Tensor, temperature: float = 1.0, chunk_rows: int = 4096) -> Tensor:
    """Log-probabilities of ``target_ids`` ``[..., T]`` under ``log_softmax(logits / temperature)``.

    ``logits`` ``[..., T, V]`` must already be aligned with the targets (a causal LM's
    logits at position t predict token t + 1: the caller shifts). The sampler draws from
    ``softmax(logits / temperature)``, so the same temperature here gives the
    behaviour log-probs of what it sampled.

    Memory: only ``chunk_rows`` rows of float32 ``[rows, V]`` exist at a time, whatever
    the dtype of ``logits``; the full float32 ``log_softmax`` of a large vocabulary
    would otherwise be the biggest tensor of the step. Gradients flow to ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_targets = target_ids.reshape(-1, 1)
    out = []
    for start in range(0, flat_logits.shape[0], chunk_rows):
        rows = flat_logits[start : start + chunk_rows].float() / temperature
        picked = rows.gather(-1, flat_targets[start : start + chunk_rows]).squeeze(-1)
        out.append(picked - torch.logsumexp(rows, dim=-1))
    if not out:
        return flat_logits.new_zeros(target_ids.shape, dtype=torch.float32)
    return torch.cat(out).reshape(target_ids.shape)


@torch.no_grad()
def entropy_sum(logits: Tensor, mask: Tensor, temperature: float = 1.0, chunk_rows: int = 4096) -> float:
    """Summed entropy of ``softmax(logits / temperature)`` (the distribution the sampler draws from) over the
    positions ``mask`` keeps; ``logits`` ``[B, T, V]`` aligned with ``mask`` ``[B, T]`` as for `token_logprobs`.
    Only kept rows are computed, ``chunk_rows`` of float32 at a time, without a gradient; nor is ``logits`` copied
    whole (a caller's ``logits[:, :-1]`` is no contiguous tensor: reshaping it would copy all of it)."""
    total = logits.new_zeros((), dtype=torch.float32)
    for row_logits, row_mask in zip(logits, mask, strict=True):
        kept = row_mask.nonzero().squeeze(-1)
        for start in range(0, kept.numel(), chunk_rows):
            rows = row_logits.index_select(0, kept[start : start + chunk_rows]).float() / temperature
            log_p = torch.log_softmax(rows, dim=-1)
            total += torch.special.entr(log_p.exp()).sum()  # -p log p, 0 where p is (a -inf logit)
    return float(total)


def token_entropy(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy ``[B, T]`` of ``softmax(logits / temperature)`` at each position, with its gradient (the entropy
    bonus's; `entropy_sum` measures without one). ``logits`` ``[B, T, V]``; padding positions hold whatever
    their logits give, for the caller's mask to drop."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float, clip_ratio_c: float | None
) -> Tensor:
    """``-min(ρA, clip(ρ) A)`` per token; with dual-clip, at most ``-clip_ratio_c · A`` where ``A < 0``."""
    surrogate = -torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    if clip_ratio_c is not None:
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, -clip_ratio_c * adv), surrogate)
    return surrogate


def policy_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    norm_tokens: float | None = None,
    ratio_level: RatioLevel = "token",
    token_weights: Tensor | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped PPO/GRPO surrogate, ``-min(ρA, clip(ρ, 1 - clip_low, 1 + clip_high) A)``.

    ``ρ = exp(logprobs - behaviour_logprobs)`` is the importance ratio of the policy
    being trained to the one that sampled the tokens, so a stale (off-policy) sample is
    reweighted, and a step can move a token's probability only so far from where the
    sampler had it. ``advantages`` is ``[B]`` (one per completion, as GRPO) or ``[B, T]``.
    ``clip_high > clip_low`` is DAPO's clip-higher.

    ``ratio_level="sequence"`` is GSPO's: one ratio per completion, the length-normalised
    ``s = (π(y|x) / π_old(y|x)) ** (1 / |y|) = exp(mean_t log ρ_t)``, clipped as a whole, so the
    surrogate (the same at each of its tokens) is ``-min(sA, clip(s) A)`` and its gradient ``A ∇s``.

    ``token_weights`` ``[B, T]`` (detached) multiply each token's surrogate before it is aggregated: the
    rollout correction's (see `correction.py`, which also passes the proximal log-probs as
    ``behaviour_logprobs``, the policy the ratio is taken against).

    ``clip_ratio_c`` is dual-clip PPO's (Ye et al. 2020, as verl's clip_ratio_c): where ``A < 0`` the loss is
    at most ``-clip_ratio_c · A``, so a token whose ratio has run far above 1 cannot dominate the step.

    Metrics, detached 0-dim tensors: ``clip_fraction`` (tokens whose gradient the clip
    cut), ``approx_kl`` (k3 estimate of KL(behaviour || policy)) and ``ratio_mean``.
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == logprobs.dim() - 1 else advantages
    valid = mask != 0
    log_ratio = (logprobs - behaviour_logprobs).masked_fill(~valid, 0.0)
    if ratio_level == "sequence":
        log_ratio = masked_mean(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(logprobs)
    elif ratio_level != "token":
        raise ValueError(f"ratio_level must be token or sequence, got {ratio_level!r}")
    log_ratio = log_ratio.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    surrogate = _clipped_surrogate(ratio, adv, clip_low, clip_high, clip_ratio_c)
    if token_weights is not None:
        surrogate = surrogate * token_weights
    loss = aggregate(surrogate, mask, aggregation, norm_tokens)
    with torch.no_grad():
        cut = ((ratio < 1.0 - clip_low) & (adv < 0)) | ((ratio > 1.0 + clip_high) & (adv > 0))
        metrics = {
            "clip_fraction": masked_mean(cut.float(), mask),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return loss, metrics


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate ``[B, T]`` of KL(policy || reference) from tokens the policy sampled; 0 where masked.

    With ``log_r = ref_logprobs - logprobs`` (Schulman's estimators):
    ``k1 = -log_r`` (unbiased, high variance, can be negative),
    ``k2 = log_r ** 2 / 2`` (biased, low variance),
    ``k3 = exp(log_r) - 1 - log_r`` (unbiased, low variance, never negative; GRPO's).
    """
    valid = mask != 0
    log_r = (ref_logprobs - logprobs).masked_fill(~valid, 0.0)
    if kind == "k1":
        per_token = -log_r
    elif kind == "k2":
        per_token = 0.5 * log_r**2
    elif kind == "k3":
        log_r = log_r.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
        per_token = torch.exp(log_r) - 1.0 - log_r
    else:
        raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")
    return per_token.masked_fill(~valid, 0.0)


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kind: KLKind = "k3",
    aggregation: Aggregation = "token-mean",
    norm_tokens: float | None = None,
) -> Tensor:
    """`kl_per_token` reduced to a scalar as the policy loss is (``aggregation``)."""
    return aggregate(kl_per_token(logprobs, ref_logprobs, mask, kind), mask, aggregation, norm_tokens)


def kl_folded_returns(rewards: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """REINFORCE++'s per-token return ``[B, T]``: the outcome reward ``rewards`` ``[B]`` (earned at the last
    token) plus ``-kl_coef * kl`` at every token, summed from each token to the end (γ = 1):
    ``G_t = r - kl_coef * sum_{i >= t} kl_i``. 0 where masked."""
    valid = mask != 0
    penalty = (-kl_coef * kl).masked_fill(~valid, 0.0)
    to_go = penalty.flip(-1).cumsum(-1).flip(-1)
    return (rewards.unsqueeze(-1).to(to_go.dtype) + to_go).masked_fill(~valid, 0.0)


def moments(x: Tensor, mask: Tensor) -> Tensor:
    """``[sum, sum of squares, count]`` of ``x`` over masked-in positions, in float64: what `whiten` needs,
    and what ranks add up (all-reduce) to whiten over a batch split among them."""
    valid = mask != 0
    values = x.double().masked_fill(~valid, 0.0)
    return torch.stack([values.sum(), (values**2).sum(), valid.sum().double()])


def whiten(x: Tensor, mask: Tensor, totals: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """``(x - mean) / (std + eps)`` with the batch's population mean and std over masked-in positions
    (REINFORCE++'s normalisation over the global batch: ``totals`` is `moments` summed over every part of
    it; None: ``x`` is the whole batch). 0 where masked."""
    total, squares, count = (totals if totals is not None else moments(x, mask)).tolist()
    if count == 0:
        return torch.zeros_like(x)
    mean = total / count
    std = max(squares / count - mean * mean, 0.0) ** 0.5
    return ((x - mean) / (std + eps)).masked_fill(mask == 0, 0.0)


def grpo_loss(
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_kind: KLKind = "k3",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "token-mean",
    norm_tokens: float | None = None,
    ratio_level: RatioLevel = "token",
    token_weights: Tensor | None = None,
    clip_ratio_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``policy_loss + kl_coef * kl_penalty`` with the same aggregation for both.

    ``kl_coef == 0`` skips the reference entirely (``ref_logprobs`` may be None and no
    reference model need exist); the metrics then carry no ``kl_ref``.
    """
    loss, metrics = policy_loss(
        logprobs,
        behaviour_logprobs,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        aggregation=aggregation,
        norm_tokens=norm_tokens,
        ratio_level=ratio_level,
        token_weights=token_weights,
        clip_ratio_c=clip_ratio_c,
    )
    metrics["policy_loss"] = loss.detach()
    if kl_coef == 0.0:
        return loss, metrics
    if ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs from the reference model")
    kl = kl_penalty(logprobs, ref_logprobs, mask, kl_kind, aggregation, norm_tokens)
    metrics["kl_ref"] = kl.detach()
    return loss + kl_coef * kl, metrics
