"""Build a replica's reward functions from the job's `RewardFunction` list, whatever their kind.

Rule functions are loaded and checked first (no model load is wasted on a mistake in them), then
the models (disrm, genrm), so that rule functions that take a `judge` get a client of them
(`modelpool.Judge`). A `judgeOnly` model serves only that judge: it is not scored on every
sample. Every error names the function; modules of a kind are imported only when the job uses
that kind (a rule-only replica never imports torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from rljob_api.reward import MODEL_KINDS, RewardFunction
from rljob_workers.reward.base import RewardConfigError, SampleScorer
from rljob_workers.reward.callables import RewardCallable, WeightedFunction, is_async, load_function
from rljob_workers.reward.conventions import adapt, resolve_signature
from rljob_workers.reward.modelpool import Judge, declares, takes_judge

if TYPE_CHECKING:
    from rljob_workers.reward.disrm import DisRMScorer
    from rljob_workers.reward.genrm import GenRMScorer


def model_device(gpus: int) -> str:
    """cuda when the replica has GPUs (and torch sees one), else cpu."""
    if gpus <= 0:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise RewardConfigError(f"the reward replica asks for {gpus} GPU(s) but torch sees no CUDA device")
    return "cuda"


def build_scorer(spec: RewardFunction, timeout_seconds: float, gpus: int) -> SampleScorer:
    """The scorer of one remote, disrm or genrm function (blocking: a model kind loads its model)."""
    if spec.kind == "remote" and spec.remote is not None:
        from rljob_workers.reward.remote import RemoteScorer

        return RemoteScorer(spec.name, spec.remote, timeout_seconds=timeout_seconds)
    if spec.kind == "disrm" and spec.disrm is not None:
        from rljob_workers.reward.disrm import DisRMScorer

        return DisRMScorer(spec.name, spec.disrm, device=model_device(gpus))
    if spec.kind == "genrm" and spec.genrm is not None:
        from rljob_workers.reward.genrm import GenRMScorer

        model_device(gpus)
        return GenRMScorer.load(spec.name, spec.genrm, gpus=gpus)
    raise RewardConfigError(f"reward function {spec.name!r}: kind {spec.kind!r} has no {spec.kind} configuration")


@dataclass(frozen=True)
class _Rule:
    """A rule's loaded callable and the arguments it declares."""

    fn: RewardCallable
    takes_judge: bool
    takes_sample: bool


def _load_rule(spec: RewardFunction, has_models: bool) -> _Rule:
    assert spec.rule is not None
    fn = load_function(spec.name, spec.rule.function)
    signature, _ = resolve_signature(fn, spec.rule.signature)
    if signature != "rljob":  # a peer's convention: called through its adapter, without judge or sample
        return _Rule(adapt(fn, signature, spec.name, spec.rule.batch_size or 1), False, False)
    rule = _Rule(fn, takes_judge(fn), declares(fn, "sample"))
    if rule.takes_judge and not is_async(fn):
        raise RewardConfigError(
            f"reward function {spec.name!r}: {spec.rule.function} takes a judge, so it must be async "
            "(judge calls are awaited)"
        )
    if rule.takes_judge and not has_models:
        raise RewardConfigError(
            f"reward function {spec.name!r}: {spec.rule.function} takes a judge, but the job has no "
            "disrm or genrm function for it to use"
        )
    return rule


def _check_judge_only(specs: Sequence[RewardFunction], rules: dict[str, _Rule]) -> None:
    """Some function scores the samples, and a judge-only model has a rule whose judge can call it."""
    judge_only = [s.name for s in specs if s.judge_only]
    if judge_only and len(judge_only) == len(specs):
        raise RewardConfigError(
            f"every reward function is judgeOnly ({judge_only}); at least one must score the samples"
        )
    if judge_only and not any(rule.takes_judge for rule in rules.values()):
        raise RewardConfigError(
            f"reward function {judge_only[0]!r} is judgeOnly, but no rule function takes a judge to call it "
            "(give a rule a `judge` parameter, or drop judgeOnly to score every sample with it)"
        )


def _build(spec: RewardFunction, timeout_seconds: float, gpus: int) -> SampleScorer:
    try:
        return build_scorer(spec, timeout_seconds, gpus)
    except RewardConfigError:
        raise
    except Exception as exc:  # anything a kind's constructor raises is this function's config problem
        raise RewardConfigError(f"reward function {spec.name!r} ({spec.kind}): {type(exc).__name__}: {exc}") from exc


class BuiltFunctions(NamedTuple):
    """What a replica runs: the functions scored on every sample, and the judge-only models."""

    functions: list[WeightedFunction]
    judge_only: list[SampleScorer]  # called only by rules' judges; still the replica's to close


def build_functions(specs: Sequence[RewardFunction], timeout_seconds: float, *, gpus: int = 0) -> BuiltFunctions:
    """The job's functions in job order; rule functions that take `judge` get one over the model kinds.

    Rules are loaded and checked before any model is, so that a mistake in them costs no model load.
    A judge-only model is in the judge but not scored on every sample.
    """
    has_models = any(s.kind in MODEL_KINDS for s in specs)
    rules = {s.name: _load_rule(s, has_models) for s in specs if s.kind == "rule"}
    _check_judge_only(specs, rules)
    scorers = {s.name: _build(s, timeout_seconds, gpus) for s in specs if s.kind != "rule"}
    disrm: dict[str, DisRMScorer] = {n: f for n, f in scorers.items() if f.kind == "disrm"}  # type: ignore[misc]
    genrm: dict[str, GenRMScorer] = {n: f for n, f in scorers.items() if f.kind == "genrm"}  # type: ignore[misc]
    judge = Judge(disrm, genrm) if disrm or genrm else None
    functions = []
    for spec in specs:
        if spec.kind == "rule":
            rule = rules[spec.name]
            uses = judge if rule.takes_judge else None
            functions.append(
                WeightedFunction(spec.name, rule.fn, spec.weight, judge=uses, takes_sample=rule.takes_sample)
            )
        elif not spec.judge_only:
            functions.append(WeightedFunction(spec.name, scorers[spec.name], spec.weight, kind=spec.kind))
    return BuiltFunctions(functions, [scorers[s.name] for s in specs if s.judge_only])
