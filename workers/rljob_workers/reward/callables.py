"""A reward function as loaded: the callable, its weight and what it takes; the error result of a sample.

Shared by the function set (`functions`) and the builders of each kind (`kinds`), so neither
imports the other's half.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rljob.v1 import sample_pb2
from rljob_workers.reward.base import RewardConfigError, SampleScorer

if TYPE_CHECKING:
    from rljob_workers.reward.modelpool import Judge

# A reward function returns a number, or an awaitable of one.
RewardCallable = Callable[..., Any]

_MISSING = object()


def load_function(name: str, ref: str) -> RewardCallable:
    """Import ``module.path:function``; errors name the reward function and the path."""
    module_path, sep, attr = ref.partition(":")
    if not sep or not module_path or not attr:
        raise RewardConfigError(f"reward function {name!r}: {ref!r} is not of the form module.path:function")
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:  # any import-time failure of user code is a config error
        raise RewardConfigError(
            f"reward function {name!r}: cannot import module {module_path!r} of {ref!r}: {type(exc).__name__}: {exc}"
        ) from exc
    fn = getattr(module, attr, _MISSING)
    if fn is _MISSING:
        raise RewardConfigError(f"reward function {name!r}: module {module_path!r} has no attribute {attr!r} ({ref!r})")
    if not callable(fn):
        raise RewardConfigError(f"reward function {name!r}: {ref!r} is a {type(fn).__name__}, not a callable")
    return fn  # type: ignore[no-any-return]


def error_score(
    sample_id: str, error_class: int, message: str, function: str = "", latency: float = 0.0
) -> sample_pb2.SampleScore:
    """A SampleScore that carries an error instead of a score."""
    error = sample_pb2.ScoreError(error_class=error_class, message=message, function=function)  # type: ignore[arg-type]
    return sample_pb2.SampleScore(sample_id=sample_id, error=error, latency_seconds=latency)


def is_async(fn: RewardCallable) -> bool:
    # Callable objects with an async __call__ count too.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


@dataclass(frozen=True)
class WeightedFunction:
    """One reward function, its name (in components and errors) and its weight in the sum.

    `fn` is a rule's callable, or the SampleScorer of another kind; `judge` is given to a rule that takes one.
    """

    name: str
    fn: RewardCallable | SampleScorer
    weight: float = 1.0
    kind: str = "rule"
    judge: Judge | None = None
    takes_sample: bool = False  # a rule that declares `sample` gets the RewardSample itself
