"""One run plan, built once: the worker configs are derived once per `rljob run` (at the process boundary,
counted in the command's own process), and the set-up checks read the plan without changing the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rljob_api import load_rljob
from rljob_workers.driver.run.plan import plan_job
from rljob_workers.driver.run.preflight import check_quickly

from conftest import REPO


def _job_file(assets: Path, work: Path) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    spec["data"].pop("eval", None)
    spec["checkpoint"] = {"dir": str(work / "ckpt"), "everySteps": 1}
    spec["algorithm"].update({"groupSize": 2, "promptsPerStep": 2})
    spec["rollout"]["sampling"]["maxNewTokens"] = 4
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.ray
def test_rljob_run_derives_the_worker_configs_once(assets, tmp_path):
    job = _job_file(assets, tmp_path)
    command = [sys.executable, str(REPO / "tests" / "derivations.py"), "run", str(job), "--steps", "1"]
    done = subprocess.run(
        [*command, "--no-display", "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "metrics.jsonl").read_text().count("\n") == 1  # it trained its one step
    assert done.stderr.strip().splitlines()[-1] == "derive_worker_configs calls: 1"


def test_the_set_up_checks_leave_the_job_as_planned(assets, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loaded = load_rljob(_job_file(assets, tmp_path))
    loaded.spec.checkpoint.dir = "ckpt"  # relative, as a user writes it
    before = loaded.model_dump()
    plan = plan_job(loaded, steps=3)
    planned = plan.job.model_dump()
    check_quickly(plan)
    assert plan.job.model_dump() == planned  # the checks read the plan only
    assert loaded.model_dump() == before  # planning made a copy: the loaded job is as it was
    assert plan.job.spec.checkpoint.dir == str(tmp_path / "ckpt") and plan.job.spec.algorithm.total_steps == 3
    assert plan.configs.controller.algorithm.total_steps == 3  # derived from the planned job
