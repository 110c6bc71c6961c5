"""The `judge` handed to rule functions: a client of this replica's reward models (its disrm and genrm functions).

A rule function that declares a ``judge`` parameter gets one, so a rule, an LLM-as-a-judge prompt
and a reward model's score combine in one function::

    async def graded(prompt, completion, judge, answer="", **_):
        if completion.strip() == answer:          # the rule decides when it can
            return 1.0
        verdict = await judge.generate(f"Is {completion!r} a correct answer to {prompt!r}? yes or no:")
        return 0.5 if "yes" in verdict.lower() else 0.0

- ``await judge.generate(text, model=None, max_new_tokens=None) -> str``: a genrm judge's raw answer;
- ``await judge.grade(prompt, completion, model=None, **fields) -> float``: the genrm's own template
  and parser (a parse failure raises, and the rule function's sample gets a FUNCTION error);
- ``await judge.score(prompt, completion, model=None) -> float``: a disrm model's score, batched
  with every other request to that model;
- ``judge.models``: the names of the models it can use.

``model`` is the name of the disrm/genrm function in the job; it may be left out when the job has
exactly one model of the kind. A function that takes ``judge`` must be async (judge calls are
awaited), and the job must have a disrm or genrm function; both are checked when the replica
starts. The judge uses the models of the replica the rule runs in. Those are reward functions of
the job too, scored on every sample unless marked ``judgeOnly`` (weight 0 keeps one out of the
sum, not out of the work); a ``judgeOnly`` model with no rule taking ``judge`` is refused at start.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from rljob_workers.reward.base import RewardConfigError

if TYPE_CHECKING:  # the models import torch; a rule-only replica never does
    from rljob_workers.reward.disrm import DisRMScorer
    from rljob_workers.reward.genrm import GenRMScorer

M = TypeVar("M")


def declares(fn: Callable[..., Any], parameter: str) -> bool:
    """Whether a rule function declares a parameter of this name."""
    try:
        return parameter in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False


def takes_judge(fn: Callable[..., Any]) -> bool:
    """Whether a rule function declares a `judge` parameter."""
    return declares(fn, "judge")


class Judge:
    """A rule function's client of the replica's reward models."""

    def __init__(self, disrm: Mapping[str, DisRMScorer], genrm: Mapping[str, GenRMScorer]) -> None:
        if not disrm and not genrm:
            raise RewardConfigError("a judge needs at least one disrm or genrm function in the job")
        self.disrm, self.genrm = dict(disrm), dict(genrm)

    @property
    def models(self) -> list[str]:
        return [*self.disrm, *self.genrm]

    async def generate(self, text: str, *, model: str | None = None, max_new_tokens: int | None = None) -> str:
        """The genrm judge's answer to `text`, sampled with that function's sampling settings."""
        return await _pick(self.genrm, model, "genrm").generate(text, max_new_tokens=max_new_tokens)

    async def grade(self, prompt: str, completion: str, *, model: str | None = None, **fields: str) -> float:
        """The genrm function's score of (prompt, completion): its template filled in, its parser applied."""
        judge = _pick(self.genrm, model, "genrm")
        return await judge.grade(prompt, completion, fields, request_id="judge", subject="this judge.grade call")

    async def score(self, prompt: str, completion: str, *, model: str | None = None) -> float:
        """The disrm reward model's score of (prompt, completion)."""
        return await _pick(self.disrm, model, "disrm").score_text(prompt, completion)


def _pick(models: Mapping[str, M], name: str | None, kind: str) -> M:
    if name is not None:
        if name not in models:
            raise LookupError(f"the judge has no {kind} model {name!r}; it has {sorted(models) or 'none'}")
        return models[name]
    if len(models) != 1:
        raise LookupError(
            f"the job has {len(models)} {kind} functions ({sorted(models)}); pass model=<name> to the judge"
            if models
            else f"the job has no {kind} function for the judge to use"
        )
    return next(iter(models.values()))
