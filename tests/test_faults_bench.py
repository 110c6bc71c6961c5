"""The fault suite on the shipped example's model: a rollout replica, a reward replica and a
trainer rank killed (SIGKILL of their processes) at random steps of one `rljob run`, which must
finish with no prompt lost or trained twice and no sample scored twice, each fault found in the driver's log
and a replica replaced within a minute (benchmarks/faults/run.py, run short); the ledger's check itself is
tested on a doctored metrics.jsonl."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rljob_workers.driver.telemetry.ledger import read_ledger
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO, load_script

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]
STEPS = 30


def _bench() -> ModuleType:
    return load_script(REPO / "benchmarks" / "faults" / "run.py", "bench_faults")


def test_three_kills_at_random_steps_are_survived(
    tmp_path: Path, example_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = example_model
    data = write_jsonl(tmp_path / "train.jsonl", make_problems(1024, seed=10_000))
    pick = random.Random()
    seed = pick.randrange(1 << 30)
    # One fault at a time: each kill at least 6 steps after the one before, past its recovery (a replacement
    # takes up to ~25 s under CI's load, a few steps); overlapping faults are another test's question.
    chosen = random.Random(seed)
    first = chosen.randrange(3, 9)
    second = first + chosen.randrange(6, 10)
    steps = [first, second, second + chosen.randrange(6, 10)]  # at most 26 = STEPS - 4
    kills = ",".join(f"{pool}:{step}" for pool, step in zip(("rollout", "reward", "trainer"), steps, strict=True))
    print(f"seed {seed}: kills {kills}")
    argv = ["--steps", str(STEPS), "--kills", kills, "--model", str(model), "--data", str(data)]
    rc = _bench().main(argv)
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    assert "3 faults injected; run finished" in out
    assert "replacements in the run's final status: 3" in out  # the driver's RestartHistory, as shown
    rows = [line for line in out.splitlines() if line.startswith("| ") and " killed |" in line]
    assert len(rows) == 3 and all(row.endswith("| 0 | 0 | 0 | finished |") for row in rows), rows
    # each fault seen in the driver's log (nan: never), and a lost replica replaced within a minute
    for row in rows:
        detect, recover = _seconds(row)
        assert not math.isnan(detect) and not math.isnan(recover), f"not found dead, or never back, in the log: {row}"
        assert row.startswith("| trainer") or recover < 60, row


def _seconds(row: str) -> tuple[float, float]:
    """(time to detect, time to recover) of a row of the bench's table."""
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    return float(cells[2].removesuffix(" s")), float(cells[3].removesuffix(" s"))


def test_the_ledger_finds_a_sample_scored_twice_and_a_prompt_lost_or_trained_twice(tmp_path: Path) -> None:
    counts = {"generated": 8, "scored": 8, "trained": 8, "discarded_stale": 0, "excluded_reward_error": 0}
    rows = [
        {"prompt_ids": ["a"], "counts": counts},
        {"prompt_ids": ["b"], "counts": dict(counts, generated=16, scored=16, trained=16)},
    ]
    metrics = tmp_path / "metrics.jsonl"

    def write(rows: list[dict[str, Any]]) -> None:
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(rows)
    books = read_ledger(metrics, 2, 1)
    assert (books.prompts_lost, books.trained_twice, books.scored_twice) == (0, 0, 0)
    # a re-sent sample whose second answer was counted too; a prompt trained again; one never trained
    rows[1]["counts"] = dict(counts, generated=16, scored=17, trained=16)
    rows[1]["prompt_ids"] = ["a"]
    write(rows)
    books = read_ledger(metrics, 2, 1)
    assert (books.prompts_lost, books.trained_twice, books.scored_twice) == (1, 1, 1)
