"""What one held-out eval round found, from its scored completions (pure functions, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rljob_workers.trainer.samples import mean_and_std


@dataclass(frozen=True)
class EvalSample:
    """One eval completion as scored: its reward, each function's score, the version that generated it."""

    prompt_index: int  # the row of the eval file
    reward: float
    components: dict[str, float]
    policy_version: int
    truncated: bool = False


@dataclass
class EvalReport:
    """One eval round (spec.data.eval): a line of eval.jsonl, the status's `eval`, the eval gauges."""

    step: int  # train steps completed when it ran (0: before the first update)
    policy_version: int  # the oldest version among its completions (the version the rollout pool served)
    newest_version: int  # the newest: equal to policy_version unless a version came in flight
    prompts: int
    samples: int  # completions scored
    samples_per_prompt: int
    reward_mean: float
    reward_std: float
    rewards: dict[str, float]  # each reward function's mean score
    pass_at_k: dict[int, float]  # pass@k by k
    pass_threshold: float
    truncated_fraction: float
    reward_errors: int = 0  # completions whose reward failed: left out of every number above
    seconds: float = 0.0
    prompt_ids: list[str] = field(default_factory=list)  # as sent to the pools: never a training prompt's id


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from `n` completions of a prompt of which `correct` pass (Chen et al.
    2021, "Evaluating Large Language Models Trained on Code"): 1 - C(n - c, k) / C(n, k), the chance that k
    completions drawn without replacement from the n hold at least one that passes."""
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..n ({n}), got {k}")
    if not 0 <= correct <= n:
        raise ValueError(f"correct must be in 0..n ({n}), got {correct}")
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def reported_ks(n: int) -> list[int]:
    """The k of pass@k a round reports for n completions a prompt: 1, 2, 4, ... below n, and n."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i < n]
    return [*ks, n]


def summarize(
    step: int,
    samples: Sequence[EvalSample],
    prompts: int,
    samples_per_prompt: int,
    pass_threshold: float,
) -> EvalReport:
    """The round's report from its scored completions. pass@k averages over the prompts with at least k scored
    completions (a completion whose reward failed is not one of them)."""
    rewards = [s.reward for s in samples]
    mean, std = mean_and_std(rewards)
    names = sorted({name for s in samples for name in s.components})
    by_function = {n: mean_and_std([s.components[n] for s in samples if n in s.components])[0] for n in names}
    per_prompt: dict[int, list[bool]] = {}
    for s in samples:
        per_prompt.setdefault(s.prompt_index, []).append(s.reward >= pass_threshold)
    pass_k = {}
    for k in reported_ks(samples_per_prompt):
        estimates = [pass_at_k(len(p), sum(p), k) for p in per_prompt.values() if len(p) >= k]
        if estimates:
            pass_k[k] = sum(estimates) / len(estimates)
    versions = [s.policy_version for s in samples]
    return EvalReport(
        step=step,
        policy_version=min(versions, default=0),
        newest_version=max(versions, default=0),
        prompts=prompts,
        samples=len(samples),
        samples_per_prompt=samples_per_prompt,
        reward_mean=mean,
        reward_std=std,
        rewards=by_function,
        pass_at_k=pass_k,
        pass_threshold=pass_threshold,
        truncated_fraction=sum(s.truncated for s in samples) / max(len(samples), 1),
    )
