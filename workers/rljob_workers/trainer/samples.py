"""What the controller hands the trainer, the group-relative advantages it computes for it, and the
trainer ranks' metrics it combines.

Plain Python, no torch: the driver imports this, and a driver without torch starts about a
CPU-second sooner, on the same cores the pools are starting on (`benchmarks/overhead`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass


@dataclass
class TrainSample:
    """One scored sample as the trainer needs it; `advantage` is already group-relative."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float


def mean_and_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and population std (divide by n) of `values`; (0, 0) for none."""
    if not values:
        return 0.0, 0.0
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], *, eps: float = 1e-6, scale_by_std: bool = True
) -> list[float]:
    """Group-relative advantages: ``(r - mean(group)) / (std(group) + eps)``, for each sample.

    ``group_ids`` names each sample's group (any order; groups may differ in size, as when some
    samples were dropped). The std is the population std (divide by n, not n - 1): a group of one
    then has advantage 0 rather than NaN, and a group's advantages have unit variance.
    ``scale_by_std=False`` gives the unscaled Dr. GRPO form ``r - mean``. A group whose rewards are
    all equal carries no signal and gets exactly 0, even where float rounding would leave
    ``r - mean`` a hair off zero.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[Hashable, list[float]] = {}
    for group, reward in zip(group_ids, rewards, strict=True):
        members.setdefault(group, []).append(float(reward))
    stats = {group: (*mean_and_std(values), min(values) == max(values)) for group, values in members.items()}
    out = []
    for group, reward in zip(group_ids, rewards, strict=True):
        mean, std, flat = stats[group]
        centred = 0.0 if flat else float(reward) - mean
        out.append(centred / (std + eps) if scale_by_std else centred)
    return out


def combine_rank_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The train step's metrics over all ranks, from each rank's `train_step` result.

    Every rank weights its figures by the whole batch, so they add up; `grad_norm` is the norm
    of the already reduced gradients, the same on every rank, so it is taken once.
    """
    names = dict.fromkeys(name for metrics in per_rank for name in metrics)
    combined = {name: sum(metrics.get(name, 0.0) for metrics in per_rank) for name in names}
    if "grad_norm" in combined:
        combined["grad_norm"] = per_rank[0]["grad_norm"]
    return combined
