"""Stopping a run: SIGINT and SIGTERM leave a checkpoint and say how to resume; a second signal
stops at once; a second run on the same folder is refused while the first holds it.

Each test runs the real `rljob run` command and signals its process, as Ctrl-C or Kubernetes
deleting the driver pod would.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import read_metrics

from conftest import REPO

pytestmark = [pytest.mark.ray, pytest.mark.serial]

RLJOB = str(Path(sys.executable).parent / "rljob")
SAMPLES_PER_STEP = 4 * 4  # promptsPerStep x groupSize below


def _job_file(assets: Path, work: Path, total_steps: int) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    spec["checkpoint"] = {"dir": str(work / "ckpt"), "everySteps": 1000}  # only a stop writes one
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=total_steps)
    spec["rollout"]["sampling"]["maxNewTokens"] = 6
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(job_file: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    command = [RLJOB, "run", str(job_file), "--no-display", "--output", str(out), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return read_metrics(path)


def _wait_for_steps(run: subprocess.Popen[str], out: Path, steps: int, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while len(_lines(out)) < steps:
        assert run.poll() is None, f"the run ended early ({run.returncode}): {run.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {steps} steps after {seconds:.0f}s"
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_with_a_checkpoint_and_the_printed_command_resumes(assets, tmp_path, sig):
    job_file, out = _job_file(assets, tmp_path, total_steps=200), tmp_path / "out"
    run = _start(job_file, out)
    _wait_for_steps(run, out, 3)
    signalled = time.monotonic()
    run.send_signal(sig)
    stdout, stderr = run.communicate(timeout=120)
    print(f"{sig.name}: exited {run.returncode} after {time.monotonic() - signalled:.1f}s\n{stdout}")
    assert run.returncode == 128 + sig, stderr[-3000:]
    step = int(re.search(rf"stopped by {sig.name} at step (\d+)", stdout).group(1))  # type: ignore[union-attr]
    written = Path(re.search(r"checkpoint: +(\S+)", stdout).group(1))  # type: ignore[union-attr]
    assert written.name == f"step-{step:06d}"
    assert json.loads((written / "state.json").read_text())["step"] == step
    assert [r["step"] for r in _lines(out)] == list(range(1, step + 1))
    resume = re.search(r"resume with: +(.+)", stdout).group(1)  # type: ignore[union-attr]
    if sig != signal.SIGTERM:
        return
    command = [RLJOB, *shlex.split(resume)[1:], "--no-display", "--steps", str(step + 2)]
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    lines = _lines(out)
    assert [r["step"] for r in lines] == list(range(1, step + 3))
    assert lines[-1]["counts"]["trained"] == SAMPLES_PER_STEP * (step + 2), "the counters continue"


def test_a_second_signal_stops_at_once_and_the_folder_is_held_until_then(assets, tmp_path):
    job_file, out = _job_file(assets, tmp_path, total_steps=500), tmp_path / "out"
    first = _start(job_file, out)
    _wait_for_steps(first, out, 1)
    second = subprocess.run(
        [RLJOB, "run", str(job_file), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"--output: {out} is in use by pid {first.pid} on host {os.uname().nodename}; "
        "stop that run or choose another folder"
    ]
    signalled = time.monotonic()
    first.send_signal(signal.SIGINT)
    # Soon after the first: a stop of this tiny job is over in well under 0.3 s, and a signal that comes
    # during the final ray.shutdown() (it blocks the loop, and is all that is left to do) is not told.
    time.sleep(0.05)
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    took = time.monotonic() - signalled
    print(f"stopped at once after {took:.1f}s")
    assert first.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "SIGINT again: stopping at once" in stderr
    assert took < 20


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_ray_starts_stops_at_once_and_leaves_no_process(assets, tmp_path, sig):
    """Ctrl-C (or a pod's SIGTERM) in the first seconds, while Ray's node comes up and the model folder
    is checked: before, SIGINT printed a KeyboardInterrupt traceback and SIGTERM ended the driver
    without a word, and Ray's dashboard and runtime-env agents ran on for a minute."""
    job_file, out = _job_file(assets, tmp_path, total_steps=200), tmp_path / "out"
    run = _start(job_file, out)
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 60
    while not any("RuntimeEnvAgent" in name for name in seen.values()):  # the last of Ray's node to start
        assert run.poll() is None and time.monotonic() < deadline, f"no Ray node came up: {run.communicate()[1]}"
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(run.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    seen[child.pid] = " ".join(child.cmdline())[:80]
        time.sleep(0.05)
    signalled = time.monotonic()
    run.send_signal(sig)
    _, stderr = run.communicate(timeout=60)
    took = time.monotonic() - signalled
    print(f"{sig.name}: exited {run.returncode} after {took:.1f}s; Ray's processes: {sorted(seen.values())}\n{stderr}")
    assert "pools up" not in stderr, "the signal came after the start-up: this test signals too late"
    assert run.returncode == 128 + sig, stderr[-3000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"{sig.name} before the pools were up: stopping at once"
    deadline = time.monotonic() + 5  # what Ray's shutdown stopped has this long to be gone
    while not all(_gone(pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [name for pid, name in seen.items() if not _gone(pid)] == []
