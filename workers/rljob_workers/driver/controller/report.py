"""What the controller reports: its counts, each step's report, the samples it logs, and the failure that
ends a run."""

from __future__ import annotations

from dataclasses import dataclass, field


class RunFailed(RuntimeError):
    """The run cannot go on; the message says why, naming the sample and function where one failed."""


class NothingToLearn(RunFailed):
    """Dynamic sampling dropped more groups for one step than maxExtraGroups allows: every reward the
    policy earns on the data is the same, so no step can be filled with groups to learn from."""


@dataclass
class Counts:
    """Samples through the pipeline; nothing leaves it uncounted."""

    generated: int = 0
    scored: int = 0
    trained: int = 0
    discarded_stale: int = 0
    excluded_reward_error: int = 0
    lost_replica: int = 0
    reward_retries: int = 0
    filtered: int = 0  # scored samples of groups dynamic sampling dropped (all rewards equal)
    filtered_groups: int = 0  # those groups
    masked_truncated: int = 0  # scored samples cut at maxNewTokens and left out of the loss (maskTruncated)
    episodes: int = 0  # episodes played to their end (done, or truncated by maxTurns or the token budget)
    turns: int = 0  # model turns of those episodes
    episode_restarts: int = 0  # episodes started again from the start (an environment error, a lost replica)
    environment_errors: int = 0  # attempts of episodes an environment error ended
    excluded_environment_error: int = 0  # episodes excluded after environment errors (onError: exclude)
    failed_prompts: int = 0  # prompts set aside (failed.jsonl): too long, or failed by the engine past retries
    failed_samples: int = 0  # samples of prompts the engine failed, excluded from their group (some came)


@dataclass(frozen=True)
class LoggedSample:
    """One sample of a step as the sample logs keep it (spec.logging.samples): what a reader needs to see what
    the policy said and what it earned."""

    prompt_id: str
    prompt: str
    completion: str
    scores: dict[str, float]  # each reward function's
    reward: float  # their weighted sum
    advantage: float
    policy_version: int  # of its first token
    last_policy_version: int  # of its last (the same unless a version came while it was generated)
    truncated: bool  # cut at maxNewTokens
    # An episode's conversation: every message, each model turn with the reward the environment gave it.
    messages: list[dict[str, object]] | None = None
    # An episode's token sequence exactly as trained: the prompt's ids, then each turn as sampled and each
    # observation as encoded once, with the loss mask (1: the model sampled it; 0: an observation's).
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None


@dataclass
class StepReport:
    """What one train step did, for metrics, the display and the tests."""

    step: int
    version: int
    reward_mean: float  # over every scored sample of the step's groups, trained or filtered
    reward_std: float
    staleness_mean: float
    staleness_max: int
    samples: int
    prompt_ids: list[str]
    train_metrics: dict[str, float]
    step_seconds: float
    wait_seconds: float
    elapsed_seconds: float
    counts: Counts
    checkpoint: str | None = None
    # The batch's slowest group, from dispatch to its last score. maxStaleness + 1 steps take at
    # least this plus a train step, or the trainer waits (the reward_pipeline benchmark's latency bound).
    group_latency_max: float = 0.0
    sync_seconds: float = 0.0  # of step_seconds, the weight sync to the rollout pool
    group_reward_means: list[float] = field(default_factory=list)  # each trained group's, as prompt_ids
    # The lowest and highest reward of the step's samples (the reward curve's band stays inside them).
    reward_min: float = 0.0
    reward_max: float = 0.0
    # Groups dynamic sampling dropped since the step before (all rewards equal), and each one's reward.
    filtered_prompt_ids: list[str] = field(default_factory=list)
    filtered_reward_means: list[float] = field(default_factory=list)
    truncated_fraction: float = 0.0  # of the step's scored samples, those cut at maxNewTokens
    # |engine log-prob - trainer log-prob| over the tokens of the samples the trained-from weights generated,
    # before the step's first update: the rollout engine's and the trainer's numerics apart (None: no such token).
    logprob_mismatch_mean: float | None = None
    logprob_mismatch_max: float | None = None
    # Over the same samples as reward_mean: completion tokens, and each reward function's mean score.
    response_length_mean: float = 0.0
    response_length_max: int = 0
    reward_by_function: dict[str, float] = field(default_factory=dict)
    tokens_per_second: float = 0.0  # completion tokens trained per second of step_seconds
    # spec.logging.samples of the step's trained samples, for samples/step-N.jsonl and the trackers (not in
    # metrics.jsonl).
    logged_samples: list[LoggedSample] = field(default_factory=list)
    # spec.environment: turns per episode (mean, max), episode tokens, the share truncated by the turn limit or
    # the budget, tool calls by tool, and since the step before the environment's step latency (p50, p99),
    # its errors by kind and the episodes in flight.
    episodes: dict[str, float] = field(default_factory=dict)


def mismatch_of(metrics: dict[str, float]) -> tuple[float | None, float | None]:
    """The step's engine/trainer log-prob mismatch (mean, max) from the trainer's summed metrics."""
    tokens = metrics.get("logprob_mismatch_tokens", 0.0)
    if not tokens:
        return None, None
    return metrics["logprob_mismatch_sum"] / tokens, metrics["logprob_mismatch_max"]
