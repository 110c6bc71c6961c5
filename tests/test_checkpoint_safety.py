"""Checkpoints that cannot tear (#53): a save killed mid-write, a truncated or deleted `latest`, and a disk
that fills each leave a checkpoint a resume starts from, and the resumed run trains on with nothing lost.

Every case runs the real `rljob run` and looks at the folder it leaves, as a user (or the driver pod's
restart) would. The kill lands mid-write for certain: the trainer's process is stopped (SIGSTOP) the moment
the step's staging folder appears, its unfinished state checked, and only then is the whole tree killed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import read_metrics
from rljob_workers.trainer import checkpoint

from conftest import REPO, actor_processes, kill_process_tree

pytestmark = [pytest.mark.ray, pytest.mark.serial]

RLJOB = str(Path(sys.executable).parent / "rljob")
SAMPLES_PER_STEP = 4 * 4  # promptsPerStep x groupSize below


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model wide enough (~20 MB of weights, twice that of optimizer state) that a save takes long
    enough to be caught in the middle."""
    from tiny_models import char_llama

    path = tmp_path_factory.mktemp("wide") / "model"
    char_llama(path, hidden=512, eos_bias=3.0)
    return path


def _job_file(assets: Path, work: Path, total_steps: int, model: Path | None = None, ckpt: Path | None = None) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(model or assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    spec["checkpoint"] = {"dir": str(ckpt or work / "ckpt"), "everySteps": 2, "keep": 2}
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=total_steps)
    spec["rollout"]["sampling"]["maxNewTokens"] = 6
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(job_file: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [RLJOB, "run", str(job_file), "--no-display", "--output", str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420)
    print(f"$ {' '.join(command)} -> {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return done


def _trained_on(out: Path, last_step: int) -> None:
    """Every step once, in order, and the counters continued through the resume: nothing lost or twice."""
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == list(range(1, last_step + 1))
    assert lines[-1]["counts"]["trained"] == SAMPLES_PER_STEP * last_step


def _listing(ckpt: Path) -> list[str]:
    return sorted(p.name for p in ckpt.iterdir() if p.name != ".rljob.lock")  # the run's folder lock


def test_a_save_killed_mid_write_resumes_from_the_previous_checkpoint(assets, wide_model, tmp_path):
    job_file, out, ckpt = _job_file(assets, tmp_path, 6, model=wide_model), tmp_path / "out", tmp_path / "ckpt"
    command = [RLJOB, "run", str(job_file), "--no-display", "--output", str(out)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not checkpoint.is_complete(checkpoint.step_dir(ckpt, 2)):
            assert run.poll() is None, run.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint of step 2 in 300 s"
            time.sleep(0.05)
        (trainer,) = actor_processes(run.pid, "TrainerActor")
        staging = checkpoint.staging_dir(ckpt, 4)
        while not staging.exists():  # polled tightly: the save of step 4 has begun
            assert run.poll() is None and time.monotonic() < deadline, "step 4 was never saved"
            assert not checkpoint.step_dir(ckpt, 4).exists(), "the save of step 4 finished before it was seen"
        trainer.suspend()
        written = sorted(p.name for p in staging.rglob("*"))
        print(f"stopped mid-write; the staging folder holds {written}")
        assert not (staging / checkpoint.STATE).exists(), "the save was past its last file"
    finally:
        kill_process_tree(run.pid)
    assert (ckpt / checkpoint.LATEST).read_text() == "step-000002"
    resumed = _run(job_file, out, "--resume")
    assert resumed.returncode == 0
    assert f"removed {staging}, a save that did not finish" in resumed.stderr
    assert "resuming from " + str(checkpoint.step_dir(ckpt, 2)) in resumed.stderr
    _trained_on(out, 6)
    assert _listing(ckpt) == [checkpoint.LATEST, "step-000004", "step-000006"]


@pytest.fixture(scope="module")
def four_steps(assets, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of four steps: checkpoints of steps 2 and 4, `latest` naming step 4."""
    work = tmp_path_factory.mktemp("four")
    done = _run(_job_file(assets, work, 4), work / "out")
    assert done.returncode == 0
    assert (work / "ckpt" / checkpoint.LATEST).read_text() == "step-000004"
    return work


def _tear(latest: Path, how: str) -> None:
    if how == "truncated":
        latest.write_text(latest.read_text()[:7])  # "step-00": cut as a write torn by a crash would be
    else:
        latest.unlink()


@pytest.mark.parametrize("how", ["truncated", "deleted"])
def test_a_torn_latest_resumes_from_the_newest_whole_checkpoint(assets, four_steps, tmp_path, how):
    work = tmp_path / "work"
    shutil.copytree(four_steps, work)
    ckpt, out = work / "ckpt", work / "out"
    _tear(ckpt / checkpoint.LATEST, how)
    job_file = _job_file(assets, work, 6)
    if how == "deleted":  # a plain run does not start over beside the step folders
        refused = _run(job_file, out)
        assert refused.returncode == 2
        assert f"{ckpt} already holds checkpoints; pass --resume" in refused.stderr
    resumed = _run(job_file, out, "--resume")
    assert resumed.returncode == 0
    warnings = [line for line in resumed.stderr.splitlines() if "resuming from the newest whole one" in line]
    assert len(warnings) == 1 and warnings[0].endswith(str(checkpoint.step_dir(ckpt, 4))), resumed.stderr
    _trained_on(out, 6)
    assert (ckpt / checkpoint.LATEST).read_text() == "step-000006"


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.decode().strip()}")


def _checkpoint_bytes(four_steps: Path) -> int:
    step = checkpoint.step_dir(four_steps / "ckpt", 4)
    return sum(p.stat().st_size for p in step.rglob("*") if p.is_file())


def test_a_full_disk_fails_the_save_and_leaves_the_previous_checkpoint_whole(assets, four_steps, tmp_path):
    size = _checkpoint_bytes(four_steps)
    ckpt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    _mount_tmpfs(ckpt, str(size * 3 // 2))  # one checkpoint fits, a second beside it does not
    try:
        job_file, out = _job_file(assets, tmp_path, 6, ckpt=ckpt), tmp_path / "out"
        full = _run(job_file, out)
        assert full.returncode == 1
        failure = [line for line in full.stdout.splitlines() if line.startswith("run failed:")]
        assert len(failure) == 1, "the failed save is not named"
        assert f"saving checkpoint step 4 to {checkpoint.step_dir(ckpt, 4)} failed: no space left" in failure[0]
        assert _listing(ckpt) == [checkpoint.LATEST, "step-000002"], "a partial folder stayed"
        assert json.loads((checkpoint.step_dir(ckpt, 2) / checkpoint.STATE).read_text())["step"] == 2
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(ckpt)], check=True)
        resumed = _run(job_file, out, "--resume")
        assert resumed.returncode == 0
        _trained_on(out, 6)
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)
