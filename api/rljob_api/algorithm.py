"""spec.algorithm: the RL algorithm, a named preset and the composable settings it sets.

Every setting a preset decides is optional here; `resolve_algorithm` fills what the job leaves unset
from its preset (`presets.SETTINGS`), and the workers receive only the resolved `Algorithm`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .base import IMMUTABLE, FieldRuleError, Model, cel, cel_rules
from .presets import (
    PRESET_PAPER,
    PRESETS,
    SETTINGS,
    AdvantageEstimator,
    KLEstimator,
    KLIn,
    LossAggregation,
    Preset,
    RatioLevel,
    preset_default,
)

PER_PRESET = "Unset: as the preset sets it."


def _preset_description() -> str:
    names = ", ".join(f"{preset} ({PRESET_PAPER[preset]})" for preset in PRESETS)
    return f"Preset of the settings left unset: {names}."


class DynamicSamplingSpec(Model):
    """DAPO's dynamic sampling: a prompt group whose rewards are all equal has no advantage to learn from;
    it is dropped (counted, its prompt done) and another group is generated in its place, so that every
    step trains promptsPerStep informative groups."""

    enabled: bool | None = Field(None, description="Drop groups whose rewards are all equal. " + PER_PRESET)
    max_extra_groups: int | None = Field(
        None,
        description=(
            "Most groups one step may drop, and so generate beyond promptsPerStep; past it the run fails: "
            "the data has nothing left to learn. " + PER_PRESET
        ),
        ge=0,
    )


class OverlongSpec(Model):
    """DAPO's overlong reward shaping: completions that run into the last bufferTokens before
    rollout.sampling.maxNewTokens lose reward linearly, up to `penalty` at the limit."""

    buffer_tokens: int | None = Field(
        None, description="Tokens before maxNewTokens where the penalty grows. " + PER_PRESET, ge=1
    )
    penalty: float | None = Field(
        None, description="Reward lost by a completion of maxNewTokens tokens; 0 shapes nothing. " + PER_PRESET, ge=0
    )
    mask_truncated: bool | None = Field(
        None,
        description=(
            "Leave completions cut at maxNewTokens out of the loss (they still count in their group's "
            "advantages). " + PER_PRESET
        ),
    )


class RolloutCorrectionSpec(Model):
    """The rollout correction: how the loss accounts for the sampler (the rollout engine, perhaps an older
    version) and the trainer disagreeing on a token's probability, r = π_trainer / π_sampler per token, the
    trainer's taken at the step's start. The clipped ratio is then taken against the trainer's own
    log-probs, and each token's loss weighted: tis by min(r, high) (truncated importance sampling, Yao et
    al. 2025); icepop by r where low ≤ r ≤ high, 0 elsewhere (IcePop, Ling Team 2025)."""

    mode: Literal["none", "tis", "icepop"] = Field(
        "none", description="none: the ratio against the sampler's log-probs, as they came; tis or icepop."
    )
    low: float = Field(0.5, description="icepop: the least r a token keeps its loss at.", gt=0, le=1)
    high: float = Field(2.0, description="tis: the cap of r; icepop: the most r a token keeps its loss at.", ge=1)


class LearningRateSchedule(Model):
    """The learning rate over the run, per optimizer step (a train step makes miniBatches × updateEpochs of them),
    as transformers' schedulers define it (TRL's lr_scheduler_type, warmup_steps): a linear warmup from 0 over
    warmupSteps, then constant, a linear decay to 0, or a cosine decay to minRatio × learningRate (verl's
    warmup_style cosine and min_lr_ratio) at the run's last optimizer step."""

    kind: Literal["constant", "linear", "cosine"] = Field("constant", description="constant, linear or cosine.")
    warmup_steps: int = Field(0, description="Optimizer steps of linear warmup from 0 (verl's lr_warmup_steps).", ge=0)
    min_ratio: float = Field(
        0.0, description="cosine: the learning rate at the end, as a fraction of learningRate.", ge=0, le=1
    )

    @model_validator(mode="after")
    def _min_ratio_is_cosines(self) -> LearningRateSchedule:
        if self.min_ratio and self.kind != "cosine":
            raise FieldRuleError("minRatio", f"applies to kind cosine only, not {self.kind}")
        return self


class _AlgorithmCore(Model):
    """What every algorithm has, whatever its preset."""

    name: Preset = Field("grpo", description=_preset_description())
    group_size: int = Field(
        8,
        description="Samples per prompt; advantages are relative within the group.",
        ge=2,
        le=1024,
    )
    prompts_per_step: int = Field(32, description="Prompt groups per train step.", ge=1, le=65536)
    mini_batches: int = Field(1, description="Optimizer steps per train step; must divide promptsPerStep.", ge=1)
    total_steps: int = Field(100, description="Train steps of the run.", ge=1)
    learning_rate: float = Field(1e-6, description="Adam learning rate (the schedule's peak).", gt=0)
    schedule: LearningRateSchedule = Field(
        default_factory=LearningRateSchedule, description="The learning rate over the run (warmup, decay)."
    )
    update_epochs: int = Field(
        1,
        description=(
            "Passes over each step's batch, each of miniBatches optimizer steps, the ratio always against the "
            "sampler's log-probs (verl's ppo_epochs, TRL's num_iterations)."
        ),
        ge=1,
        le=64,
    )
    entropy_coef: float = Field(
        0.0,
        description=(
            "Weight of an entropy bonus: the loss less entropyCoef × the policy's entropy on the batch's tokens, "
            "aggregated as the policy loss is (verl's entropy_coeff)."
        ),
        ge=0,
    )
    clip_ratio_c: float | None = Field(
        None,
        description=(
            "Dual-clip PPO (Ye et al. 2020; verl's clip_ratio_c, 3.0 there): a token with a negative advantage "
            "loses at most clipRatioC × |A|, however large its ratio. Unset: off."
        ),
        gt=1,
    )
    weight_decay: float = Field(0.0, description="AdamW weight decay.", ge=0)
    max_grad_norm: float = Field(1.0, description="Gradient clipping norm; 0 disables it.", ge=0)
    max_staleness: int = Field(
        1,
        description=(
            "Most policy versions a trained sample may lag the trainer: "
            "0 synchronous on-policy, 1 one-step off-policy, k asynchronous."
        ),
        ge=0,
        le=64,
    )
    seed: int = Field(0, description="Seed of data order, sampling and initialisation.", ge=0)
    max_failed_prompts: int = Field(
        16,
        description=(
            "Prompts the run may set aside (failed.jsonl: too long, or failed by the engine rollout.retries "
            "times) before it fails, naming them."
        ),
        ge=0,
    )
    rollout_correction: RolloutCorrectionSpec = Field(
        default_factory=RolloutCorrectionSpec,
        description="How the loss accounts for the rollout engine and the trainer disagreeing on a token.",
    )

    @model_validator(mode="after")
    def _mini_batches_divide(self) -> Any:
        if self.prompts_per_step % self.mini_batches:
            raise FieldRuleError(
                "miniBatches",
                f"{self.mini_batches} does not divide promptsPerStep {self.prompts_per_step}",
            )
        return self


def _effective_cel(path: str) -> str:
    """CEL for a preset-decided setting as the job sets it, else as its preset does."""
    by_preset = ", ".join(
        f"{json.dumps(preset)}: {json.dumps(value)}" for preset, value in SETTINGS[path].defaults.items()
    )
    return f"(has(self.{path}) ? self.{path} : {{{by_preset}}}[self.name])"


_ESTIMATOR = _effective_cel("advantageEstimator")


class AlgorithmSpec(_AlgorithmCore):
    """The RL algorithm and its hyperparameters: `name` picks a preset; each setting below it leaves unset
    takes that preset's default."""

    advantage_estimator: AdvantageEstimator | None = Field(
        None,
        description=(
            "group-relative: r minus its group's mean (over the group's std with scaleRewardsByStd); "
            "leave-one-out: r minus the mean of the group's other rewards; batch-normalized: each token's "
            "return (r, less the KL to come with klIn reward) normalised over the batch's tokens. " + PER_PRESET
        ),
    )
    scale_rewards_by_std: bool | None = Field(
        None, description="Divide group-centred rewards by the group's std (group-relative only). " + PER_PRESET
    )
    loss_aggregation: LossAggregation | None = Field(
        None,
        description=(
            "token-mean: over all tokens of the batch (long answers weigh more); sequence-mean: over each "
            "completion, then over completions; token-sum-norm: each completion's summed token loss over "
            "lossNormTokens, then over completions (no length weighting either way). " + PER_PRESET
        ),
    )
    loss_norm_tokens: int | None = Field(
        None, description="The constant token-sum-norm divides by; default maxNewTokens.", ge=1
    )
    ratio_level: RatioLevel | None = Field(
        None,
        description=(
            "token: one importance ratio per token; sequence: the length-normalised sequence ratio "
            "(π/π_old)^(1/len(y)), clipped per completion. " + PER_PRESET
        ),
    )
    clip_low: float | None = Field(
        None, description="Lower clip of the importance ratio: 1 - clipLow. " + PER_PRESET, ge=0, lt=1
    )
    clip_high: float | None = Field(
        None, description="Upper clip of the importance ratio: 1 + clipHigh. " + PER_PRESET, ge=0
    )
    kl_coef: float | None = Field(
        None,
        description="Weight of the KL to the reference (initial) policy; 0 keeps no reference. " + PER_PRESET,
        ge=0,
    )
    kl_estimator: KLEstimator | None = Field(
        None,
        description="Per-token KL estimate, log_r = log π_ref - log π: k1 = -log_r, k2 = log_r²/2, "
        "k3 = exp(log_r) - 1 - log_r. " + PER_PRESET,
    )
    kl_in: KLIn | None = Field(
        None,
        description="loss: klCoef × KL added to the loss; reward: subtracted from each token's reward "
        "(needs advantageEstimator batch-normalized). " + PER_PRESET,
    )
    dynamic_sampling: DynamicSamplingSpec = Field(
        default_factory=DynamicSamplingSpec, description="DAPO's dynamic sampling."
    )
    overlong: OverlongSpec = Field(default_factory=OverlongSpec, description="DAPO's overlong reward shaping.")

    def effective(self, path: str) -> Any:
        """A setting that follows no other (not a Derived one) as this job sets it, else as its preset does."""
        head, _, leaf = path.rpartition(".")
        owner = getattr(self, _snake(head)) if head else self
        chosen = getattr(owner, _snake(leaf))
        return chosen if chosen is not None else preset_default(self.name, path, {})

    @model_validator(mode="after")
    def _settings_fit(self) -> AlgorithmSpec:
        estimator = self.effective("advantageEstimator")
        if self.scale_rewards_by_std and estimator != "group-relative":
            raise FieldRuleError(
                "scaleRewardsByStd", f"applies to advantageEstimator group-relative only, not {estimator}"
            )
        if self.effective("klIn") == "reward" and estimator != "batch-normalized":
            raise FieldRuleError(
                "klIn" if self.kl_in else "advantageEstimator",
                f"klIn reward (the KL in each token's return) needs advantageEstimator batch-normalized, "
                f"not {estimator}",
            )
        aggregation = self.effective("lossAggregation")
        if self.loss_norm_tokens is not None and aggregation != "token-sum-norm":
            raise FieldRuleError("lossNormTokens", f"applies to lossAggregation token-sum-norm only, not {aggregation}")
        if self.dynamic_sampling.max_extra_groups is not None and not self.effective("dynamicSampling.enabled"):
            raise FieldRuleError("dynamicSampling.maxExtraGroups", "applies only with dynamicSampling.enabled")
        return self

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("self.promptsPerStep % self.miniBatches == 0", "miniBatches must divide promptsPerStep"),
            cel(
                f"!has(self.scaleRewardsByStd) || !self.scaleRewardsByStd || {_ESTIMATOR} == 'group-relative'",
                "scaleRewardsByStd applies to advantageEstimator group-relative only",
            ),
            cel(
                f"{_effective_cel('klIn')} == 'loss' || {_ESTIMATOR} == 'batch-normalized'",
                "klIn reward needs advantageEstimator batch-normalized",
            ),
            cel(
                f"!has(self.lossNormTokens) || {_effective_cel('lossAggregation')} == 'token-sum-norm'",
                "lossNormTokens applies to lossAggregation token-sum-norm only",
            ),
            cel(
                "!has(self.dynamicSampling) || !has(self.dynamicSampling.maxExtraGroups) || "
                + _effective_cel("dynamicSampling.enabled"),
                "dynamicSampling.maxExtraGroups applies only with dynamicSampling.enabled",
            ),
            cel("self == oldSelf", IMMUTABLE),
        )
    )


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


class DynamicSampling(Model):
    """Dynamic sampling as resolved."""

    enabled: bool
    max_extra_groups: int


class Overlong(Model):
    """Overlong shaping as resolved."""

    buffer_tokens: int
    penalty: float
    mask_truncated: bool


class Algorithm(_AlgorithmCore):
    """The algorithm the workers run: every setting resolved (see AlgorithmSpec for their meaning)."""

    advantage_estimator: AdvantageEstimator
    scale_rewards_by_std: bool
    loss_aggregation: LossAggregation
    loss_norm_tokens: int
    ratio_level: RatioLevel
    clip_low: float = Field(ge=0, lt=1)
    clip_high: float = Field(ge=0)
    kl_coef: float = Field(ge=0)
    kl_estimator: KLEstimator
    kl_in: KLIn
    dynamic_sampling: DynamicSampling
    overlong: Overlong

    def summary(self) -> str:
        """The preset-decided settings on one line, as the job will run them."""
        wire = self.model_dump(by_alias=True, mode="json")
        parts = []
        for path in SETTINGS:
            head, _, leaf = path.rpartition(".")
            parts.append(f"{path} {json.dumps(wire[head][leaf] if head else wire[path])}")
        return f"algorithm {self.name}: " + ", ".join(parts)


def resolve_algorithm(spec: AlgorithmSpec, max_new_tokens: int) -> Algorithm:
    """The algorithm as it runs: what `spec` sets, and its preset's default for every setting it leaves unset
    (`max_new_tokens` is rollout.sampling.maxNewTokens, which some defaults follow)."""
    job: Mapping[str, int] = {"maxNewTokens": max_new_tokens, "promptsPerStep": spec.prompts_per_step}
    resolved = spec.model_dump(by_alias=True, exclude_none=True)
    for path in SETTINGS:
        head, _, leaf = path.rpartition(".")
        owner = resolved.setdefault(head, {}) if head else resolved
        owner.setdefault(leaf, preset_default(spec.name, path, job))
    return Algorithm.model_validate(resolved)
