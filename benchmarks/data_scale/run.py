"""A million-row dataset against a thousand-row one: the same `rljob run` (the shipped example, two steps) on a
JSON-lines file of 1,000 rows and of 1,000,000, side by side. Printed for each: the driver's peak memory (the
`rljob run` process's resident set, sampled every 50 ms; its pools are processes of their own) and its start-up
(the launch to the first step in metrics.jsonl), then the growth and the ratio.

The data is read with `datasets`, memory-mapped: the driver holds the rows it draws, an order of the rows'
indices per epoch, and the set-up check of the first 10,000 rows, not the file.

    python benchmarks/data_scale/run.py [--rows 1000000] [--baseline 1000] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
RLJOB = str(Path(sys.executable).parent / "rljob")


@dataclass
class Run:
    rows: int
    peak_mb: float
    first_step_seconds: float


def write_rows(path: Path, count: int) -> Path:
    """`count` arithmetic rows, streamed (the file, not the benchmark, is big)."""
    with path.open("w") as out:
        for i in range(count):
            a, b = i % 9973, (i * 7) % 9949
            out.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    return path


def run_job(model: Path, data: Path, rows: int, work: Path, steps: int) -> Run:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
    spec["data"].pop("eval")
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    spec["logging"] = {"samples": 0}
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = work / "out"
    started = time.monotonic()
    process = subprocess.Popen(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out), "--steps", str(steps)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peak, first = 0.0, float("nan")
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        watched = psutil.Process(process.pid)
        while not done.is_set():
            try:
                peak = max(peak, watched.memory_info().rss / 2**20)
            except psutil.Error:
                return
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    metrics = out / "metrics.jsonl"
    while process.poll() is None:
        if first != first and metrics.exists() and metrics.read_text().strip():
            first = time.monotonic() - started
        time.sleep(0.05)
    done.set()
    sampler.join()
    if process.returncode != 0:
        raise RuntimeError(f"rljob run on {rows} rows failed ({process.returncode})")
    return Run(rows, peak, first)


def main(argv: list[str] | None = None) -> tuple[Run, Run]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=1_000)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    from conftest import cached_tiny_model

    model = cached_tiny_model(REPO / ".cache" / "models" / "tiny-arith")
    with tempfile.TemporaryDirectory(prefix="rljob-data-scale-") as tmp:
        root = Path(tmp)
        runs = []
        for rows in (args.baseline, args.rows):
            work = root / str(rows)
            work.mkdir()
            data = write_rows(work / "train.jsonl", rows)
            runs.append(run_job(model, data, rows, work, args.steps))
    small, large = runs
    for run in runs:
        print(f"{run.rows:>9} rows: driver peak {run.peak_mb:.0f} MB, first step after {run.first_step_seconds:.1f} s")
    print(
        f"growth {large.peak_mb - small.peak_mb:+.0f} MB (target < 200 MB), "
        f"start-up ratio {large.first_step_seconds / small.first_step_seconds:.2f}x (target < 2x)"
    )
    return small, large


if __name__ == "__main__":
    main()
