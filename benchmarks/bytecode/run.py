"""A short `rljob run` with the environment's bytecode beside the same run compiling every source it imports.

`make setup` and runtimes/vllm.sh install with uv's --compile-bytecode. Without it (uv's default), and where
PYTHONDONTWRITEBYTECODE is set (this project's machines set it) so Python writes no .pyc either, every
process compiles the sources it imports, each time: the driver, each pool actor, Ray's workers. The
baseline makes that so for one run: PYTHONPYCACHEPREFIX points every process of the run at an empty
folder, where it finds no .pyc and, with PYTHONDONTWRITEBYTECODE, leaves none. The candidate is the same
command in the environment as built. Alternating rounds; each prints its wall time, the seconds until the
pools were up (the run's log) and the machine's busy CPU seconds over the run (/proc/stat: run it on an
otherwise idle machine), then the ratios.

    python benchmarks/bytecode/run.py [--rounds 2] [--steps 2] [--job examples/arithmetic.yaml]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
POOLS_UP = re.compile(r"pools up in ([\d.]+)s")


@dataclass
class Run:
    name: str
    wall: float
    pools_up: float
    cpu: float


def busy_cpu_seconds() -> float:
    """The machine's busy CPU seconds since boot (all cores; idle and iowait left out)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def job_doc(folder: Path, source: Path, steps: int) -> dict[str, Any]:
    """The job on a random tiny model and 64 prompts (the tests' plumbing assets), `steps` steps, no eval."""
    from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

    from tiny_models import char_llama

    char_llama(folder / "model", eos_bias=3.0)
    write_jsonl(folder / "train.jsonl", make_problems(64, seed=1))
    doc = yaml.safe_load(source.read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(folder / "model"), str(folder / "train.jsonl")
    spec["data"].pop("eval", None)
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=steps)
    return doc


def run_once(name: str, doc: dict[str, Any], out: Path, compile_sources: bool) -> Run:
    """One `rljob run` of `doc` into `out` (its checkpoints too)."""
    out.mkdir(parents=True)
    doc["spec"]["checkpoint"] = {"dir": str(out / "checkpoints")}
    job = out / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if compile_sources:
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="no-bytecode-")
    rljob = Path(sys.executable).parent / "rljob"
    cpu0, t0 = busy_cpu_seconds(), time.monotonic()
    done = subprocess.run(
        [str(rljob), "run", str(job), "--no-display", "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    wall, cpu = time.monotonic() - t0, busy_cpu_seconds() - cpu0
    if done.returncode:
        raise SystemExit(f"{name}: rljob run exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    up = POOLS_UP.search(done.stdout + done.stderr)
    return Run(name, wall, float(up.group(1)) if up else float("nan"), cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "arithmetic.yaml")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bytecode-bench-") as tmp:
        folder = Path(tmp)
        doc = job_doc(folder, args.job, args.steps)
        runs: dict[str, list[Run]] = {"compiling every source (baseline)": [], "bytecode (as built)": []}
        for i in range(args.rounds):
            for name in runs:
                run = run_once(name, doc, folder / f"out-{i}-{name[:4]}", name.startswith("comp"))
                runs[name].append(run)
                print(f"round {i + 1}  {name:36s} wall {run.wall:6.1f} s  pools up {run.pools_up:5.1f} s  "
                      f"CPU {run.cpu:6.1f} s", flush=True)  # fmt: skip
    base, cand = runs.values()
    for what in ("wall", "pools_up", "cpu"):
        b, c = statistics.median(getattr(r, what) for r in base), statistics.median(getattr(r, what) for r in cand)
        print(f"median {what:8s}: baseline {b:6.1f} s, bytecode {c:6.1f} s, ratio {c / b:.2f}")


if __name__ == "__main__":
    main()
