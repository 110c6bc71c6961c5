"""The job's reward functions on one replica: call each on a sample, check and weight their scores.

Four kinds (built by `kinds.build_functions` from the job's spec):

- ``rule``: a Python function loaded by ``module.path:function``, called as
  ``fn(prompt=..., completion=..., **fields)`` with the sample's data fields (and ``messages=``,
  the conversation, for messages data; ``prompt`` is as the chat template rendered it, where one
  applies); it returns a number (bools count as 0/1) and may be sync or async. An async one that declares a
  ``judge`` parameter also gets ``judge=``, a client of this replica's disrm/genrm models
  (`modelpool.Judge`: ``await judge.generate(text)``, ``await judge.grade(prompt, completion)``,
  ``await judge.score(prompt, completion)``), so LLM-as-a-judge and hybrid rule-plus-model
  rewards are one function (example: `reward/judge.py`). One that declares a ``sample``
  parameter also gets ``sample=``, the whole `RewardSample` (sample id, token ids, the policy
  version that generated it). A disrm/genrm function marked ``judgeOnly`` serves only rules'
  judges: it has no component and no part in the sum;
- ``remote``: external RewardService endpoints (`remote.RemoteScorer`);
- ``disrm``: a sequence-classification reward model with dynamic batching (`disrm.DisRMScorer`);
- ``genrm``: a generative judge on a rollout engine (`genrm.GenRMScorer`).

A result that is not a finite number, an exception or a timeout becomes an error result
naming the sample and the function: never a silent score of 0. A kind's own failure
(`base.ScoreFailure`) keeps its error class: a dead remote endpoint is TRANSIENT, a judge
answer that does not parse is FUNCTION.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rljob.v1 import sample_pb2
from rljob_api.reward import RewardFunction
from rljob_workers.common.daemon_pool import DaemonThreadPool
from rljob_workers.common.field_values import sample_fields
from rljob_workers.reward.base import FUNCTION, INVALID, TRANSIENT, RewardConfigError, SampleScorer, ScoreFailure
from rljob_workers.reward.callables import RewardCallable, WeightedFunction, error_score, is_async
from rljob_workers.reward.conventions import NotApplicable, ScoreWithMetrics
from rljob_workers.reward.kinds import build_functions
from rljob_workers.reward.metrics import RewardMetrics

if TYPE_CHECKING:
    pass

__all__ = [
    "FUNCTION",
    "INVALID",
    "TRANSIENT",
    "RewardConfigError",
    "RewardFunctionSet",
    "WeightedFunction",
    "error_score",
]

# Keyword arguments the caller fills in itself; a data field with one of these names is dropped
# (datasets commonly keep the prompt as a field too) instead of failing every call with a TypeError.
RESERVED_ARGS = frozenset({"prompt", "completion", "messages"})

# Sync functions run in a thread pool so that one slow function does not stall the event loop.
DEFAULT_MAX_WORKERS = 32


@dataclass(frozen=True)
class _Outcome:
    """One function's result on one sample: a value or an error."""

    value: float | None = None
    error: sample_pb2.ScoreError | None = None
    applies: bool = True  # False: a TRL function's None, this sample is not its to score
    metrics: dict[str, float] = field(default_factory=dict)  # numbers it gave beside its score (verl's dict)


def _failure(error_class: int, message: str, function: str) -> _Outcome:
    return _Outcome(error=sample_pb2.ScoreError(error_class=error_class, message=message, function=function))  # type: ignore[arg-type]


def _check_value(value: object, name: str, sample_id: str) -> _Outcome:
    """A usable score, or a FUNCTION error saying what was wrong with the value."""
    if isinstance(value, NotApplicable):
        return _Outcome(applies=False)
    if isinstance(value, ScoreWithMetrics):
        scored = _check_value(value.score, name, sample_id)
        return scored if scored.error is not None else _Outcome(value=scored.value, metrics=value.metrics)
    if not isinstance(value, numbers.Real):
        shown = repr(value)[:80]
        return _failure(
            FUNCTION,
            f"reward function {name!r} returned {type(value).__name__} {shown} for sample {sample_id!r}, not a number",
            name,
        )
    number = float(value)
    if not math.isfinite(number):
        return _failure(FUNCTION, f"reward function {name!r} returned {number} for sample {sample_id!r}", name)
    return _Outcome(value=number)


class RewardFunctionSet:
    """The job's reward functions: each sample's score is their weighted sum, with per-function components.

    `judge_only` are the models only rules' judges call: not scored per sample, but closed with the set.
    """

    def __init__(
        self,
        functions: Sequence[WeightedFunction],
        timeout_seconds: float,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        metrics: RewardMetrics | None = None,
        judge_only: Sequence[SampleScorer] = (),
    ) -> None:
        if not functions:
            raise RewardConfigError("a reward function set needs at least one function")
        names = [f.name for f in functions]
        if len(set(names)) != len(names):
            raise RewardConfigError(f"reward function names must be unique, got {names}")
        if timeout_seconds <= 0:
            raise RewardConfigError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self.functions = list(functions)
        # Decided once, not per sample: a runtime-checkable Protocol's isinstance is slow.
        self._scorers: dict[str, SampleScorer] = {}
        self._rules: dict[str, tuple[RewardCallable, bool]] = {}  # name: (callable, is async)
        for f in self.functions:
            if isinstance(f.fn, SampleScorer):
                self._scorers[f.name] = f.fn
            else:
                self._rules[f.name] = (f.fn, is_async(f.fn))
        self.judge_only = list(judge_only)
        self.timeout_seconds = timeout_seconds
        self.metrics = metrics if metrics is not None else RewardMetrics()
        self._executor = DaemonThreadPool(max_workers, thread_name_prefix="reward-fn")

    @classmethod
    def from_spec(
        cls,
        functions: Sequence[RewardFunction],
        timeout_seconds: float,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        gpus: int = 0,
    ) -> RewardFunctionSet:
        """Build the job's functions of every kind (blocking: loads models); errors name the function."""
        built = build_functions(functions, timeout_seconds, gpus=gpus)
        return cls(built.functions, timeout_seconds, max_workers=max_workers, judge_only=built.judge_only)

    @property
    def scorers(self) -> list[SampleScorer]:
        """The non-rule kinds' scorers (remote endpoints, models), the judge-only models last."""
        return [*self._scorers.values(), *self.judge_only]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions]

    @property
    def async_rules(self) -> list[str]:
        """The rules that run on the event loop (async def): one that blocks stalls the whole replica."""
        return [name for name, (_, asynchronous) in self._rules.items() if asynchronous]

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        """Score one sample with every function concurrently; never raises for a function's failure."""
        start = time.perf_counter()
        if len(self.functions) == 1:  # the common case, without gather's task per function
            outcomes = [await self._call(self.functions[0], sample)]
        else:
            outcomes = await asyncio.gather(*(self._call(f, sample) for f in self.functions))
        result = sample_pb2.SampleScore(sample_id=sample.sample_id)
        for function, outcome in zip(self.functions, outcomes, strict=True):
            if outcome.value is not None:
                result.components[function.name] = outcome.value
            for key, value in outcome.metrics.items():
                result.components[f"{function.name}.{key}"] = value
        errors = [o.error for o in outcomes if o.error is not None]
        applying = [f for f, o in zip(self.functions, outcomes, strict=True) if o.applies]
        if errors:
            # The first failing function in job order is reported; the controller retries the whole sample.
            result.error.CopyFrom(errors[0])
        elif not applying:
            message = f"no reward function applies to sample {sample.sample_id!r} (each answered None)"
            result.error.CopyFrom(sample_pb2.ScoreError(error_class=FUNCTION, message=message))
        else:  # TRL's rule: the sum over the functions that apply
            total = math.fsum(f.weight * result.components[f.name] for f in applying)
            if math.isfinite(total):
                result.score = total
            else:
                message = f"weighted sum of sample {sample.sample_id!r} is {total}"
                result.error.CopyFrom(sample_pb2.ScoreError(error_class=FUNCTION, message=message))
        result.latency_seconds = time.perf_counter() - start
        return result

    async def _call(self, function: WeightedFunction, sample: sample_pb2.RewardSample) -> _Outcome:
        start = time.perf_counter()
        outcome = await self._outcome(function, sample)
        error = outcome.error.error_class if outcome.error is not None else None
        self.metrics.observe_call(function.kind, function.name, time.perf_counter() - start, error)
        return outcome

    async def _outcome(self, function: WeightedFunction, sample: sample_pb2.RewardSample) -> _Outcome:
        name, sample_id = function.name, sample.sample_id
        timeout: float | None = self.timeout_seconds
        scorer = self._scorers.get(name)
        try:
            if scorer is not None:
                timeout = None if scorer.manages_deadline else timeout
                value: object = await _within(scorer.score_sample(sample), timeout)
            else:
                fn, is_async_fn = self._rules[name]
                value = await _within(self._invoke(fn, _kwargs(function, sample), is_async_fn), timeout)
        except asyncio.TimeoutError:
            # A sync function keeps its thread until it returns: Python cannot interrupt it.
            message = f"reward function {name!r} timed out after {self.timeout_seconds:g}s on sample {sample_id!r}"
            return _failure(TRANSIENT, message, name)
        except ScoreFailure as failure:  # a kind's own failure, or one a rule's judge call raised
            message = (
                failure.message if function.kind != "rule" else f"rule {name!r} on sample {sample_id!r}: {failure}"
            )
            return _failure(failure.error_class, message, name)
        except Exception as exc:
            message = f"reward function {name!r} raised {type(exc).__name__} on sample {sample_id!r}: {exc}"
            return _failure(FUNCTION, message, name)
        return _check_value(value, name, sample_id)

    async def _invoke(self, fn: RewardCallable, kwargs: dict[str, Any], is_async_fn: bool) -> object:
        if is_async_fn:
            result = fn(**kwargs)
        else:
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._executor, functools.partial(fn, **kwargs))
        if inspect.isawaitable(result):  # e.g. a sync wrapper that returns a coroutine
            result = await result
        return result

    def close(self) -> None:
        """Release the thread pool without waiting for functions still running (they cannot be stopped).

        Models and remote channels are released by `aclose`; a replica with them should await that instead.
        """
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.metrics.close()

    async def aclose(self) -> None:
        """Close every kind's scorer (models, engines, channels), then the thread pool."""
        await asyncio.gather(*(s.close() for s in self.scorers), return_exceptions=True)
        self.close()


async def _within(awaitable: Awaitable[object], timeout: float | None) -> object:
    """`awaitable`'s result, or asyncio.TimeoutError after `timeout` seconds (None: no limit)."""
    if sys.version_info >= (3, 11):
        # Unlike wait_for before 3.12, no extra task per call: this runs once per sample and function.
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout)


def _kwargs(function: WeightedFunction, sample: sample_pb2.RewardSample) -> dict[str, Any]:
    """A rule's keyword arguments: the data fields, prompt, completion, the conversation of messages data
    (`messages`: a list of {role, content}) and, when it takes them, judge and sample."""
    extra: dict[str, Any] = {}
    if function.judge is not None:
        extra["judge"] = function.judge
    if function.takes_sample:
        extra["sample"] = sample
    reserved = RESERVED_ARGS | extra.keys()
    fields = sample_fields(sample.values, sample.fields)
    kwargs: dict[str, Any] = {k: v for k, v in fields.items() if k not in reserved}
    kwargs.update(prompt=sample.prompt, completion=sample.completion, **extra)
    if sample.messages:
        kwargs["messages"] = [{"role": m.role, "content": m.content} for m in sample.messages]
    return kwargs
