"""benchmarks/overhead/run.py, run short: the one-process loop and `rljob run` of the same spec each
train as their own process, and the table compares them row by row (the figures themselves are the
benchmark's, quoted in benchmarks/README.md from a full run)."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO, load_script

pytestmark = [pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(600)]
STEPS = 4


def _bench() -> ModuleType:
    return load_script(REPO / "benchmarks" / "overhead" / "run.py", "bench_overhead")


def test_both_runs_train_every_step_and_the_table_compares_them(
    tmp_path: Path, example_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["model"]["path"] = str(example_model)
    doc["spec"]["data"]["path"] = str(write_jsonl(tmp_path / "train.jsonl", make_problems(256, seed=3)))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    assert _bench().main(["--steps", str(STEPS), "--staleness", "1", "--repeat", "2", "--job", str(job)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    # A line as each run ends (a round cut short still says what it measured), the table after.
    ended = re.findall(
        r"^(one process|rljob run, maxStaleness 1): [\d.]+ s/step, start-up [\d.]+ s, whole process [\d.]+ s$",
        captured.err,
        re.MULTILINE,
    )
    assert ended == ["one process", "rljob run, maxStaleness 1"] * 2, captured.err
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| one process", "| rljob run"))]
    assert [r[0] for r in rows] == ["| one process", "| rljob run, maxStaleness 1"] * 2, out
    # Two rounds, each with its own baseline; the summary's median of two is their rounds' mean.
    ratios = sorted(float(r[3]) for r in rows[1::2])
    median = re.search(r"- rljob run, maxStaleness 1: × one process median ([\d.]+) \(([\d.]+)–([\d.]+)\)", out)
    assert median is not None, out
    assert [float(g) for g in median.groups()] == pytest.approx([sum(ratios) / 2, *ratios], abs=0.011), out
    base, rljob = rows[:2]
    assert float(base[3]) == 1.0 and float(rljob[3]) > 0, out  # the ratio to the baseline
    assert "generate" in base[4] and "waiting for the batch" in rljob[4] and "weight sync" in rljob[4], out
    # Beside the train loop, from each step's metrics.jsonl line: every pool and the driver did work.
    beside = dict(re.findall(r"(rollout busy|reward busy|driver CPU) ([\d.]+)", rljob[4]))
    assert set(beside) == {"rollout busy", "reward busy", "driver CPU"}, out
    assert all(float(seconds) > 0 for seconds in beside.values()), out
    for row in rows:  # start-up (spawn until training starts) and training fit in the whole process
        train, startup, rest, whole = (float(row[i].removesuffix(" s")) for i in (5, 6, 7, 8))
        assert 0 < train < whole and 0 < startup < whole and rest >= 0, row
