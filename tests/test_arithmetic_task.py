"""The arithmetic task: its exact format, deterministic generation and the reward."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from rljob_workers.tasks import arithmetic
from rljob_workers.tasks.arithmetic import exact_match, judged_match


def test_problem_format() -> None:
    assert arithmetic.problem(23, 58) == {"prompt": "23+58=", "answer": "81"}
    assert arithmetic.problem(0, 7) == {"prompt": "0+7=", "answer": "7"}
    with pytest.raises(ValueError, match="non-negative"):
        arithmetic.problem(-1, 2)


def test_generation_is_deterministic_and_in_range() -> None:
    a = arithmetic.make_problems(200, seed=3)
    assert a == arithmetic.make_problems(200, seed=3)
    assert a[:50] == arithmetic.make_problems(50, seed=3)
    assert a != arithmetic.make_problems(200, seed=4)
    for p in a:
        match = re.fullmatch(r"(\d+)\+(\d+)=", p["prompt"])
        assert match, p
        x, y = int(match[1]), int(match[2])
        assert arithmetic.MIN_OPERAND <= min(x, y) <= max(x, y) <= arithmetic.MAX_OPERAND
        assert p["answer"] == str(x + y)


def test_operand_range_is_a_parameter() -> None:
    problems = arithmetic.make_problems(100, seed=0, max_operand=3, min_operand=0)
    prompts = {p["prompt"] for p in problems}
    assert prompts <= {f"{x}+{y}=" for x in range(4) for y in range(4)}
    assert len(prompts) > 8


def test_generation_leaves_global_random_alone() -> None:
    import random

    random.seed(1)
    expected = random.random()
    random.seed(1)
    arithmetic.make_problems(10, seed=9)
    assert random.random() == expected


def test_jsonl_round_trip(tmp_path: Path) -> None:
    path = arithmetic.write_dataset(tmp_path / "sub" / "train.jsonl", n=5, seed=1)
    lines = path.read_text().splitlines()
    assert len(lines) == 5
    assert json.loads(lines[0]).keys() == {"prompt", "answer"}
    assert arithmetic.read_jsonl(path) == arithmetic.make_problems(5, seed=1)


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("81", 1.0),
        (" 81\n", 1.0),
        ("81</s>", 1.0),
        ("81</s><pad><pad>", 1.0),
        ("81 </s>", 1.0),
        ("81<|endoftext|>", 1.0),
        ("81</s>99", 1.0),  # what follows the end of sequence is not part of the answer
        ("8", 0.0),
        ("811", 0.0),
        ("081", 0.0),
        ("810", 0.0),
        ("8181", 0.0),
        ("81+0", 0.0),
        ("", 0.0),
        ("</s>81", 0.0),
    ],
)
def test_exact_match(completion: str, reward: float) -> None:
    assert exact_match("23+58=", completion, "81") == reward


def test_exact_match_ignores_extra_metadata() -> None:
    assert exact_match(prompt="1+1=", completion="2", answer="2", policy_version=3) == 1.0


def test_judged_match_takes_the_prompts_judge_seconds_and_scores_like_exact_match() -> None:
    async def timed(judge_seconds: object) -> tuple[float, float, float]:
        started = time.monotonic()
        right = await judged_match("2+3=", "5", "5", judge_seconds=judge_seconds)
        wrong = await judged_match("2+3=", "6", "5", judge_seconds=judge_seconds)
        return right, wrong, time.monotonic() - started

    right, wrong, took = asyncio.run(timed("0.2"))  # a JSON string field, as a dataset may give it
    assert (right, wrong) == (1.0, 0.0) and 0.4 <= took < 1.0, took
    assert asyncio.run(timed(0))[2] < 0.1  # absent or zero: no wait
