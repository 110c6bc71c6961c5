"""Nothing waits for ever, under the real `rljob run` (#53).

- Reward rules that sleep for ever: an async one that blocks its replica's event loop (its gRPC answers and
  health pings with it: the replica accepts samples and never answers), and a sync one that holds a thread.
  The first is found hung (spec.supervision.hungAfterSeconds) and replaced, its samples scored elsewhere; the
  second is the sample's own timeout (reward.timeoutSeconds), retried. A later, briefer block is measured
  and named in the log. The run reaches its last step, every sample trained once.
- Every rollout replica hung (SIGSTOP) with the replica deadlines out of reach: the run fails at
  spec.progressDeadlineSeconds, saying so and naming what it waited on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import read_metrics

from conftest import REPO, actor_processes, kill_process_tree

pytestmark = [pytest.mark.ray, pytest.mark.serial]

RLJOB = str(Path(sys.executable).parent / "rljob")
STEPS = 24

RULES = '''
import time
from pathlib import Path

MARKS = Path({marks!r})


def _first(name):
    """True for the first caller of the whole run (any replica, any process)."""
    try:
        (MARKS / name).touch(exist_ok=False)
        return True
    except FileExistsError:
        return False


async def blocks(prompt, completion, answer, **_):
    if _first("forever"):
        time.sleep(3600)  # blocks the replica's event loop for good: no answer, no ping
    elif _first("briefly"):
        time.sleep(2.5)  # blocks it a while: measured, named, not fatal
    return float(completion.strip() == answer)


def sleeps(prompt, completion, answer, **_):
    if _first("thread"):
        time.sleep(3600)  # holds one of the replica's threads: the sample's own timeout
    return 0.0
'''


def job(assets: Path, tmp: Path, edit: Any) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    spec["data"].pop("eval", None)
    spec["checkpoint"] = {"dir": str(tmp / "ckpt"), "everySteps": 100}
    spec["algorithm"].update(groupSize=4, promptsPerStep=4, totalSteps=STEPS)
    spec["rollout"]["sampling"]["maxNewTokens"] = 8
    edit(spec)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_reward_rules_that_sleep_for_ever_are_found_and_the_run_finishes(assets: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "stuck_rules.py").write_text(RULES.format(marks=str(marks)))

    def edit(spec: dict[str, Any]) -> None:
        spec["reward"] = {
            "functions": [
                {"name": "blocks", "kind": "rule", "rule": {"function": "stuck_rules:blocks"}},
                {"name": "sleeps", "kind": "rule", "weight": 0.0, "rule": {"function": "stuck_rules:sleeps"}},
            ],
            "replicas": {"min": 2, "max": 2},
            "timeoutSeconds": 3,
            "maxRestarts": 2,
            "onError": "fail",
        }
        spec["supervision"] = {"hungAfterSeconds": 6}

    path, out = job(assets, tmp_path, edit), tmp_path / "out"
    run = subprocess.run(
        [RLJOB, "run", str(path), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=600
    )
    print(run.stdout[-2000:], "\n", run.stderr[-6000:])
    assert sorted(p.name for p in marks.iterdir()) == ["briefly", "forever", "thread"], "a rule never got stuck"
    assert run.returncode == 0, run.stderr[-3000:]
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == list(range(1, STEPS + 1)), "every step once"
    counts = lines[-1]["counts"]
    print(f"ledger: {counts}")
    assert counts["trained"] == 16 * STEPS and counts["excluded_reward_error"] == 0
    assert counts["reward_retries"] >= 1  # the sync rule's timed-out sample, scored on its retry
    stderr = run.stderr
    hung = [line for line in stderr.splitlines() if "reward replica" in line and "starting a replacement" in line]
    assert len(hung) == 1 and "answered no ping" in hung[0], stderr[-3000:]
    # the driver's own line, from the replica's answer to its ping (the same text goes to the status)
    said = r"reward replica reward-\d+: event loop blocked"
    blocked = [line for line in stderr.splitlines() if re.search(said, line)]
    assert blocked and "for 2." in blocked[0] and "functions: blocks" in blocked[0], stderr[-3000:]


def test_a_run_whose_every_rollout_replica_hangs_fails_at_its_progress_deadline(assets: Path, tmp_path: Path) -> None:
    deadline = 20

    def edit(spec: dict[str, Any]) -> None:
        spec["algorithm"]["totalSteps"] = 1000
        spec["algorithm"]["maxStaleness"] = 64
        spec["weightSync"]["everySteps"] = 65  # no weight sync within the test: only the deadline can end it
        spec["rollout"]["requestTimeoutSeconds"] = 3600
        spec["supervision"] = {"hungAfterSeconds": 3600}
        spec["progressDeadlineSeconds"] = deadline

    path, out = job(assets, tmp_path, edit), tmp_path / "out"
    log = tmp_path / "stderr.log"
    run = subprocess.Popen(
        [RLJOB, "run", str(path), "--no-display", "--output", str(out)],
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    try:
        started = time.monotonic()
        while not (out / "metrics.jsonl").exists() or len(read_metrics(out / "metrics.jsonl")) < 2:
            assert run.poll() is None and time.monotonic() - started < 240, log.read_text()[-3000:]
            time.sleep(0.1)
        for replica in actor_processes(run.pid, "RolloutActor"):
            replica.suspend()
        stopped = time.monotonic()
        stdout, _ = run.communicate(timeout=300)
        took = time.monotonic() - stopped
    finally:
        kill_process_tree(run.pid)
    stderr = log.read_text()
    print(stdout[-2000:], "\n", stderr[-3000:], f"\nfailed {took:.0f} s after the stop (deadline {deadline} s)")
    assert run.returncode not in (0, None)
    said = [line for line in stderr.splitlines() + stdout.splitlines() if "spec.progressDeadlineSeconds" in line]
    assert said and "waiting on: prompts generating on rollout-0" in said[0], stderr[-3000:]
    assert took < deadline + 90, took
