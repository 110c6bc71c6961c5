"""The shipped example as a short `rljob run` in a subprocess, for tests that read back what a run writes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO


def example_job(work: Path, model: Path, algorithm: dict[str, Any], **spec: Any) -> Path:
    """examples/arithmetic.yaml on `model` and fresh prompts, with `algorithm`'s settings and `spec`'s sections
    replaced; written to work/job.yaml, its checkpoints under work/."""
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    data = write_jsonl(work / "train.jsonl", make_problems(512, seed=10_000))
    doc["spec"]["model"]["path"], doc["spec"]["data"]["path"] = str(model), str(data)
    doc["spec"]["data"].pop("eval", None)  # held-out eval rounds: not what these runs are for
    doc["spec"]["algorithm"].update(algorithm)
    doc["spec"]["checkpoint"]["dir"] = str(work / "checkpoints")
    doc["spec"].update(spec)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_run(job: Path, output: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`rljob run job --no-display --output output args...`, its output to `log`."""
    command = [str(Path(sys.executable).parent / "rljob"), "run", str(job), "--no-display", "--output", str(output)]
    with log.open("wb") as out:
        return subprocess.Popen([*command, *args], stdout=out, stderr=subprocess.STDOUT)
