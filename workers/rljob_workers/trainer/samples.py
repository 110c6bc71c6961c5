"""What the controller hands the trainer, the advantages it computes for it (group-relative,
leave-one-out; DAPO's overlong penalty on the rewards first), and the trainer ranks' metrics it combines.

Plain Python, no torch: the driver imports this, and importing torch would cost the driver CPU time
on the same cores the pools are starting on (`benchmarks/overhead`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass


@dataclass
class TrainSample:
    """One scored sample as the trainer needs it: `advantage` is already relative to its group; under
    advantageEstimator batch-normalized it is the (shaped) reward, which the trainer turns into
    `token_advantages`, one per completion token, normalised over the whole batch (REINFORCE++)."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    token_advantages: list[float] | None = None
    # How many versions before the one this step trains from generated every token (0: those very weights;
    # None: it spans versions, updated in flight). At the generating weights the engine's log-probs and the
    # trainer's differ only by how each computes them: the mismatch the step reports.
    lag: int | None = 0
    # The trainer's log-probs of its tokens at the step's start (the rollout correction's proximal policy),
    # where a step of several mini-batches needs them before its first update.
    proximal_logprobs: list[float] | None = None
    # One weight per token of `token_ids` (an episode's: 1 for the model's turns, 0 for its observations, which
    # the model did not sample and nothing is learned from); None: every token is the model's.
    loss_mask: list[int] | None = None


# Advantages whitened over the batch's tokens by the trainer (REINFORCE++ and its group-mean baseline).
WHITENED_ESTIMATORS = ("batch-normalized", "group-mean-batch-normalized")
# Metrics every rank reports alike (the reduced gradients' norm, the schedule's learning rate): taken once.
SAME_ON_EVERY_RANK = ("grad_norm", "learning_rate")


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


def leave_one_out_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable]) -> list[float]:
    """RLOO's advantages: ``r_i - (sum of the group's other rewards) / (n - 1)``, for each sample.

    The baseline of each sample leaves the sample itself out, so it is unbiased. A group of one
    has no other reward to compare with and gets 0; an all-equal group gets exactly 0.
    """
    if len(rewards) != len(group_ids):
        raise ValueError(f"{len(rewards)} rewards but {len(group_ids)} group ids")
    members: dict[Hashable, list[float]] = {}
    for group, reward in zip(group_ids, rewards, strict=True):
        members.setdefault(group, []).append(float(reward))
    totals = {group: (math.fsum(values), len(values), min(values) == max(values)) for group, values in members.items()}
    out = []
    for group, reward in zip(group_ids, rewards, strict=True):
        total, n, flat = totals[group]
        out.append(0.0 if n == 1 or flat else float(reward) - (total - float(reward)) / (n - 1))
    return out


def advantages(
    rewards: Sequence[float], group_ids: Sequence[Hashable], estimator: str, *, scale_by_std: bool = True
) -> list[float]:
    """Each sample's advantage under `estimator` (spec.algorithm.advantageEstimator). For batch-normalized
    (REINFORCE++) it is the reward itself: the trainer folds in the KL and normalises over the batch; for
    group-mean-batch-normalized (REINFORCE++-baseline, verl's reinforce_plus_plus_baseline) the reward less its
    group's mean, which the trainer normalises over the batch."""
    if estimator == "group-relative":
        return group_advantages(rewards, group_ids, scale_by_std=scale_by_std)
    if estimator == "leave-one-out":
        return leave_one_out_advantages(rewards, group_ids)
    if estimator == "batch-normalized":
        return [float(r) for r in rewards]
    if estimator == "group-mean-batch-normalized":  # the trainer whitens r - mean(group) over the batch
        return group_advantages(rewards, group_ids, scale_by_std=False)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def overlong_penalty(length: int, max_new_tokens: int, buffer_tokens: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (its eq. 13) times `penalty`: 0 up to ``L = max_new_tokens -
    buffer_tokens`` tokens, then ``(L - length) / buffer_tokens`` (linear, down to -1 at the limit), -1 past it.
    Added to the reward of a completion of `length` tokens."""
    free = max_new_tokens - buffer_tokens
    if length <= free:
        return 0.0
    if length > max_new_tokens:
        return -penalty
    return penalty * (free - length) / buffer_tokens


def all_equal(values: Sequence[float]) -> bool:
    """True for rewards that carry no group-relative signal: none, one, or all the same."""
    return not values or min(values) == max(values)


def combine_rank_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The train step's metrics over all ranks, from each rank's `train_step` result.

    Every rank weights its figures by the whole batch, so they add up; `grad_norm` is the norm
    of the already reduced gradients, the same on every rank, so it is taken once; a `*_max` is the
    largest rank's.
    """
    names = dict.fromkeys(name for metrics in per_rank for name in metrics)
    combined = {name: sum(metrics.get(name, 0.0) for metrics in per_rank) for name in names}
    for once in SAME_ON_EVERY_RANK:  # the same on every rank
        if once in combined:
            combined[once] = per_rank[0][once]
    for name in names:  # a largest value is the largest of the ranks'
        if name.endswith("_max"):
            combined[name] = max(metrics.get(name, 0.0) for metrics in per_rank)
    return combined
