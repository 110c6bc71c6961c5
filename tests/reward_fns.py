"""Reward functions the reward tests load by `reward_fns:<name>` (tests/ is on sys.path)."""

from __future__ import annotations

import asyncio
import time


def exact(prompt: str, completion: str, answer: str = "", **_: str) -> float:
    return float(completion.strip() == answer)


async def async_exact(prompt: str, completion: str, answer: str = "", **_: str) -> float:
    await asyncio.sleep(0)
    return float(completion.strip() == answer)


def length(prompt: str, completion: str, **_: str) -> int:
    return len(completion)


def boom(prompt: str, completion: str, **_: str) -> float:
    raise ValueError("no answer field")


def nan(prompt: str, completion: str, **_: str) -> float:
    return float("nan")


def text(prompt: str, completion: str, **_: str) -> str:
    return "high"


def sleepy(prompt: str, completion: str, delay: str = "1", **_: str) -> float:
    time.sleep(float(delay))  # a sync function: runs in the server's thread pool
    return 1.0


async def slow(prompt: str, completion: str, delay: str = "0.3", **_: str) -> float:
    await asyncio.sleep(float(delay))
    return 1.0


NOT_A_FUNCTION = 42


def fails_on_odd_length(prompt: str, completion: str, **_: str) -> float:
    """Raises for about half the samples; the error must name the sample, never become a 0."""
    if len(completion) % 2:
        raise RuntimeError(f"odd length {len(completion)}")
    return 1.0


def newer_is_better(prompt: str, completion: str, sample: object, **_: str) -> float:
    """Uses the sample itself: its policy version and token count."""
    return float(sample.policy_version) + len(sample.token_ids) / 100  # type: ignore[attr-defined]


def exact_or_easy(prompt: str, completion: str, answer: str = "", easy: str = "0", **_: str) -> float:
    """The arithmetic exact match, except that an easy prompt (field easy "1") earns 1 whatever the answer:
    on data mostly of easy prompts, most groups are all-correct from the start and carry nothing to learn."""
    from rljob_workers.tasks.arithmetic import exact_match

    return 1.0 if easy == "1" else exact_match(prompt, completion, answer)
