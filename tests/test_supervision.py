"""Pool supervision on a real local Ray: a pool's only replica killed mid-run is replaced and the
run finishes with every prompt trained once; past spec.<pool>.maxRestarts the run fails naming
the replica; a killed trainer rank restarts the trainer group from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
import yaml
from test_local_run import assert_each_prompt_trained_once, job_doc, run_job

from rljob_workers.driver.controller.report import StepReport
from rljob_workers.driver.local_run import LocalRun

pytestmark = pytest.mark.ray

RUN_SECONDS = 240  # a run that hangs fails here instead of holding the suite


def _kill_at(step: int, pool: str) -> tuple[Any, list[int]]:
    killed: list[int] = []

    def hook(run: LocalRun, report: StepReport) -> None:
        actors = run.rollout if pool == "rollout" else run.reward
        if not killed and report.step >= step and f"{pool}-0" in actors.actors:
            ray.kill(actors.actors[f"{pool}-0"])  # the process dies; the driver's books are not told
            killed.append(report.step)

    return hook, killed


@pytest.mark.timeout(RUN_SECONDS)
@pytest.mark.parametrize("pool", ["rollout", "reward"])
def test_the_only_replica_of_a_pool_killed_is_replaced(assets, tmp_path, pool):
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=8)
    doc["spec"]["reward"]["replicas"] = {"min": 1, "max": 1}
    hook, killed = _kill_at(2, pool)
    rc, run = run_job(doc, tmp_path, hook)
    assert rc == 0, run.view.message if run.view else rc
    assert killed, "the kill never happened"
    supervisor = run.supervisors[0 if pool == "rollout" else 1]
    [restart] = supervisor.restarts
    took = f"detected after {restart.detected_after:.1f}s, replaced in {restart.replaced_in:.1f}s"
    print(f"{pool}: {took} ({restart.cause})")
    assert restart.replica == f"{pool}-0" and restart.replacement == f"{pool}-1"
    assert restart.replaced_in < 60
    assert_each_prompt_trained_once(run.reports, 8, 4)


@pytest.mark.timeout(RUN_SECONDS)
def test_past_max_restarts_the_run_fails_naming_the_replica(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=40)
    doc["spec"]["reward"].update(replicas={"min": 1, "max": 1}, maxRestarts=0)
    hook, _ = _kill_at(2, "reward")
    rc, run = run_job(doc, tmp_path, hook)
    assert rc == 1
    assert run.view is not None
    assert "reward replica reward-0 died" in run.view.message
    assert "spec.reward.maxRestarts 0" in run.view.message


def _trainer_pids(run: subprocess.Popen[str]) -> list[int]:
    """The trainer actors of this run: its own Ray's, not another run's on the same machine."""
    pids = []
    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            if child.cmdline()[0].startswith("ray::TrainerActor"):  # Ray's title of the actor's process
                pids.append(child.pid)
        except (psutil.Error, IndexError):
            continue
    return pids


def test_a_killed_trainer_restarts_from_the_last_checkpoint(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=10)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    command = [str(Path(sys.executable).parent / "rljob"), "run", str(job_file), "--no-display", "--output", str(out)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + RUN_SECONDS
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()[1][-3000:]
        time.sleep(0.1)
    [pid] = _trainer_pids(run)
    os.kill(pid, signal.SIGKILL)
    _, stderr = run.communicate(timeout=RUN_SECONDS)
    assert run.returncode == 0, stderr[-3000:]
    assert "restarting the trainer group from the last checkpoint (1 of 3)" in stderr
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == list(range(1, 11)), "each step once: the ones after the checkpoint were cut and trained again"
