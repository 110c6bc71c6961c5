"""Whole runs on a real local Ray cluster: faults, reward-error policies, staleness bounds, resume.

These use a random tiny model (the plumbing, not learning); tests/test_algorithm_runs.py trains the
shipped example's model.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api import parse_rljob
from rljob_workers.driver.controller.report import StepReport
from rljob_workers.driver.controller.weight_sync import answers
from rljob_workers.driver.placement.launcher import RayTrainer
from rljob_workers.driver.run.plan import plan_job
from rljob_workers.driver.run.session import RunSession
from rljob_workers.driver.telemetry.metrics import read_metrics

from conftest import REPO, kill_process_tree

pytestmark = pytest.mark.ray


def job_doc(assets: Path, work: Path, **algorithm: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(assets / "model")
    spec["data"]["path"] = str(assets / "train.jsonl")
    # No held-out eval rounds: not what these runs test, and a round's samples would pass through the rewards
    # these tests count or hold (test_cluster_run's held reward would hold step 1 behind the step-0 round).
    spec["data"].pop("eval", None)
    spec["checkpoint"] = {"dir": str(work / "ckpt"), "everySteps": 2}
    spec["algorithm"].update({"groupSize": 4, "promptsPerStep": 4, "totalSteps": 6, **algorithm})
    spec["rollout"]["sampling"]["maxNewTokens"] = 6
    return doc


def run_job(doc: dict[str, Any], work: Path, hook: Any = None) -> tuple[int, RunSession]:
    job = parse_rljob(copy.deepcopy(doc))
    run = RunSession(plan_job(job, output=work / "out", display=False), step_hook=hook)
    return asyncio.run(run.main()), run


def assert_each_prompt_trained_once(reports: list[StepReport], steps: int, per_step: int) -> None:
    trained = [p for r in reports for p in r.prompt_ids]
    assert [r.step for r in reports] == list(range(1, steps + 1))
    assert len(trained) == len(set(trained)) == steps * per_step


def test_killed_rollout_replica_moves_its_prompts(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=1)
    doc["spec"]["rollout"]["replicas"] = 2
    doc["spec"]["rollout"]["sampling"]["maxNewTokens"] = 96
    killed: list[int] = []
    live: list[list[str]] = []
    watchers: list[asyncio.Task[None]] = []

    async def kill_once_dispatched_to(run: RunSession) -> None:
        # Killed the moment the controller hands rollout-0 a prompt, so the kill lands mid-generation. Checked at
        # step reports instead, rollout-0 was sometimes idle at all five (the random model ends its samples
        # early; 1 of the CI runs here). Killed whenever it had prompts in flight, with ray.kill, it once finished
        # them all before the kill landed (lost_replica 0, in CI): now a new prompt and a SIGKILL, which is instant.
        pid = await run.pools.rollout.actors["rollout-0"].pid.remote()
        seen = None
        while not killed:
            replica = run.pools.clients.replicas.get("rollout-0")
            now = replica.in_flight if replica is not None else 0
            if seen is not None and now > seen:
                os.kill(pid, signal.SIGKILL)
                run.pools.rollout.kill("rollout-0")  # out of the pool too: the supervisor does not replace it
                killed.append(len(run.reports))
            seen = now
            await asyncio.sleep(0.001)

    def kill_when_busy(run: RunSession, report: StepReport) -> None:
        live.append([r.name for r in run.pools.clients.live()])
        if not watchers:
            watchers.append(asyncio.get_running_loop().create_task(kill_once_dispatched_to(run)))

    rc, run = run_job(doc, tmp_path, kill_when_busy)
    assert rc == 0
    assert killed and killed[0] < 6, "rollout-0 never had work in flight to lose"
    assert_each_prompt_trained_once(run.reports, 6, 4)
    last = run.reports[-1].counts
    assert last.lost_replica > 0
    assert live[0] == ["rollout-0", "rollout-1"] and live[-1] == ["rollout-1"]
    assert max(r.staleness_max for r in run.reports) <= 1


def test_a_rollout_replica_lost_while_the_weight_group_forms_does_not_stall_the_run(assets, tmp_path, monkeypatch):
    """rollout-0 dies after the controller asked its weight ranks and before it joined the group. gloo's other
    members cannot tell: before the fix, the trainer waited for it until weightSync.timeoutSeconds (600 s here) and
    the run stood still that long. Its failed JoinWeightGroup now aborts the group, and the version reaches
    rollout-1 alone at once."""
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=3)
    doc["spec"]["rollout"]["replicas"] = 2
    doc["spec"]["weightSync"]["timeoutSeconds"] = 600
    job = parse_rljob(copy.deepcopy(doc))
    run = RunSession(plan_job(job, output=tmp_path / "out", display=False))
    open_group = RayTrainer.open_group
    killed: list[float] = []

    async def open_group_once_rollout_0_is_dead(trainer: RayTrainer, group_id: str, world: int, *rest: Any) -> Any:
        if not killed:  # the first group: the trainer and both replicas
            replica = run.pools.clients.replicas["rollout-0"]
            run.pools.rollout.kill("rollout-0")
            while await answers(replica):
                await asyncio.sleep(0.05)
            killed.append(time.monotonic())
        return await open_group(trainer, group_id, world, *rest)

    monkeypatch.setattr(RayTrainer, "open_group", open_group_once_rollout_0_is_dead)
    rc = asyncio.run(run.main())
    assert rc == 0
    assert killed, "no weight group was formed"
    took = time.monotonic() - killed[0]
    assert took < 120, f"the run ended {took:.0f}s after rollout-0 died: it stalled on the weight group"
    assert_each_prompt_trained_once(run.reports, 3, 4)
    sync = run.pools.weight_sync
    assert sync is not None and sync.members == ("rollout-1",)  # re-formed without rollout-0


def test_reward_error_excluded_and_counted(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=2, totalSteps=4)
    doc["spec"]["reward"]["functions"] = [
        {"name": "exact", "kind": "rule", "rule": {"function": "reward_fns:exact"}},
        {"name": "flaky", "kind": "rule", "weight": 0.0, "rule": {"function": "reward_fns:fails_on_odd_length"}},
    ]
    doc["spec"]["reward"].update(onError="exclude", retries=1)
    rc, run = run_job(doc, tmp_path)
    assert rc == 0
    counts = run.reports[-1].counts
    assert counts.excluded_reward_error > 0
    # Every generated sample is accounted for: trained, excluded, or still in flight at the end.
    assert counts.trained + counts.excluded_reward_error <= counts.generated
    assert counts.trained == sum(r.samples for r in run.reports)
    assert sum(r.samples for r in run.reports) < 4 * 4 * 4, "excluded samples must not be trained"
    assert max(r.staleness_max for r in run.reports) <= 2


def test_reward_error_fails_the_run_naming_sample_and_function(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=0)
    doc["spec"]["reward"]["functions"] = [
        {"name": "flaky", "kind": "rule", "rule": {"function": "reward_fns:fails_on_odd_length"}}
    ]
    doc["spec"]["reward"].update(onError="fail", retries=0)
    rc, run = run_job(doc, tmp_path)
    assert rc == 1
    assert run.view is not None
    message = run.view.message
    assert "reward function 'flaky' raised RuntimeError on sample 'e0-" in message
    assert "odd length" in message


def test_synchronous_run_trains_on_policy(assets, tmp_path):
    rc, run = run_job(job_doc(assets, tmp_path, maxStaleness=0, totalSteps=4), tmp_path)
    assert rc == 0
    assert all(r.staleness_max == 0 for r in run.reports)
    assert run.reports[-1].counts.discarded_stale == 0
    assert_each_prompt_trained_once(run.reports, 4, 4)
    # Every pool worked and, on policy, every pool waited on the others: none was idle throughout or never.
    idle = run.telemetry.idle_fractions()
    assert set(idle) == {"rollout", "trainer", "reward"} and all(0 < f < 1 for f in idle.values()), idle


def test_a_reward_curve_that_cannot_be_drawn_leaves_the_trained_run_a_success(assets, tmp_path):
    """The run trained and saved its checkpoint: a picture that cannot be written is a one-line warning,
    not a traceback and exit code 1."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(job_doc(assets, tmp_path, totalSteps=2)))
    out = tmp_path / "out"
    (out / "reward-curve.png").mkdir(parents=True)  # where the curve goes: not a file that can be opened
    rljob = str(Path(sys.executable).parent / "rljob")
    command = [rljob, "run", str(job_file), "--no-display", "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "reward curve not drawn" in line]
    assert len(warnings) == 1 and "IsADirectoryError" in warnings[0] and "reward-curve.png" in warnings[0]
    assert (tmp_path / "ckpt" / "step-000002").is_dir()


def test_frozen_layers_stay_out_of_the_sync_and_the_replica_still_samples_the_trained_policy(assets, tmp_path):
    """spec.trainer.freeze: each sync sends only the trained weights. On policy (maxStaleness 0) the
    rollout's log-probs are the trainer's own only if the replica's weights equal the trainer's, frozen
    ones (as loaded) and trained ones (as synced) alike: every step's ratio is 1."""
    doc = job_doc(assets, tmp_path, maxStaleness=0, totalSteps=4)
    doc["spec"]["trainer"]["freeze"] = ["model.embed_tokens.*", "model.layers.0.*"]
    rc, run = run_job(doc, tmp_path)
    assert rc == 0
    ratios = [r.train_metrics["ratio_mean"] for r in run.reports]
    print(f"ratio_mean per step: {ratios}")
    assert ratios == pytest.approx([1.0] * 4, abs=1e-3)


def _steps(path: Path) -> list[dict[str, Any]]:
    return read_metrics(path)


def test_killed_run_resumes_at_its_checkpoint(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=8)
    doc["spec"]["rollout"]["sampling"]["maxNewTokens"] = 24
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "rljob_workers.driver.cli", "run", str(job_file), "--no-display", "--output", str(out)]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 180
    while len(_steps(out / "metrics.jsonl")) < 5 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, (
        f"the run ended (rc {proc.returncode}) before it was killed:\n{proc.communicate()[1].decode()}"
    )
    kill_process_tree(proc.pid)  # the driver and the Ray cluster it started
    proc.wait()
    first = _steps(out / "metrics.jsonl")
    assert 5 <= len(first) < 8, "the run should have been killed between checkpoints"
    checkpoint_step = max(r["step"] for r in first if r["checkpoint"] and r["checkpoint"].endswith(f"{r['step']:06d}"))

    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The reward curve is drawn while Ray shuts down, and is there once the command has ended.
    curve = re.search(r"^reward curve: +(.+)$", resumed.stdout, re.MULTILINE)
    assert curve is not None, resumed.stdout[-2000:]
    assert Path(curve.group(1)).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No gRPC core INFO lines (every run ended with "Got goaway" when Ray stopped the pools' servers).
    grpc_info = re.findall(r"^I\d{4} [\d:.]+ +\d+ \w+\.cc:\d+\].*$", resumed.stderr, re.MULTILINE)
    assert not grpc_info, grpc_info
    lines = _steps(out / "metrics.jsonl")
    # Each step once: the lines of steps trained after the checkpoint were cut, then trained again.
    assert [r["step"] for r in lines] == list(range(1, 9))
    second = lines[checkpoint_step:]
    assert [r["version"] for r in second] == list(range(checkpoint_step + 1, 9))
    before = [p for r in lines[:checkpoint_step] for p in r["prompt_ids"]]
    after = [p for r in second for p in r["prompt_ids"]]
    assert len(set(before) | set(after)) == len(before) + len(after) == 8 * 4, "a prompt was trained twice"
    # The sample counters continue from the checkpoint (4 prompts x 4 samples a step, all scored).
    assert [r["counts"]["trained"] for r in lines] == [16 * step for step in range(1, 9)]
