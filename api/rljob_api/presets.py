"""The algorithm presets (`spec.algorithm.name`): each one a set of defaults for the composable settings,
with the paper each setting comes from. Plain data: `algorithm.resolve_algorithm` applies it, the field
reference prints it, and the CRD's rules are written from it, so the three cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Preset = Literal["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
PRESETS: tuple[Preset, ...] = get_args(Preset)
AdvantageEstimator = Literal["group-relative", "leave-one-out", "batch-normalized", "group-mean-batch-normalized"]
LossAggregation = Literal["token-mean", "sequence-mean", "token-sum-norm"]
RatioLevel = Literal["token", "sequence"]
KLEstimator = Literal["k1", "k2", "k3"]
KLIn = Literal["loss", "reward"]

PAPERS: Mapping[str, str] = {
    "GRPO": "Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
    "Dr. GRPO": "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
    "DAPO": "Yu et al. 2025, DAPO, arXiv:2503.14476",
    "GSPO": "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
    "RLOO": "Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
    "REINFORCE++": "Hu 2025, REINFORCE++, arXiv:2501.03262",
    "REINFORCE++-baseline": "Hu 2025, REINFORCE++ (its group-mean baseline; verl's reinforce_plus_plus_baseline)",
    "KL estimators": "Schulman 2020, Approximating KL Divergence (k1, k2, k3)",
}
PRESET_PAPER: Mapping[Preset, str] = {
    "grpo": "GRPO",
    "dr_grpo": "Dr. GRPO",
    "dapo": "DAPO",
    "gspo": "GSPO",
    "rloo": "RLOO",
    "reinforce_pp": "REINFORCE++",
    "reinforce_pp_baseline": "REINFORCE++-baseline",
}


@dataclass(frozen=True)
class Derived:
    """A preset default that follows other settings of the job (`of` takes them by wire name)."""

    text: str  # how the reference shows it
    of: Callable[[Mapping[str, int]], Any]

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Setting:
    """One composable setting: its default under each preset, and the paper(s) it comes from."""

    defaults: Mapping[Preset, Any]
    source: str


def _row(source: str, base: Any, **overrides: Any) -> Setting:
    """A setting whose default is `base` except under the presets named in `overrides`."""
    unknown = set(overrides) - set(PRESETS)
    if unknown:
        raise KeyError(f"no preset {sorted(unknown)}")
    return Setting({preset: overrides.get(preset, base) for preset in PRESETS}, source)


MAX_NEW_TOKENS = Derived("maxNewTokens", lambda job: job["maxNewTokens"])
# DAPO's overlong buffer: 4096 of its 20480 tokens, a fifth of the generation budget.
FIFTH_OF_MAX_NEW_TOKENS = Derived("maxNewTokens / 5 (at least 1)", lambda job: max(1, job["maxNewTokens"] // 5))
# verl's DAPO recipe gives up after 10 generation batches for one train batch.
TEN_STEPS_OF_GROUPS = Derived("10 × promptsPerStep", lambda job: 10 * job["promptsPerStep"])

# Wire path (as in spec.algorithm) -> default per preset. grpo, the default preset, keeps rljob's plain
# defaults (token-mean, as DAPO; no KL) rather than the GRPO paper's, so that a job that names no preset
# trains with the defaults it was written against.
SETTINGS: Mapping[str, Setting] = {
    "advantageEstimator": _row(
        "group-relative: GRPO; leave-one-out: RLOO; batch-normalized: REINFORCE++; group-mean-batch-normalized: "
        "REINFORCE++-baseline",
        "group-relative",
        rloo="leave-one-out",
        reinforce_pp="batch-normalized",
        reinforce_pp_baseline="group-mean-batch-normalized",
    ),
    "scaleRewardsByStd": _row(
        "GRPO (true), Dr. GRPO (false)",
        True,
        dr_grpo=False,
        rloo=False,
        reinforce_pp=False,
        reinforce_pp_baseline=False,
    ),
    "lossAggregation": _row(
        "token-mean: DAPO; sequence-mean: GRPO, GSPO; token-sum-norm: Dr. GRPO",
        "token-mean",
        dr_grpo="token-sum-norm",
        gspo="sequence-mean",
    ),
    "lossNormTokens": _row("Dr. GRPO", MAX_NEW_TOKENS),
    "ratioLevel": _row("sequence: GSPO", "token", gspo="sequence"),
    "clipLow": _row("PPO; GSPO's sequence clip range", 0.2, gspo=3e-4),
    "clipHigh": _row("DAPO (clip-higher); GSPO's sequence clip range", 0.2, dapo=0.28, gspo=4e-4),
    "klCoef": _row(
        "GRPO (in the loss), REINFORCE++ (in the reward), REINFORCE++-baseline (verl's kl_loss_coef, in the loss)",
        0.0,
        reinforce_pp=0.01,
        reinforce_pp_baseline=0.001,
    ),
    "klEstimator": _row("KL estimators; k3 is GRPO's, k1 REINFORCE++'s", "k3", reinforce_pp="k1"),
    "klIn": _row("loss: GRPO; reward: REINFORCE++", "loss", reinforce_pp="reward"),
    "dynamicSampling.enabled": _row("DAPO", False, dapo=True),
    "dynamicSampling.maxExtraGroups": _row("DAPO", TEN_STEPS_OF_GROUPS),
    "overlong.bufferTokens": _row("DAPO", FIFTH_OF_MAX_NEW_TOKENS),
    "overlong.penalty": _row("DAPO", 0.0, dapo=1.0),
    "overlong.maskTruncated": _row("DAPO (overlong filtering)", False),
}


def preset_default(preset: Preset, path: str, job: Mapping[str, int]) -> Any:
    """The default of setting `path` under `preset`, for a job with these `maxNewTokens`, `promptsPerStep`."""
    value = SETTINGS[path].defaults[preset]
    return value.of(job) if isinstance(value, Derived) else value


def presets_where(path: str, value: Any) -> list[Preset]:
    """The presets whose default of `path` is `value` (for the CRD's rules, which cannot import this)."""
    return [preset for preset, default in SETTINGS[path].defaults.items() if default == value]
