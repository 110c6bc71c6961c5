"""The held-out eval (spec.data.eval): pass@k's estimator, the spec's rules, the example's split, and a real
`rljob run` whose eval.jsonl, metrics.jsonl, final status and summary are read back."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from prometheus_client import generate_latest
from researcher_run import EVAL_EVERY, EVAL_K, EVAL_PROMPTS, GROUP, PROMPTS, STEPS, ResearcherRun

from rljob_api import RLJobInvalid, parse_rljob
from rljob_workers.driver.controller.eval_report import EvalSample, pass_at_k, reported_ks, summarize
from rljob_workers.driver.controller.evaluation import eval_due
from rljob_workers.driver.telemetry.eval_log import read_evals
from rljob_workers.driver.telemetry.ledger import read_ledger
from rljob_workers.driver.telemetry.metrics import RunMetrics
from rljob_workers.tasks.arithmetic import held_out_problems, make_problems, read_jsonl, write_jsonl

from conftest import REPO

RLJOB = str(Path(sys.executable).parent / "rljob")
# Set-up refusals: well under a second of checks after the CLI's imports; the bound leaves room for a busy
# CI machine (tests/test_setup_checks.py's), the time is printed.
FAST_SECONDS = 5.0


# ---- pass@k ---------------------------------------------------------------------------------
def _pass_at_k_by_counting(n: int, correct: int, k: int) -> float:
    """The share of k-subsets of n completions (the first `correct` pass) that hold a passing one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < correct for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_chance_a_k_subset_holds_a_pass(n):
    for correct in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, correct, k) == pytest.approx(_pass_at_k_by_counting(n, correct, k))


def test_pass_at_k_edges_and_monotony():
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the share that passes
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    values = [pass_at_k(16, 3, k) for k in range(1, 17)]
    assert values == sorted(values) and values[-1] == 1.0
    for bad in [(4, 1, 0), (4, 1, 5), (4, 5, 1), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_a_round_summary_averages_per_prompt_and_per_function():
    samples = [
        EvalSample(0, 1.0, {"exact": 1.0, "short": 0.0}, 3),
        EvalSample(0, 0.0, {"exact": 0.0, "short": 0.0}, 3),
        EvalSample(1, 0.0, {"exact": 0.0, "short": 1.0}, 3, truncated=True),
        EvalSample(1, 0.0, {"exact": 0.0, "short": 1.0}, 4),
    ]
    report = summarize(6, samples, prompts=2, samples_per_prompt=2, pass_threshold=1.0)
    assert (report.step, report.policy_version, report.newest_version) == (6, 3, 4)
    assert report.reward_mean == pytest.approx(0.25) and report.samples == 4
    assert report.rewards == pytest.approx({"exact": 0.25, "short": 0.5})
    assert report.pass_at_k == pytest.approx({1: 0.25, 2: 0.5})  # prompt 0: one of two passes; prompt 1: none
    assert report.truncated_fraction == pytest.approx(0.25)
    assert reported_ks(1) == [1] and reported_ks(4) == [1, 2, 4] and reported_ks(6) == [1, 2, 4, 6]


def test_rounds_are_due_at_step_0_every_n_steps_and_at_the_end():
    assert [s for s in range(8) if eval_due(s, 3, 7)] == [0, 3, 6, 7]


def test_the_eval_gauges_show_the_newest_round():
    metrics = RunMetrics("job")
    samples = [EvalSample(0, 1.0, {"exact": 1.0}, 2), EvalSample(0, 0.0, {"exact": 0.0}, 2)]
    metrics.update_eval(summarize(2, samples, prompts=1, samples_per_prompt=2, pass_threshold=1.0))
    text = generate_latest(metrics.registry).decode()
    assert 'rljob_eval_reward{function="exact",job_name="job"} 0.5' in text
    assert 'rljob_eval_pass_at_k{job_name="job",k="2"} 1.0' in text
    assert 'rljob_eval_step{job_name="job"} 2.0' in text


# ---- the spec ------------------------------------------------------------------------------
def test_several_greedy_completions_are_refused_naming_the_field(example_doc):
    example_doc["spec"]["data"]["eval"]["samplesPerPrompt"] = 4
    with pytest.raises(RLJobInvalid, match=r"spec\.data\.eval\.samplesPerPrompt: 4 greedy completions"):
        parse_rljob(example_doc)
    example_doc["spec"]["data"]["eval"]["sampling"] = {"temperature": 1.0}
    assert parse_rljob(example_doc).spec.data.eval.samples_per_prompt == 4  # type: ignore[union-attr]


def test_the_example_evaluates_greedily_on_the_rollout_length(example_doc):
    spec = parse_rljob(example_doc).spec
    assert spec.data.eval is not None
    assert spec.data.eval.sampling.temperature == 0 and spec.data.eval.sampling.max_new_tokens is None


# ---- the example's split -------------------------------------------------------------------
def test_the_held_out_split_holds_no_training_prompt():
    train = make_problems(4096, seed=10_000)
    held_out = held_out_problems(100, seed=20_000, train=train)
    assert len({p["prompt"] for p in held_out}) == 100
    assert not {p["prompt"] for p in held_out} & {p["prompt"] for p in train}
    assert held_out != held_out_problems(100, seed=20_001, train=train)  # its own seed orders it
    with pytest.raises(ValueError, match="not in the training prompts"):
        held_out_problems(1000, seed=20_000, train=train)


def test_make_model_writes_the_eval_split_the_example_names(example_model, tmp_path):
    data, held_out = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    done = subprocess.run(
        [RLJOB, "make-model", "--out", str(example_model), "--data", str(data), "--eval-data", str(held_out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_jsonl(held_out)
    assert len(rows) == 100 and not {r["prompt"] for r in rows} & {r["prompt"] for r in read_jsonl(data)}
    example = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    assert rows == read_jsonl(REPO / example["spec"]["data"]["eval"]["path"])  # what `make model` writes there


# ---- set-up refusals -----------------------------------------------------------------------
def _job(tmp_path: Path, model: Path, data: Path, eval_spec: dict[str, Any], **algorithm: Any) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
    spec["data"]["eval"] = eval_spec
    spec["algorithm"].update(algorithm)
    spec["checkpoint"] = {"dir": str(tmp_path / "checkpoints"), "everySteps": 1000}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


@pytest.mark.parametrize("case", ["missing", "bad JSON line", "missing field"])
def test_a_bad_eval_file_is_refused_in_one_line_before_ray(example_model, tmp_path, case):
    data = write_jsonl(tmp_path / "train.jsonl", make_problems(8, seed=1))
    good = json.dumps(make_problems(1, seed=2)[0])
    held_out = tmp_path / "eval.jsonl"
    expected = {
        "missing": f"spec.data.eval.path: {held_out} does not exist",
        "bad JSON line": f"spec.data.eval.path: {held_out}:2: not valid JSON",
        "missing field": f"spec.data.eval.path: {held_out}:3: missing field(s) answer",
    }[case]
    if case == "bad JSON line":
        held_out.write_text(f'{good}\n{{"prompt": "1+1=", "answer": \n{good}\n')
    elif case == "missing field":
        held_out.write_text(f'{good}\n{good}\n{{"prompt": "1+1="}}\n')
    job = _job(tmp_path, example_model, data, {"path": str(held_out)})
    started = time.monotonic()
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - started
    lines = done.stderr.strip().splitlines()
    print(f"{seconds:.2f}s: {done.stderr.strip()}")
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert expected in lines[0]
    assert seconds < FAST_SECONDS
    assert not (tmp_path / "out").exists(), "nothing of a run may start"


# ---- a real run (tests/researcher_run.py) -----------------------------------------------------------


@pytest.mark.ray
def test_a_run_evaluates_at_step_0_every_n_steps_and_at_the_end_apart_from_training(researcher_run: ResearcherRun):
    rounds = researcher_run.evals
    assert [r["step"] for r in rounds] == [*range(0, STEPS, EVAL_EVERY), STEPS]
    for r in rounds:
        assert r["policy_version"] == r["newest_version"] == r["step"], r  # the version just published, whole
        assert (r["prompts"], r["samples"], r["reward_errors"]) == (EVAL_PROMPTS, EVAL_PROMPTS * EVAL_K, 0)
        passes = [r["pass_at_k"][str(k)] for k in (1, 2, 4)]
        assert passes == sorted(passes), r  # pass@4 >= pass@2 >= pass@1
        assert passes[0] == pytest.approx(r["reward_mean"])  # exact match scores 0 or 1: pass@1 is the mean
        assert r["rewards"] == pytest.approx({"exact-match": r["reward_mean"]})

    records = researcher_run.records
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))  # no eval line among the train steps
    trained = {p for r in records for p in r["prompt_ids"]}
    evaluated = {p for r in rounds for p in r["prompt_ids"]}
    assert len(evaluated) == len(rounds) * EVAL_PROMPTS and not trained & evaluated
    assert all(p.startswith("e0-") for p in trained), trained
    ledger = read_ledger(researcher_run.out / "metrics.jsonl", STEPS, PROMPTS)
    assert ledger.clean, ledger
    counts = records[-1]["counts"]
    training_most = STEPS * PROMPTS * GROUP + counts["discarded_stale"] + counts["lost_replica"]
    assert counts["generated"] <= training_most, counts  # the eval's completions are not counted

    # the final status (the termination log), as proto3 JSON: a reward mean of 0 is left out, so parsed back
    from rljob.v1 import control_service_pb2 as control_pb

    final = json_format.ParseDict(researcher_run.status, control_pb.JobStatus())
    assert final.eval.step == STEPS and final.eval.reward_mean == pytest.approx(rounds[-1]["reward_mean"])
    first, last = rounds[0], rounds[-1]
    line = f"eval reward:  {first['reward_mean']:.3f} at step 0 -> {last['reward_mean']:.3f} at step {STEPS}"
    assert line in researcher_run.output, researcher_run.output[-3000:]


def test_the_operator_shows_the_newest_round_and_keeps_it_between_snapshots(example_doc):
    from rljob.v1 import control_service_pb2 as control_pb
    from rljob_operator.status.compute import compute_status
    from rljob_operator.status.observe import Observed

    job = parse_rljob(example_doc)
    result = control_pb.EvalResult(step=20, policy_version=20, reward_mean=0.75, rewards={"exact-match": 0.75})
    result.pass_at_k[1] = 0.75
    snapshot = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, step=21, eval=result)
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    status = compute_status(job, Observed(), snapshot, now=now)
    assert status.eval is not None and status.to_wire()["eval"] == {
        "step": 20,
        "policyVersion": 20,
        "rewardMean": 0.75,
        "rewards": {"exact-match": 0.75},
        "passAtK": {"1": 0.75},
    }
    assert compute_status(job, Observed(), None, now=now, previous=status).eval == status.eval


@pytest.mark.ray
def test_a_resumed_run_evaluates_its_starting_step_once(example_model, tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", make_problems(256, seed=10_000))
    held_out = write_jsonl(tmp_path / "eval.jsonl", held_out_problems(8, 7, read_jsonl(data)))
    job = _job(tmp_path, example_model, data, {"path": str(held_out), "everySteps": 2}, groupSize=4, promptsPerStep=4)
    out = tmp_path / "out"
    for steps in (["--steps", "3"], ["--steps", "5", "--resume"]):  # the first ends with a checkpoint at step 3
        command = [RLJOB, "run", str(job), "--no-display", "--output", str(out), *steps]
        done = subprocess.run(command, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        print(done.stdout.splitlines()[-4:])
    # Step 3's round, the first run's last, came before its checkpoint: the second run starts after it.
    assert [r["step"] for r in read_evals(out / "eval.jsonl")] == [0, 2, 3, 4, 5]
    assert "eval reward:  0.000 at step 0" in done.stdout or "at step 0 ->" in done.stdout, done.stdout[-2000:]
