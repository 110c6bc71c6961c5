"""A train step's report from its groups, its batch and the trainer's metrics: rewards, staleness, completion
lengths, each reward function's mean, the trainer's throughput and the samples kept for the sample logs (pure
functions, no I/O)."""

from __future__ import annotations

from collections import Counter
from itertools import zip_longest

from rljob_workers.driver.controller.batch import StepBatch
from rljob_workers.driver.controller.groups import Group, Sample
from rljob_workers.driver.controller.report import Counts, LoggedSample, StepReport, mismatch_of
from rljob_workers.trainer.samples import mean_and_std


def function_means(samples: list[Sample]) -> dict[str, float]:
    """Each reward function's mean score over the samples that have one, by function name."""
    totals: dict[str, list[float]] = {}
    for sample in samples:
        for name, score in sample.components.items():
            totals.setdefault(name, []).append(score)
    return {name: sum(scores) / len(scores) for name, scores in sorted(totals.items())}


def logged_samples(groups: list[Group], advantages: list[float], count: int) -> list[LoggedSample]:
    """`count` of the groups' scored samples, taken a group at a time in turn (the first sample of each group,
    then the second...) so that as many prompts as there is room for are shown. `advantages` is one per scored
    sample, in the groups' order (StepBatch.advantages)."""
    if count == 0:
        return []
    rows, at = [], 0
    for group in groups:
        scored = group.scored
        own = advantages[at : at + len(scored)]
        rows.append([(group, sample, advantage) for sample, advantage in zip(scored, own, strict=True)])
        at += len(scored)
    in_turn = [item for turn in zip_longest(*rows) for item in turn if item is not None]
    return [_logged(group, sample, advantage) for group, sample, advantage in in_turn[:count]]


def _logged(group: Group, sample: Sample, advantage: float) -> LoggedSample:
    episode = sample.episode
    return LoggedSample(
        prompt_id=group.prompt.prompt_id,
        prompt=group.prompt.text,
        completion=sample.text,
        scores=dict(sample.components),
        reward=float(sample.reward or 0.0),
        advantage=advantage,
        policy_version=sample.policy_version,
        last_policy_version=sample.policy_version if sample.last_version is None else sample.last_version,
        truncated=sample.truncated,
        messages=episode.messages if episode is not None else None,
        prompt_token_ids=list(episode.prompt_ids) if episode is not None else None,
        token_ids=list(episode.ids) if episode is not None else None,
        loss_mask=list(episode.mask) if episode is not None else None,
    )


def episode_metrics(scored: list[Sample], stats: dict[str, float] | None) -> dict[str, float]:
    """What the step's episodes did (none: {}), with the environment's `stats` since the step before."""
    episodes = [sample.episode for sample in scored if sample.episode is not None]
    if not episodes:
        return dict(stats or {})
    turns = [episode.turns for episode in episodes]
    tools = Counter(tool for episode in episodes for tool in episode.tools if tool)
    reported = [e for e in episodes if e.later_cached_tokens is not None and e.later_prompt_tokens]
    cache = {}
    if reported:  # the engine keeps a prefix cache: how much of the later turns' prompts it found there
        hits = sum(e.later_cached_tokens or 0 for e in reported) / sum(e.later_prompt_tokens for e in reported)
        cache = {"prefix_cache_hit_rate": hits}
    return {
        "turns_mean": sum(turns) / len(turns),
        "turns_max": float(max(turns)),
        "episode_tokens_mean": sum(len(e.prompt_ids) + len(e.ids) for e in episodes) / len(episodes),
        "truncated_share": sum(1 for e in episodes if e.truncated) / len(episodes),
        "return_mean": sum(e.episode_return for e in episodes) / len(episodes),
        **{f"tool_calls_{tool}": float(n) for tool, n in sorted(tools.items())},
        **cache,
        **(stats or {}),
    }


def step_report(
    groups: list[Group],
    filtered: list[Group],
    batch: StepBatch,
    metrics: dict[str, float],
    *,
    step: int,
    version: int,
    counts: Counts,
    elapsed_seconds: float,
    checkpoint: str | None,
    times: dict[str, float],
    log_samples: int,
    episode_stats: dict[str, float] | None = None,
) -> StepReport:
    """The report of the step that trained `groups` (`batch`) and used up `filtered` (dynamic sampling dropped
    them), with the trainer's `metrics`; `times` are its step, wait and sync seconds, `log_samples` how many of
    its samples to keep (spec.logging.samples). Its rewards, lengths and truncated share cover every group the
    step used up, dropped ones too: under dynamic sampling the trained groups alone are the policy's middling
    prompts."""
    scored = [sample for group in groups + filtered for sample in group.scored]
    rewards = [float(sample.reward or 0.0) for sample in scored]
    reward_mean, reward_std = mean_and_std(rewards)
    lengths = [len(sample.token_ids) for sample in scored]
    mismatch_mean, mismatch_max = mismatch_of(metrics)
    return StepReport(
        step=step,
        version=version,
        reward_mean=reward_mean,
        reward_std=reward_std,
        reward_min=min(rewards, default=0.0),
        reward_max=max(rewards, default=0.0),
        staleness_mean=sum(batch.lags) / max(len(batch.lags), 1),
        staleness_max=max(batch.lags, default=0),
        samples=len(batch.samples),
        prompt_ids=batch.prompt_ids,
        train_metrics=metrics,
        elapsed_seconds=elapsed_seconds,
        counts=counts,
        checkpoint=checkpoint,
        group_latency_max=max((g.latency or 0.0 for g in groups), default=0.0),
        group_reward_means=[_mean_reward(g) for g in groups],
        filtered_prompt_ids=[g.prompt.prompt_id for g in filtered],
        filtered_reward_means=[_mean_reward(g) for g in filtered],
        truncated_fraction=sum(1 for sample in scored if sample.truncated) / max(len(scored), 1),
        logprob_mismatch_mean=mismatch_mean,
        logprob_mismatch_max=mismatch_max,
        response_length_mean=sum(lengths) / max(len(lengths), 1),
        response_length_max=max(lengths, default=0),
        reward_by_function=function_means(scored),
        tokens_per_second=tokens_per_second(batch, times["step_seconds"]),
        logged_samples=logged_samples(groups, batch.advantages, log_samples),
        step_seconds=times["step_seconds"],
        wait_seconds=times["wait_seconds"],
        sync_seconds=times["sync_seconds"],
        episodes=episode_metrics(scored, episode_stats),
    )


def _mean_reward(group: Group) -> float:
    return mean_and_std([float(s.reward or 0.0) for s in group.scored])[0]


def tokens_per_second(batch: StepBatch, step_seconds: float) -> float:
    """Completion tokens the step trained per second of it."""
    trained = sum(len(sample.token_ids) for sample in batch.samples)
    return trained / step_seconds if step_seconds > 0 else 0.0
