"""Addition with an exact-match reward: a task that needs no download.

Format, exactly: the prompt is ``f"{a}+{b}="`` with ``a`` and ``b`` non-negative decimal
integers without sign, leading zeros or spaces (``"23+58="``); the answer is
``str(a + b)`` (``"81"``). A completion earns 1.0 when, cut at the first end-of-sequence
marker and stripped of whitespace, it equals the answer; anything else earns 0.0.

Problems are dicts ``{"prompt": str, "answer": str}``, one JSON object per line in a
dataset file, generated deterministically from a seed.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path

# Default operand range, inclusive: two-digit operands, so every prompt has one layout
# ("ab+cd="), and two-digit sums; small enough for a tiny model to learn quickly.
MIN_OPERAND = 10
MAX_OPERAND = 49

# End-of-sequence texts that a decoder may leave in a completion when it does not skip
# special tokens: the tiny model's, then common ones of open models.
EOS_MARKERS: tuple[str, ...] = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>")


def problem(a: int, b: int) -> dict[str, str]:
    """The problem ``a + b`` as ``{"prompt": "a+b=", "answer": "a+b's value"}``."""
    if a < 0 or b < 0:
        raise ValueError(f"operands must be non-negative, got {a} and {b}")
    return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


# The chat form (the arithmetic-chat task): a row holds the question as a user message, without
# the "=" that the tiny chat model's template adds as its generation prompt, and the system prompt
# its warm-up used is the one examples/arithmetic-chat.yaml gives it.
SYSTEM_PROMPT = "add."


def chat_row(problem: dict[str, str]) -> dict[str, object]:
    """A problem as a messages row: ``{"messages": [{"role": "user", "content": "23+58"}], "answer": "81"}``."""
    question = problem["prompt"].removesuffix("=")
    return {"messages": [{"role": "user", "content": question}], "answer": problem["answer"]}


def make_problems(
    n: int, seed: int, max_operand: int = MAX_OPERAND, min_operand: int = MIN_OPERAND
) -> list[dict[str, str]]:
    """``n`` problems with operands drawn uniformly from ``min_operand..max_operand``.

    The same ``(n, seed, max_operand)`` always gives the same list (its own RNG, not the
    global one), and a longer list starts with the shorter one.
    """
    rng = random.Random(seed)
    lo, hi = min_operand, max_operand
    pairs = [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]
    return [problem(a, b) for a, b in pairs]


def held_out_problems(
    n: int,
    seed: int,
    train: Iterable[Mapping[str, object]],
    max_operand: int = MAX_OPERAND,
    min_operand: int = MIN_OPERAND,
) -> list[dict[str, str]]:
    """``n`` problems none of which is among ``train``'s prompts: a held-out split of the task, drawn in an
    order of its own ``seed`` from every problem of the operand range that training does not hold."""
    seen = {p["prompt"] for p in train}
    operands = range(min_operand, max_operand + 1)
    unseen = [p for p in (problem(a, b) for a in operands for b in operands) if p["prompt"] not in seen]
    if len(unseen) < n:
        raise ValueError(f"only {len(unseen)} problems of the operand range are not in the training prompts, not {n}")
    random.Random(seed).shuffle(unseen)
    return unseen[:n]


def write_jsonl(path: str | Path, problems: Iterable[Mapping[str, object]]) -> Path:
    """Write problems one JSON object per line; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, str]]:
    """Read a dataset written by :func:`write_jsonl`, skipping blank lines."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_dataset(path: str | Path, n: int, seed: int, max_operand: int = MAX_OPERAND) -> Path:
    """Generate ``n`` problems from ``seed`` and write them as JSONL to ``path``."""
    return write_jsonl(path, make_problems(n, seed, max_operand))


def strip_completion(completion: str) -> str:
    """The completion cut at its first end-of-sequence marker, whitespace stripped."""
    for marker in EOS_MARKERS:
        completion = completion.split(marker, 1)[0]
    return completion.strip()


def exact_match(prompt: str, completion: str, answer: str, **_: object) -> float:
    """1.0 if the completion, cut at end-of-sequence and stripped, equals the answer.

    ``prompt`` is unused but kept so every rule reward has one signature; extra keyword
    arguments (sample metadata) are ignored.
    """
    return 1.0 if strip_completion(completion) == answer.strip() else 0.0


async def judged_match(prompt: str, completion: str, answer: str, judge_seconds: object = 0, **_: object) -> float:
    """`exact_match` behind a judge that takes `judge_seconds` to answer (a data field of the prompt).

    A stand-in for an LLM judge's or a sandbox's latency, varying across the data as a slow judge's
    does, for trying the elastic reward pool (the real-node test's elastic run uses it).
    """
    await asyncio.sleep(float(str(judge_seconds)))
    return exact_match(prompt, completion, answer)
