"""vLLM's CPU build as the rollout engine, run for real in its own environment (runtimes/vllm.sh builds it;
`.ci/run` does, cached by the content hash of its pins).

The adapter's checks run in that environment (tests/vllm_probe.py, one engine for all of them): it samples
what the policy gives, new weights reach its worker process through the weight group and no KV of the old
version serves the new one, a pulled version loads in the worker, an update in flight pauses and resumes the
running samples, and a sync with nobody sending fails within its timeout. Then `rljob run` of the shipped
example with vLLM as its rollout engine, a replica killed on the way. Skips name what is missing where vLLM's
environment is not built.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from rljob_workers.driver.telemetry.ledger import read_ledger
from rljob_workers.driver.telemetry.metrics import read_metrics
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO, kill_process_tree
from tiny_models import char_llama

VLLM_ENV = REPO / "runtimes" / "vllm.sh"
RLJOB = Path(sys.executable).parent / "rljob"
PROBE = Path(__file__).with_name("vllm_probe.py")
# fp32 on both sides: what the engine's log-probs and a transformers forward of the same weights may differ by
LOGPROB_TOLERANCE = 1e-4


def vllm_python() -> str | None:
    """The interpreter of vLLM's runtime, if runtimes/vllm.sh has built it."""
    if subprocess.run(["bash", str(VLLM_ENV), "check"], capture_output=True).returncode != 0:
        return None
    return subprocess.run(["bash", str(VLLM_ENV), "path"], capture_output=True, text=True, check=True).stdout.strip()


VLLM_PYTHON = vllm_python()
pytestmark = [
    pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM's runtime is not built: run runtimes/vllm.sh"),
    pytest.mark.ray,
    pytest.mark.slow,
]


def rljob_path() -> str:
    """rljob's source folders, for an interpreter of another environment (as `rljob run` passes them)."""
    return os.pathsep.join(str(REPO / folder) for folder in ("api", "workers", "proto/gen"))


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What tests/vllm_probe.py measured, on a random tiny Llama with tied embeddings (vLLM reloads its output
    layer specially) that never ends a sample early (long samples for the update in flight), and takes prompts
    longer than one engine step's tokens."""
    model = char_llama(tmp_path_factory.mktemp("vllm") / "model", heads=2, tied=True, eos_bias=-20.0, positions=4096)
    assert VLLM_PYTHON is not None
    env = {**os.environ, "PYTHONPATH": rljob_path()}
    done = subprocess.run(
        [VLLM_PYTHON, str(PROBE), str(model)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-5000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(found, indent=1))
    return found


def test_the_engine_samples_what_the_policy_gives(probe: dict[str, Any]) -> None:
    assert probe["weight_ranks"] == 1
    assert probe["gap_version_0"] <= LOGPROB_TOLERANCE, probe


def test_new_weights_reach_the_worker_through_the_group_and_no_old_kv_serves_them(probe: dict[str, Any]) -> None:
    """The bytes arrive in vLLM's worker process, counted there, not in this or the server's; the same prompts
    generated again (their KV cached under the old version) follow the new weights, not the old."""
    [worker] = probe["worker_counters"]
    assert worker["pid"] != probe["probe_pid"], "the weights were received by the server's process"
    assert worker["rank"] == 1 and worker["loads"] == 1
    assert worker["bytes_received"] == probe["bytes_sent"] == probe["bytes_received"], probe
    assert worker["buckets_received"] >= 2  # the plan's several buckets, each its own broadcast
    assert probe["gap_version_1"] <= LOGPROB_TOLERANCE, probe
    assert probe["gap_to_version_0"] > 0.1, "version 1 looks like version 0: the update changed nothing"
    assert probe["versions_version_1"] == [[1, 1]]


def test_a_version_pulled_by_the_server_loads_in_the_worker(probe: dict[str, Any]) -> None:
    assert probe["gap_version_2"] <= LOGPROB_TOLERANCE, probe


def test_an_update_in_flight_pauses_the_running_samples_and_they_span_both_versions(probe: dict[str, Any]) -> None:
    """Samples running when version 3 came carry the first and last versions they span; each token's log-prob is
    the one the version that sampled it gives (the old one up to some token, the new one from there)."""
    assert [2, 3] in probe["inflight_versions"], probe["inflight_versions"]
    assert max(probe["inflight_split_gaps"]) <= LOGPROB_TOLERANCE, probe["inflight_split_gaps"]
    assert probe["inflight_update_seconds"] < 10, probe


def test_under_drain_a_version_that_replaced_the_staged_one_serves_under_its_own_number(probe: dict[str, Any]) -> None:
    """Two versions arrive while samples run; once they end the newer serves, labelled as itself (it was served
    as the older one's number, and its own switch then failed, when the worker's one staged slot was replaced)."""
    assert probe["superseded_running_versions"] == [[3, 3]], probe
    assert probe["superseded_served"] == 5, probe
    assert probe["superseded_versions"] == [[5, 5]], probe
    assert probe["superseded_gap"] <= LOGPROB_TOLERANCE, probe


def test_a_sync_that_cannot_finish_fails_within_its_timeout(probe: dict[str, Any]) -> None:
    assert probe["timeout_error"], "a broadcast nobody sent was taken"
    assert 2.5 <= probe["timeout_seconds"] < 20, probe


def test_a_prompt_longer_than_one_engine_step_samples_what_the_policy_gives(probe: dict[str, Any]) -> None:
    assert probe["beyond_one_step_error"] is None, probe["beyond_one_step_error"]
    assert probe["beyond_one_step_samples"] == 2 and probe["gap_beyond"] <= LOGPROB_TOLERANCE, probe


def _rollout_actor(run: subprocess.Popen[str]) -> int | None:
    """The pid of the run's rollout replica (its Ray actor's process), if it is up."""
    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            if child.cmdline()[0].startswith("ray::RolloutActor"):
                return int(child.pid)
        except (psutil.Error, IndexError):
            continue
    return None


def test_rljob_run_with_vllm_learns_survives_a_killed_replica_and_reports_the_mismatch(
    example_model: Path, tmp_path: Path
) -> None:
    """examples/arithmetic-vllm.yaml (what `make run-vllm` runs) with `rljob run --rollout-python`: the reward
    rises from the weak model's to 0.8 and more; its rollout replica, SIGKILLed at step 20, is replaced, pulls
    the current version and the run goes on (every prompt trained once, every sample scored once, nothing staler
    than maxStaleness); each step reports the engine/trainer log-prob mismatch, small in fp32."""
    assert VLLM_PYTHON is not None
    doc = yaml.safe_load((REPO / "examples" / "arithmetic-vllm.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(example_model)
    spec["data"]["path"] = str(write_jsonl(tmp_path / "train.jsonl", make_problems(4096, seed=10_000)))
    command, out, log = _vllm_run(doc, tmp_path)
    with log.open("w") as sink:
        run = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True)
        try:
            killed = _kill_the_replica_at(run, out / "metrics.jsonl", step=20)
            rc = run.wait(timeout=900)
        finally:
            if run.poll() is None:
                kill_process_tree(run.pid)
    output = log.read_text()
    assert rc == 0, output[-5000:]
    records = read_metrics(out / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in records]
    steps = doc["spec"]["algorithm"]["totalSteps"]
    assert len(records) == steps and rewards[0] <= 0.2 and statistics.fmean(rewards[-5:]) >= 0.8, rewards
    assert "rollout replica rollout-0 replaced by rollout-1" in output, output[-5000:]
    assert killed <= 25, killed
    books = read_ledger(out / "metrics.jsonl", steps, spec["algorithm"]["promptsPerStep"])
    assert books.clean, (books.prompts_lost, books.trained_twice, books.scored_twice)
    assert max(r["staleness_max"] for r in records) <= spec["algorithm"]["maxStaleness"]
    mismatch = [r["logprob_mismatch_mean"] for r in records]
    assert None not in mismatch and max(mismatch) < LOGPROB_TOLERANCE, mismatch
    print(f"rewards {rewards[0]:.3f} -> {statistics.fmean(rewards[-5:]):.3f}; mismatch max {max(mismatch):.2e}")
    _assert_vllm_logged_to_its_file(output, out)


def _vllm_run(doc: dict[str, Any], tmp_path: Path) -> tuple[list[str], Path, Path]:
    """`rljob run` of the job `doc` on vLLM's runtime (its checkpoints, output and log under `tmp_path`): the
    command, its output folder and the file its terminal output goes to."""
    assert VLLM_PYTHON is not None
    doc["spec"]["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    out, log = tmp_path / "out", tmp_path / "run.log"
    return (
        [str(RLJOB), "run", str(job), "--rollout-python", VLLM_PYTHON, "--no-display", "--output", str(out)],
        out,
        log,
    )


# vLLM's own line format: "INFO 12-04 21:00:00 [loader.py:123] ..."
VLLM_LINE = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[")


def _assert_vllm_logged_to_its_file(output: str, out: Path) -> None:
    """vLLM's INFO lines and its reload warnings ("Failed to load weights": layers without checkpoint weights)
    went to the run's log file, none to the terminal, which Ray forwards the replicas' output to."""
    forwarded = [line for line in output.splitlines() if VLLM_LINE.search(line) or "Failed to load weights" in line]
    assert not forwarded, forwarded[:10]
    logged = (out / "logs" / "vllm.log").read_text()
    assert "Failed to load weights" in logged and " vllm" in logged, logged[-2000:]
    print(f"terminal: {len(output.splitlines())} lines; logs/vllm.log: {len(logged.splitlines())} lines")


def _kill_the_replica_at(run: subprocess.Popen[str], metrics: Path, step: int) -> int:
    """SIGKILL the run's rollout replica once `step` steps are trained; the step it was killed at."""
    deadline = time.monotonic() + 600
    while run.poll() is None and time.monotonic() < deadline:
        trained = len(read_metrics(metrics))
        pid = _rollout_actor(run) if trained >= step else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            return trained
        time.sleep(0.2)
    raise AssertionError(f"the run ended or hung before step {step} (rc {run.poll()})")


def test_the_tool_example_learns_with_vllm_and_later_turns_find_their_prefix_cached(
    calculator: dict[str, Path], tmp_path: Path
) -> None:
    """examples/calculator.yaml with engine vllm (#55): the episodes' turns go to vLLM as token ids, each later
    turn continuing its episode's earlier ones token for token, on the replica that played them, so vLLM's prefix
    cache holds them (within a policy version: a weight update resets it). The tiny model learns to call the tool
    and copy its answer as it does with the hf engine, and the steps report a prefix-cache hit rate above 0."""
    assert VLLM_PYTHON is not None
    doc = yaml.safe_load((REPO / "examples" / "calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(calculator["model"]), str(calculator["data"])
    spec["data"].pop("eval")
    spec["rollout"]["engine"] = "vllm"
    command, out, log = _vllm_run(doc, tmp_path)
    with log.open("w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert done.returncode == 0, log.read_text()[-5000:]
    records = read_metrics(out / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in records]
    rates = [r["episodes"].get("prefix_cache_hit_rate") for r in records]
    print(f"rewards {[round(r, 2) for r in rewards]}\nprefix-cache hit rates {rates}")
    assert rewards[0] <= 0.2 and statistics.fmean(rewards[-5:]) >= 0.8, rewards
    assert None not in rates and max(rates) > 0, rates  # vLLM reported its cache on every step's later turns
    _assert_vllm_logged_to_its_file(log.read_text(), out)
