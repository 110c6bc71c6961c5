"""Build a replica's reward functions from the job's `RewardFunction` list, whatever their kind.

Models (disrm, genrm) are loaded first, so that rule functions that take a `judge` get a client
of them (`modelpool.Judge`). Every error names the function; modules of a kind are imported only
when the job uses that kind (a rule-only replica never imports torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rljob_api.reward import RewardFunction

from .base import RewardConfigError, SampleScorer
from .functions import WeightedFunction, load_function
from .modelpool import Judge, declares, takes_judge

if TYPE_CHECKING:
    from .disrm import DisRMScorer
    from .genrm import GenRMScorer


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
        from .remote import RemoteScorer

        return RemoteScorer(spec.name, spec.remote, timeout_seconds=timeout_seconds)
    if spec.kind == "disrm" and spec.disrm is not None:
        from .disrm import DisRMScorer

        return DisRMScorer(spec.name, spec.disrm, device=model_device(gpus))
    if spec.kind == "genrm" and spec.genrm is not None:
        from .genrm import GenRMScorer

        model_device(gpus)
        return GenRMScorer.load(spec.name, spec.genrm, gpus=gpus)
    raise RewardConfigError(f"reward function {spec.name!r}: kind {spec.kind!r} has no {spec.kind} configuration")


def _rule(spec: RewardFunction, judge: Judge | None) -> WeightedFunction:
    assert spec.rule is not None
    fn = load_function(spec.name, spec.rule.function)
    takes_sample = declares(fn, "sample")
    if not takes_judge(fn):
        return WeightedFunction(spec.name, fn, spec.weight, takes_sample=takes_sample)
    from .functions import is_async

    if not is_async(fn):
        raise RewardConfigError(
            f"reward function {spec.name!r}: {spec.rule.function} takes a judge, so it must be async "
            "(judge calls are awaited)"
        )
    if judge is None:
        raise RewardConfigError(
            f"reward function {spec.name!r}: {spec.rule.function} takes a judge, but the job has no "
            "disrm or genrm function for it to use"
        )
    return WeightedFunction(spec.name, fn, spec.weight, judge=judge, takes_sample=takes_sample)


def _build(spec: RewardFunction, timeout_seconds: float, gpus: int) -> SampleScorer:
    try:
        return build_scorer(spec, timeout_seconds, gpus)
    except RewardConfigError:
        raise
    except Exception as exc:  # anything a kind's constructor raises is this function's config problem
        raise RewardConfigError(f"reward function {spec.name!r} ({spec.kind}): {type(exc).__name__}: {exc}") from exc


def build_functions(
    specs: Sequence[RewardFunction], timeout_seconds: float, *, gpus: int = 0
) -> list[WeightedFunction]:
    """The job's functions in job order; rule functions that take `judge` get one over the model kinds."""
    scorers = {s.name: _build(s, timeout_seconds, gpus) for s in specs if s.kind != "rule"}
    disrm: dict[str, DisRMScorer] = {n: f for n, f in scorers.items() if f.kind == "disrm"}  # type: ignore[misc]
    genrm: dict[str, GenRMScorer] = {n: f for n, f in scorers.items() if f.kind == "genrm"}  # type: ignore[misc]
    judge = Judge(disrm, genrm) if disrm or genrm else None
    built = []
    for spec in specs:
        if spec.kind == "rule":
            built.append(_rule(spec, judge))
        else:
            built.append(WeightedFunction(spec.name, scorers[spec.name], spec.weight, kind=spec.kind))
    return built
