"""Reward functions as TRL and verl write them, called through rljob's own convention.

- ``rljob``: ``fn(prompt=, completion=, **fields) -> number``, once per sample.
- ``trl``: ``fn(prompts, completions, **kwargs) -> list[float | None]``, TRL's batched form: a batch of the
  samples that arrive together (`BatchedTrl`, up to rule.batchSize; an async function one at a time),
  `prompts` and `completions` as TRL passes them (text, or lists of messages for conversational data)
  and every data field as a list in kwargs. ``None`` means the function does not apply to the sample: the
  sample's reward is then the weighted sum of the functions that do.
- ``verl``: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``, filled from the row's
  fields of those names (`reward_model.ground_truth` is `ground_truth`; extra_info: the row's extra_info object,
  or else the other fields); a float, or a dict whose ``score`` is the reward and whose other numbers are the
  function's metrics.

``auto`` (rule.signature's default) decides from the function's parameters: `completions` is TRL's, `solution_str`
verl's, anything else rljob's.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from rljob_workers.reward.callables import RewardCallable, is_async
from rljob_workers.reward.modelpool import declares

VERL_COLUMNS = ("data_source", "ground_truth")


class NotApplicable:
    """A TRL function's None: it does not score this sample (rljob's own functions may not answer None)."""


NOT_APPLICABLE = NotApplicable()


@dataclass(frozen=True)
class ScoreWithMetrics:
    """A score and the named numbers a function gave beside it (verl's dict answer)."""

    score: object
    metrics: dict[str, float] = field(default_factory=dict)


def resolve_signature(fn: RewardCallable, asked: str) -> tuple[str, str]:
    """(the convention a rule is called with, why): `asked` unless it is auto, then from its parameters."""
    if asked != "auto":
        return asked, "rule.signature"
    if declares(fn, "completions"):
        return "trl", "auto: it declares `completions`"
    if declares(fn, "solution_str"):
        return "verl", "auto: it declares `solution_str`"
    return "rljob", "auto: neither `completions` (trl) nor `solution_str` (verl)"


def _trl_arguments(prompt: str, completion: str, messages: Any, fields: dict[str, Any]) -> dict[str, Any]:
    if messages:  # conversational data: the prompt's messages, the completion as an assistant message
        prompts: list[Any] = [messages]
        completions: list[Any] = [[{"role": "assistant", "content": completion}]]
    else:
        prompts, completions = [prompt], [completion]
    return {"prompts": prompts, "completions": completions, **{k: [v] for k, v in fields.items()}}


def _trl_answer(name: str, answer: object) -> object:
    if not isinstance(answer, list | tuple):
        raise TypeError(f"reward function {name!r} (trl) returned {type(answer).__name__}, not a list of scores")
    if len(answer) != 1:
        raise ValueError(f"reward function {name!r} (trl) returned {len(answer)} scores for 1 completion")
    return NOT_APPLICABLE if answer[0] is None else answer[0]


def _verl_arguments(completion: str, fields: dict[str, Any]) -> dict[str, Any]:
    """verl's columns by their short names (`reward_model.ground_truth` is `ground_truth`); `extra_info` the row's
    extra_info object where it has one (verl's data), else every other field."""
    extra = fields.get("extra_info")
    if not isinstance(extra, dict):
        extra = {k: v for k, v in fields.items() if k not in VERL_COLUMNS}
    return {
        "data_source": fields.get("data_source", ""),
        "solution_str": completion,
        "ground_truth": fields.get("ground_truth", ""),
        "extra_info": extra,
    }


def _verl_answer(name: str, answer: object) -> object:
    if not isinstance(answer, dict):
        return answer
    if "score" not in answer:
        raise ValueError(f"reward function {name!r} (verl) returned a dict without 'score': keys {sorted(answer)}")
    metrics = {k: float(v) for k, v in answer.items() if k != "score" and isinstance(v, numbers.Real)}
    return ScoreWithMetrics(answer["score"], metrics)


def adapt(fn: RewardCallable, signature: str, name: str, batch_size: int = 1) -> RewardCallable:
    """`fn` called with rljob's keyword arguments (prompt, completion, messages, the fields), answering as rljob
    reads answers; rljob's own functions as they are. A sync TRL function with `batch_size` > 1 is called with
    the samples that arrive together, up to that many (`BatchedTrl`)."""
    if signature == "rljob":
        return fn
    if signature == "trl" and batch_size > 1 and not is_async(fn):
        return BatchedTrl(fn, name, batch_size)

    def answer(value: object) -> object:
        return _trl_answer(name, value) if signature == "trl" else _verl_answer(name, value)

    if is_async(fn):

        async def called_async(prompt: str, completion: str, messages: Any = None, **fields: Any) -> object:
            return answer(await fn(**peer_arguments(signature, prompt, completion, messages, fields)))

        return called_async

    def called(prompt: str, completion: str, messages: Any = None, **fields: Any) -> object:
        return answer(fn(**peer_arguments(signature, prompt, completion, messages, fields)))

    return called


def peer_arguments(
    signature: str, prompt: str, completion: str, messages: Any, fields: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments a `trl` or `verl` function is called with for one sample."""
    if signature == "trl":
        return _trl_arguments(prompt, completion, messages, fields)
    return _verl_arguments(completion, fields)


# How long a sample waits for others to share its call: the samples of a group, scored together, come within it.
TRL_BATCH_WAIT_SECONDS = 0.005


class BatchedTrl:
    """A sync TRL function called with batches: each sample's call waits TRL_BATCH_WAIT_SECONDS for the others
    that arrive with it (up to `batch_size`), then one call of the function scores them all, off the event
    loop; its list answer is split back, one score (or None) each. A list of the wrong length fails every
    sample of the batch, naming the function."""

    def __init__(self, fn: RewardCallable, name: str, batch_size: int) -> None:
        from rljob_workers.reward.batcher import DynamicBatcher

        self.fn, self.name = fn, name
        self.batcher: DynamicBatcher[tuple[str, str, Any, dict[str, Any]], object] = DynamicBatcher(
            self._score_batch, batch_size=batch_size, max_wait_s=TRL_BATCH_WAIT_SECONDS
        )

    async def __call__(self, prompt: str, completion: str, messages: Any = None, **fields: Any) -> object:
        return await self.batcher.submit((prompt, completion, messages, fields))

    def _score_batch(self, items: list[tuple[str, str, Any, dict[str, Any]]]) -> list[object]:
        arguments = [
            _trl_arguments(prompt, completion, messages, fields) for prompt, completion, messages, fields in items
        ]
        batch = {key: [value for args in arguments for value in args[key]] for key in arguments[0]}
        answer = self.fn(**batch)
        if not isinstance(answer, list | tuple):
            raise TypeError(f"reward function {self.name!r} (trl) returned {type(answer).__name__}, not a list")
        if len(answer) != len(items):
            raise ValueError(
                f"reward function {self.name!r} (trl) returned {len(answer)} scores for {len(items)} completions"
            )
        return [NOT_APPLICABLE if value is None else value for value in answer]

    async def close(self) -> None:
        await self.batcher.close()
