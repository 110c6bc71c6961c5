"""The driver of `rljob run` stays light: it never loads torch, its pools do. On a small machine the
pools start beside it on the same cores, and a torch import (about 1.2 CPU-seconds here, 2.9 with
transformers' model check) taken by the driver is taken from their start-up (`benchmarks/overhead`).

The test runs the real command and reads which shared libraries each of its processes has mapped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from conftest import REPO

pytestmark = pytest.mark.ray

RLJOB = str(Path(sys.executable).parent / "rljob")


def _maps_torch(pid: int) -> bool:
    """Whether process `pid` has torch's C++ library mapped (it imported torch)."""
    try:
        return "/torch/lib/libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # gone meanwhile
        return False


def _steps_done(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_the_driver_never_loads_torch_while_its_pools_do(assets, tmp_path):
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    spec["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "everySteps": 1000}
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=1000)
    job, out = tmp_path / "job.yaml", tmp_path / "out"
    job.write_text(yaml.safe_dump(doc))
    run = subprocess.Popen(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while _steps_done(out) < 3:  # trained and synced weights: every per-step path of the driver ran
            assert run.poll() is None, f"the run ended early ({run.returncode}): {run.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "no 3 steps in 180 s"
            time.sleep(0.2)
        pools = [p.pid for p in psutil.Process(run.pid).children(recursive=True) if _maps_torch(p.pid)]
        assert len(pools) >= 2, "the rollout and trainer processes load torch: the check sees it"
        assert not _maps_torch(run.pid), "the driver loaded torch"
    finally:
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
