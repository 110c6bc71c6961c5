"""Resuming a run of episodes: a run of the tool example stopped by SIGTERM while episodes are being played
leaves a checkpoint whose pending prompts are those not yet trained; the resumed run plays their episodes again
from the start and trains each group once, whole."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import read_metrics

from conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.serial]

RLJOB = str(Path(sys.executable).parent / "rljob")
EPISODES_PER_STEP = 8 * 8  # promptsPerStep x groupSize of examples/calculator.yaml


def test_a_stopped_run_of_episodes_resumes_and_plays_its_unfinished_episodes_again(
    calculator: dict[str, Path], tmp_path: Path
) -> None:
    model, data = calculator["model"], calculator["data"]
    doc = yaml.safe_load((REPO / "examples" / "calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
    spec["data"].pop("eval")
    spec["algorithm"]["totalSteps"] = 200
    spec["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "everySteps": 1000}  # only the stop writes one
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(doc))
    run = subprocess.Popen(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while len(read_metrics(out / "metrics.jsonl")) < 3:
        assert run.poll() is None, run.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no 3 steps in 300 s"
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)  # episodes of the next steps are being played (maxStaleness 1)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    step = int(re.search(r"stopped by SIGTERM at step (\d+)", stdout).group(1))  # type: ignore[union-attr]
    written = Path(re.search(r"checkpoint: +(\S+)", stdout).group(1))  # type: ignore[union-attr]
    pending = json.loads((written / "state.json").read_text())["data"]["pending"]
    first = read_metrics(out / "metrics.jsonl")
    before = {p for s in first for p in s["prompt_ids"]}
    assert pending and not set(pending) & before, "the checkpoint's pending prompts are the untrained ones"

    resume = re.search(r"resume with: +(.+)", stdout).group(1)  # type: ignore[union-attr]
    command = [RLJOB, *shlex.split(resume)[1:], "--no-display", "--steps", str(step + 3)]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = read_metrics(out / "metrics.jsonl")
    assert [s["step"] for s in lines] == list(range(1, step + 4))
    trained = [p for s in lines for p in s["prompt_ids"]]
    assert len(trained) == len(set(trained)) == 8 * (step + 3), "every group trained once"
    assert all(s["samples"] == EPISODES_PER_STEP for s in lines), "whole groups of whole episodes"
    after = set(trained) - before
    assert set(pending) <= after, f"unfinished episodes' prompts not played again: {set(pending) - after}"
