"""What one train step gets from its groups, and which groups carry anything to learn (pure functions, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from rljob_api.algorithm import Algorithm
from rljob_workers.driver.controller.groups import Group, Sample, staleness
from rljob_workers.trainer.samples import TrainSample, advantages, all_equal, overlong_penalty


@dataclass
class StepBatch:
    """A train step's samples and what the step reports of its groups."""

    samples: list[TrainSample]  # what the trainer gets
    rewards: list[float]  # the reward functions' scores of every scored sample of the groups
    lags: list[int]  # each trained sample's staleness against the version trained
    prompt_ids: list[str]
    truncated: int  # scored samples cut at maxNewTokens
    masked: int  # of those, left out of the loss (overlong.maskTruncated)
    advantages: list[float]  # of every scored sample of the groups, in the groups' order


def shaped_rewards(samples: list[Sample], algorithm: Algorithm, max_new_tokens: int) -> list[float]:
    """The rewards advantages are computed from: each score, less DAPO's overlong penalty where it applies."""
    overlong = algorithm.overlong
    rewards = [float(sample.reward or 0.0) for sample in samples]
    if overlong.penalty == 0.0:
        return rewards
    return [
        reward + overlong_penalty(len(sample.token_ids), max_new_tokens, overlong.buffer_tokens, overlong.penalty)
        for reward, sample in zip(rewards, samples, strict=True)
    ]


def informative(group: Group, algorithm: Algorithm, max_new_tokens: int) -> bool:
    """Whether a complete group has any advantage to learn from: its shaped rewards are not all equal (DAPO's
    dynamic sampling keeps only these). What counts is the reward the advantages see, overlong penalty and all."""
    return not all_equal(shaped_rewards(group.scored, algorithm, max_new_tokens))


def lag(sample: Sample, version: int) -> int | None:
    """How many versions before `version` (the one trained from) generated every token of `sample`; None when
    a version came in flight while it was generated (its tokens are of two)."""
    if (sample.last_version or sample.policy_version) != sample.policy_version:
        return None
    return staleness(sample.policy_version, version)


def train_batch(groups: list[Group], version: int, algorithm: Algorithm, max_new_tokens: int) -> StepBatch:
    """The scored samples of `groups` with their advantages (algorithm.advantageEstimator), their staleness
    against `version` (the version being trained), and the groups' prompt ids. Under overlong.maskTruncated a
    truncated sample counts in its group's advantages but is left out of the samples trained."""
    scored = [(group_id, sample) for group_id, group in enumerate(groups) for sample in group.scored]
    shaped = [reward for group in groups for reward in shaped_rewards(group.scored, algorithm, max_new_tokens)]
    found = advantages(
        shaped,
        [group_id for group_id, _ in scored],
        algorithm.advantage_estimator,
        scale_by_std=algorithm.scale_rewards_by_std,
    )
    mask_truncated = algorithm.overlong.mask_truncated
    kept = [(s, a) for (_, s), a in zip(scored, found, strict=True) if not (mask_truncated and s.truncated)]
    truncated = sum(1 for _, sample in scored if sample.truncated)
    return StepBatch(
        samples=[
            TrainSample(
                s.prompt_token_ids, s.token_ids, s.logprobs, advantage, lag=lag(s, version), loss_mask=s.loss_mask
            )
            for s, advantage in kept
        ],
        rewards=[float(sample.reward or 0.0) for _, sample in scored],
        lags=[staleness(sample.policy_version, version) for sample, _ in kept],
        prompt_ids=[g.prompt.prompt_id for g in groups],
        truncated=truncated,
        masked=len(scored) - len(kept),
        advantages=found,
    )


def nothing_to_learn(filtered: list[Group], step: int, algorithm: Algorithm) -> str:
    """Why step `step` ends the run: dynamic sampling dropped more than maxExtraGroups groups (`filtered`)."""
    rewards = sorted({float(s.reward or 0.0) for group in filtered for s in group.scored})
    return (
        f"spec.algorithm.dynamicSampling.maxExtraGroups: step {step} dropped {len(filtered)} prompt "
        f"groups whose rewards were all equal (all {' or '.join(f'{r:g}' for r in rewards[:4])}), more than "
        f"maxExtraGroups {algorithm.dynamic_sampling.max_extra_groups}, "
        f"before it found promptsPerStep {algorithm.prompts_per_step} groups to learn from: the data has "
        "nothing left to teach this policy"
    )
