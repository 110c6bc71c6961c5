"""benchmarks/reward_pipeline: its arithmetic on made-up clocks, and one short real run of two configurations."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO, load_script
from tiny_models import char_llama

BENCH = REPO / "benchmarks" / "reward_pipeline"


def load(name: str) -> ModuleType:
    return load_script(BENCH / f"{name}.py", f"bench_{name}")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("run")


@pytest.fixture(scope="module")
def arithmetic(bench: ModuleType) -> ModuleType:
    """The benchmark's pure arithmetic, the same module its run.py imports."""
    return sys.modules["pipeline_measure"]


def probe_with(bench: ModuleType, busy_per_step: float, replicas: int, group_latency: float = 1.0) -> object:
    probe = bench.Probe()
    for step in range(1, 6):  # one step per second
        probe.snapshots.append(
            bench.Snapshot(
                step=step,
                at=float(step),
                rollout_busy=0.5 * step,
                trainer_busy=busy_per_step * step,
                reward_service=2.0 * step,
                replica_seconds=float(replicas * step),
                discarded_stale=0,
                group_latency_max=group_latency * step,  # 1, 2, ... × group_latency
            )
        )
    probe.max_replicas = replicas
    return probe


def test_measure_takes_differences_after_the_warmup(bench: ModuleType, arithmetic: ModuleType) -> None:
    m = bench.measure(bench.CONFIGS["async"], probe_with(bench, 0.9, replicas=2), [], warmup=2)
    assert m.steps == 3 and m.wall_per_step == pytest.approx(1.0)
    assert m.trainer_idle == pytest.approx(0.1) and m.train_per_step == pytest.approx(0.9)
    assert m.rollout_per_step == pytest.approx(0.5) and m.reward_work_per_step == pytest.approx(2.0)
    assert m.replica_seconds == pytest.approx(6.0)
    # Limit: the slowest stage; reward work 2 s per step over 4 slots is 0.5 s.
    assert arithmetic.limit_per_step(m, slots=4) == pytest.approx(0.9)
    assert arithmetic.limit_per_step(m, slots=1) == pytest.approx(2.0)
    # Latency bound: the measured steps' slowest groups took 3, 4, 5 s, plus a 0.9 s train step,
    # over the maxStaleness + 1 = 3 steps they have.
    assert m.latency_bound_per_step == pytest.approx((4.0 + 0.9) / 3)


def test_measure_says_which_steps_the_trainer_idled_and_how_long_it_waited_for_a_batch(bench: ModuleType) -> None:
    # The trainer is busy 0.9 s of each step; step 4 took 2.5 s, 1.5 s of it waiting for its batch.
    probe = probe_with(bench, 0.9, replicas=2)
    probe.snapshots = [  # type: ignore[attr-defined]
        dataclasses.replace(snapshot, at=at)
        for snapshot, at in zip(probe.snapshots, (1.0, 2.0, 3.0, 5.5, 6.5), strict=True)  # type: ignore[attr-defined]
    ]
    reports = [SimpleNamespace(wait_seconds=wait, reward_mean=0.5) for wait in (0.0, 0.1, 0.0, 1.5, 0.1)]
    m = bench.measure(bench.CONFIGS["async"], probe, reports, warmup=2)
    assert m.idle_by_step == pytest.approx([0.1, 1.6, 0.1])
    assert m.batch_wait_per_step == pytest.approx(1.6 / 3)
    assert m.trainer_idle == pytest.approx(1 - 2.7 / 4.5)
    assert math.isnan(bench.measure(bench.CONFIGS["async"], probe, [], warmup=2).batch_wait_per_step)


def test_latency_bound_of_sync_is_its_whole_step(arithmetic: ModuleType) -> None:
    # maxStaleness 0: generate and score (the group latency), then train; nothing overlaps.
    assert arithmetic.latency_bound([0.6, 0.8], 0.3, 0) == pytest.approx(1.0)
    assert arithmetic.latency_bound([0.6, 0.8], 0.3, 1) == pytest.approx(0.5)
    assert math.isnan(arithmetic.latency_bound([], 0.3, 1))


def test_targets_are_reported_met_or_missed(bench: ModuleType) -> None:
    sync = bench.measure(bench.CONFIGS["sync"], probe_with(bench, 0.2, replicas=4), [], warmup=1)
    fast = bench.measure(bench.CONFIGS["async"], probe_with(bench, 0.97, replicas=4), [], warmup=1)
    idle = bench.measure(bench.CONFIGS["async-elastic"], probe_with(bench, 0.5, replicas=1), [], warmup=1)
    args = bench.main.__globals__["argparse"].Namespace(replicas=4, in_flight=2)
    text, derived = bench.table([sync, fast, idle], args)
    assert "| (3) async streaming, fixed pool |" in text and "75% fewer replica-seconds" in text
    checks = "\n".join(bench.targets([sync, fast, idle], derived))
    assert "[met] async: trainer idle 3.0% (≤ 5%)" in checks
    assert "[MISSED] async-elastic: trainer idle 50.0% (≤ 5%)" in checks
    assert "[met] elastic: 75% fewer replica-seconds than the fixed pool (≥ 30%)" in checks


def test_staleness_sweep_runs_the_async_configurations_at_each_value(arithmetic: ModuleType) -> None:
    names = arithmetic.sweep(["sync", "async", "async-elastic"], [2, 4, 6])
    assert names == ["sync", "async", "async@4", "async@6", "async-elastic", "async-elastic@4", "async-elastic@6"]
    six = arithmetic.config_named("async-elastic@6")
    assert (six.max_staleness, six.elastic, six.dispatch) == (6, True, "sample")
    assert six.label.endswith("maxStaleness 6")
    for bad in ("sync@3", "async@x", "nosuch"):
        with pytest.raises(ValueError, match="async"):
            arithmetic.config_named(bad)


def test_sweep_table_pairs_each_staleness_and_holds_six_to_095(bench: ModuleType, arithmetic: ModuleType) -> None:
    def run(name: str, busy: float, replicas: int) -> object:
        return bench.measure(arithmetic.config_named(name), probe_with(bench, busy, replicas=replicas), [], warmup=1)

    # trainer busy 0.92 of each 1 s step: the limit (the train stage) is 0.92 of the wall step
    results = [run("async", 0.6, 4), run("async@6", 0.92, 4), run("async-elastic@6", 0.92, 2)]
    args = bench.main.__globals__["argparse"].Namespace(replicas=4, in_flight=2)
    text, derived = bench.table(results, args)
    assert "async-elastic@6 vs async@6: 50% fewer replica-seconds" in text
    assert "  2: 1.000 s/step, idle 40.0%" in text and "  6: 1.000 s/step, idle 8.0%, 0.92 of the limit" in text
    checks = "\n".join(bench.targets(results, derived))
    assert "[MISSED] async@6: 0.92 of the limit (≥ 0.95)" in checks
    assert "[MISSED] async-elastic@6: 0.92 of the limit (≥ 0.95)" in checks
    assert "[MISSED] async: 0.60 of the limit (≥ 0.9)" in checks
    assert "[met] elastic@6: 50% fewer replica-seconds than the fixed pool (≥ 30%)" in checks


def test_a_bad_staleness_is_named(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in ((["--staleness", "2,x"], "--staleness: '2,x'"), (["--configs", "sync@2"], "sync@2")):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert said in capsys.readouterr().err


def test_judge_latency_is_fixed_per_sample_and_slows_for_the_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    judge = load("pipeline_judge")
    monkeypatch.setenv("RLJOB_BENCH_LATENCY", "0.010,0.400")
    monkeypatch.setenv("RLJOB_BENCH_SLOW", "5,10,3")
    latencies = [judge.latency_seconds(f"e0-{i}/0", 0) for i in range(200)]
    assert all(0.010 <= x <= 0.400 for x in latencies)
    assert 0.15 < sum(latencies) / len(latencies) < 0.26  # uniform: mean 0.205
    assert judge.latency_seconds("e0-1/0", 0) == latencies[1]
    assert judge.latency_seconds("e0-1/0", 5) == pytest.approx(3 * latencies[1])
    assert judge.latency_seconds("e0-1/0", 10) == latencies[1]


@pytest.mark.ray
def test_short_run_of_sync_and_elastic_at_staleness_3(bench: ModuleType, tmp_path: Path) -> None:
    char_llama(tmp_path / "model", eos_bias=3.0)
    write_jsonl(tmp_path / "train.jsonl", make_problems(64, seed=1))
    out = tmp_path / "result.json"
    argv = [
        "--configs",
        "sync,async-elastic",
        "--staleness",
        "3",
        "--steps",
        "4",
        "--warmup",
        "1",
        "--prompts-per-step",
        "4",
    ]
    argv += ["--group-size", "4", "--replicas", "2", "--in-flight", "4", "--latency-ms", "5", "50"]
    argv += ["--micro-batch", "16"]
    argv += ["--model", str(tmp_path / "model"), "--data", str(tmp_path / "train.jsonl"), "--json", str(out)]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    by_config = {r["config"]: r for r in result["results"]}
    assert set(by_config) == {"sync", "async-elastic@3"}  # a point of a staleness sweep, in its own process
    for r in by_config.values():
        assert r["steps"] == 3 and r["wall_per_step"] > 0 and r["reward_work_per_step"] > 0
        assert 0 <= r["trainer_idle"] < 1
    # Sync trains on policy: every step waits for generation and reward, so the trainer idles.
    assert by_config["sync"]["trainer_idle"] > 0.2
    assert 1 <= by_config["async-elastic@3"]["max_replicas"] <= 2
