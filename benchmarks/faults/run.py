"""Faults on the shipped example: kill a rollout replica, a reward replica and a trainer rank of a
running `rljob run examples/arithmetic.yaml`, each at its own step, and check from the run's own
ledger that it survived them.

Each kill is a SIGKILL of the pool's Ray actor process (found by its process title among the run's
own descendants), sent when metrics.jsonl reaches the step. The driver's log says when the
supervisor found the replica dead and when its replacement served; a trainer kill ends the attempt
and `rljob run` starts again from the last checkpoint. The table: fault, step, time to detect, time
to recover, samples lost, samples duplicated, outcome; then the reward curve's start and end.

    python benchmarks/faults/run.py [--kills rollout:10,reward:30,trainer:50] [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import yaml

from rljob_workers.driver.telemetry.ledger import read_ledger

REPO = Path(__file__).resolve().parents[2]
MODEL, DATA = REPO / ".cache" / "models" / "tiny-arith", REPO / ".cache" / "data" / "arithmetic-train.jsonl"
TITLES = {"rollout": "ray::RolloutActor", "reward": "ray::RewardActor", "trainer": "ray::TrainerActor"}
LOG_TAIL = 80
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Kill:
    pool: str
    step: int
    at: float = 0.0  # wall clock of the SIGKILL
    pid: int = 0


def actor_pids(run_pid: int, pool: str) -> list[int]:
    """The pool's actors of this run: its own Ray's, never another run's on the same machine."""
    pids = []
    try:
        children = psutil.Process(run_pid).children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            if child.cmdline()[0].startswith(TITLES[pool]):
                pids.append(child.pid)
        except (psutil.Error, IndexError):
            continue
    return sorted(pids)


def steps_done(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def job_file(work: Path, steps: int, model: Path = MODEL, data: Path = DATA) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
    spec["data"]["eval"]["path"] = str(REPO / spec["data"]["eval"]["path"])  # its rounds must leave the ledger be
    spec["algorithm"]["totalSteps"] = steps
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    path = work / "arithmetic.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_with_kills(work: Path, job: Path, kills: list[Kill]) -> tuple[int, str]:
    """Run the job, killing each pool's actor at its step; (exit code, the driver's log)."""
    log_path, metrics = work / "driver.log", work / "out" / "metrics.jsonl"
    command = [sys.executable, "-m", "rljob_workers.driver.cli", "run", str(job), "--no-display"]
    with log_path.open("w") as log:
        run = subprocess.Popen([*command, "--output", str(work / "out")], stdout=log, stderr=subprocess.STDOUT)
        pending = sorted(kills, key=lambda k: k.step)
        while run.poll() is None:
            if pending and steps_done(metrics) >= pending[0].step and actor_pids(run.pid, pending[0].pool):
                kill = pending.pop(0)
                kill.pid, kill.at = actor_pids(run.pid, kill.pool)[0], time.time()
                os.kill(kill.pid, signal.SIGKILL)
                print(f"killed {kill.pool} (pid {kill.pid}) after step {steps_done(metrics)}", flush=True)
            time.sleep(0.05)
    return run.returncode, log_path.read_text()


def _stamp(line: str) -> float:
    match = STAMP.match(line)
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if match else 0.0


def recovery(log: str, kill: Kill) -> tuple[float, float]:
    """(seconds from the kill until the driver noticed, seconds until the pool served again)."""
    lines = [line for line in log.splitlines() if _stamp(line) >= kill.at - 0.01]
    if kill.pool == "trainer":
        found = next((ln for ln in lines if "restarting the trainer group" in ln), "")
        back = next((ln for ln in lines if "pools up in" in ln and _stamp(ln) >= _stamp(found)), "")
    else:
        found = next((ln for ln in lines if f"{kill.pool} replica" in ln and " died " in ln), "")
        back = next((ln for ln in lines if f"{kill.pool} replica" in ln and " replaced by " in ln), "")
    detect = _stamp(found) - kill.at if found else float("nan")
    return detect, (_stamp(back) - kill.at if back else float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", default="rollout:10,reward:30,trainer:50", help="pool:step, comma-separated")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", type=Path, default=MODEL, help="the example's model (make model)")
    parser.add_argument("--data", type=Path, default=DATA, help="the example's prompts (make model)")
    args = parser.parse_args(argv)
    kills = [Kill(pool, int(step)) for pool, step in (k.split(":") for k in args.kills.split(","))]
    if not args.model.exists() or not args.data.exists():
        raise SystemExit("the example's model and data are missing: run `make model` first")
    with tempfile.TemporaryDirectory(prefix="rljob-faults-") as tmp:
        work = Path(tmp)
        started = time.monotonic()
        rc, log = run_with_kills(work, job_file(work, args.steps, args.model, args.data), kills)
        books = read_ledger(work / "out" / "metrics.jsonl", args.steps, 16)
    outcome = "finished" if rc == 0 and len(books.records) == args.steps else f"exit {rc}"
    print(f"\n{len(kills)} faults injected; run {outcome} in {time.monotonic() - started:.0f}s\n")
    print("| fault | injected at step | time to detect | time to recover | prompts lost | trained twice "
          "| scored twice | outcome |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for kill in kills:
        detect, recover = recovery(log, kill)
        times = f"{detect:.1f} s | {recover:.1f} s"
        counts = f"{books.prompts_lost} | {books.trained_twice} | {books.scored_twice}"
        print(f"| {kill.pool} killed | {kill.step} | {times} | {counts} | {outcome} |")
    final = log[log.rfind("rljob run: ") :]  # the last attempt's status table lists every replacement
    print(f"\nreplacements in the run's final status: {len(re.findall(r'^│ restart ', final, re.M))}")
    rewards = [r["reward_mean"] for r in books.records]
    if rewards:
        print(f"\nreward: step 1 {rewards[0]:.3f}, last 5 steps {sum(rewards[-5:]) / 5:.3f}")
    if outcome != "finished":  # the run's own account of why, for a failure seen only in CI
        print(f"\nthe driver's log, last {LOG_TAIL} lines:\n" + "\n".join(log.splitlines()[-LOG_TAIL:]))
    return 0 if rc == 0 and books.clean else 1


if __name__ == "__main__":
    sys.exit(main())
