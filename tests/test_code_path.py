"""Your code beside the job: a reward module in the job file's folder imports under `rljob validate --deep` and
`rljob run` with nothing set by hand (the console script's own path does not hold that folder), in the driver
and in every pool's process; the run says so at its start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

pytestmark = [pytest.mark.ray]

RLJOB = str(Path(sys.executable).parent / "rljob")
MY_REWARDS = '''
from text_helpers import answer_of  # in lib/, a folder spec.code.paths names


def exact(prompt, completion, answer, **_):
    """The example's exact match, written by a user beside their job file."""
    return 1.0 if answer_of(completion) == answer.strip() else 0.0
'''
TEXT_HELPERS = """
def answer_of(completion):
    return completion.split("</s>")[0].strip()
"""


def _job(assets: Path, work: Path) -> Path:
    (work / "lib").mkdir(parents=True)
    (work / "my_rewards.py").write_text(MY_REWARDS)
    (work / "lib" / "text_helpers.py").write_text(TEXT_HELPERS)
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(assets / "model"), str(assets / "train.jsonl")
    spec["data"].pop("eval")
    spec["reward"]["functions"] = [{"name": "mine", "kind": "rule", "rule": {"function": "my_rewards:exact"}}]
    spec["algorithm"].update(totalSteps=2, groupSize=4, promptsPerStep=4)
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    # lib/ on the path too; the ConfigMap is a cluster's, for which the local folders stand in here
    spec["code"] = {"paths": ["lib"], "configMap": "my-rewards"}
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_reward_module_beside_the_job_file_imports_in_validate_and_run(assets: Path, tmp_path: Path) -> None:
    job = _job(assets, tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing set by hand
    elsewhere = tmp_path / "elsewhere"  # run from another folder: the job's folder is what counts, not the cwd
    elsewhere.mkdir()
    checked = subprocess.run(
        [RLJOB, "validate", "--deep", str(job)], capture_output=True, text=True, timeout=120, env=env, cwd=elsewhere
    )
    assert checked.returncode == 0, checked.stderr
    out = tmp_path / "out"
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"code: {job.parent}, {job.parent / 'lib'} are on the import path of the driver and every pool (spec.code."
        "configMap is a cluster's; here the job's folder and spec.code.paths stand in)"
    ) in done.stdout
    assert (out / "metrics.jsonl").read_text().count("\n") == 2
