"""What one train step gets from its groups (a pure function, no I/O)."""

from __future__ import annotations

from rljob_workers.driver.controller.groups import Group, staleness
from rljob_workers.trainer.samples import TrainSample, group_advantages


def train_batch(
    groups: list[Group], version: int, scale_by_std: bool
) -> tuple[list[TrainSample], list[float], list[int], list[str]]:
    """The scored samples of `groups` with their GRPO advantages, their rewards, their staleness
    against `version` (the version being trained), and the groups' prompt ids."""
    scored = [(group_id, sample) for group_id, group in enumerate(groups) for sample in group.scored]
    rewards = [float(sample.reward or 0.0) for _, sample in scored]
    advantages = group_advantages(rewards, [group_id for group_id, _ in scored], scale_by_std=scale_by_std)
    samples = [
        TrainSample(s.prompt_token_ids, s.token_ids, s.logprobs, advantage)
        for (_, s), advantage in zip(scored, advantages, strict=True)
    ]
    lags = [staleness(sample.policy_version, version) for _, sample in scored]
    return samples, rewards, lags, [g.prompt.prompt_id for g in groups]
