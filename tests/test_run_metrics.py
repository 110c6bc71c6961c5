"""The driver's /metrics over HTTP: what the shipped dashboard's run panels read (step, weight-sync time,
reward backlog and replicas, samples by outcome)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from rljob_workers.driver.controller.report import Counts, StepReport
from rljob_workers.driver.telemetry.metrics import RunMetrics


def _report(step: int, sync_seconds: float, counts: Counts) -> StepReport:
    return StepReport(
        step=step, version=step, reward_mean=0.5, reward_std=0.1, staleness_mean=0.5, staleness_max=1, samples=128,
        prompt_ids=[], train_metrics={}, step_seconds=0.4, wait_seconds=0.1, elapsed_seconds=step * 0.4,
        counts=counts, sync_seconds=sync_seconds,
    )  # fmt: skip


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_endpoint_serves_sync_time_and_each_elastic_pools_backlog_and_replicas() -> None:
    metrics = RunMetrics("demo")
    port = metrics.serve(0)
    try:
        metrics.update(_report(1, 0.25, Counts(generated=128, scored=128, trained=128)))
        metrics.update(_report(2, 0.5, Counts(generated=256, scored=250, trained=256)))
        metrics.set_elastic("reward", backlog=37, desired=3, ready=2)
        metrics.set_elastic("environment", backlog=5, desired=4, ready=1)
        got = _scrape(port)
    finally:
        metrics.close()
    assert got[("rljob_step", ())] == 2
    assert got[("rljob_weight_sync_seconds", ())] == 0.5  # the last step's, not a sum
    assert got[("rljob_reward_backlog", ())] == 37
    assert got[("rljob_reward_replicas", (("state", "desired"),))] == 3
    assert got[("rljob_reward_replicas", (("state", "ready"),))] == 2
    assert got[("rljob_environment_backlog", ())] == 5
    assert got[("rljob_environment_replicas", (("state", "desired"),))] == 4
    assert got[("rljob_environment_replicas", (("state", "ready"),))] == 1
    assert got[("rljob_samples_total", (("outcome", "scored"),))] == 250  # counted once across reports


def test_training_signals_are_gauges_and_a_kl_never_computed_is_not_exported() -> None:
    """The trainer's loss terms and the samples' lengths and per-function rewards, from the step's report; with
    klCoef 0 there is no reference, so no KL to it (rather than a KL of 0)."""
    metrics = RunMetrics("demo")
    report = _report(3, 0.1, Counts())
    report.train_metrics = {
        "policy_loss": -0.5,
        "approx_kl": 0.01,
        "clip_fraction": 0.2,
        "grad_norm": 2.0,
        "entropy": 1.5,
    }
    report.response_length_mean, report.response_length_max = 3.5, 5
    report.reward_by_function = {"exact-match": 0.75, "format": 1.0}
    metrics.update(report)
    port = metrics.serve(0)
    try:
        got = _scrape(port)
    finally:
        metrics.close()
    assert got[("rljob_policy_loss", ())] == -0.5
    assert got[("rljob_kl", (("to", "behaviour"),))] == 0.01
    assert ("rljob_kl", (("to", "reference"),)) not in got
    assert got[("rljob_entropy", ())] == 1.5
    assert got[("rljob_response_length_tokens", (("stat", "max"),))] == 5
    assert got[("rljob_reward_function_mean", (("function", "format"),))] == 1.0
    assert got[("rljob_reward_function_mean", (("function", "exact-match"),))] == 0.75


def test_episode_series_gauge_each_step_and_count_over_the_run() -> None:
    """spec.environment's series: the step's turns, tokens and latencies as gauges; episodes by outcome, turns,
    tool calls and environment errors as counters, each counted once however many reports carry them."""
    metrics = RunMetrics("agents")
    first = _report(1, 0.1, Counts(episodes=16, turns=30, episode_restarts=1))
    first.episodes = {"turns_mean": 1.875, "turns_max": 3.0, "tool_calls_calc": 12.0, "environment_errors_lost": 1.0}
    second = _report(2, 0.1, Counts(episodes=32, turns=62, episode_restarts=1, excluded_environment_error=2))
    second.episodes = {
        "turns_mean": 2.0,
        "turns_max": 2.0,
        "tool_calls_calc": 16.0,
        "environment_errors_timeout": 2.0,
        "environment_step_seconds_p99": 0.25,
        "episodes_in_flight": 7.0,
    }
    port = metrics.serve(0)
    try:
        metrics.update(first)
        metrics.update(second)
        got = _scrape(port)
    finally:
        metrics.close()
    assert got[("rljob_episode_turns", (("stat", "mean"),))] == 2.0  # the last step's
    assert got[("rljob_environment_step_seconds", (("quantile", "0.99"),))] == 0.25
    assert got[("rljob_episodes_in_flight", ())] == 7
    assert got[("rljob_episodes_total", (("outcome", "played"),))] == 32
    assert got[("rljob_episodes_total", (("outcome", "restarted"),))] == 1  # counted once across reports
    assert got[("rljob_episodes_total", (("outcome", "excluded"),))] == 2
    assert got[("rljob_episode_turns_played_total", ())] == 62
    assert got[("rljob_tool_calls_total", (("tool", "calc"),))] == 28  # each step's episodes' calls, summed
    assert got[("rljob_environment_errors_total", (("kind", "lost"),))] == 1
    assert got[("rljob_environment_errors_total", (("kind", "timeout"),))] == 2


def test_a_run_without_environment_exports_no_episode_samples() -> None:
    metrics = RunMetrics("plain")
    metrics.update(_report(1, 0.1, Counts(generated=8)))
    port = metrics.serve(0)
    try:
        got = _scrape(port)
    finally:
        metrics.close()
    assert not [key for key in got if key[0].startswith(("rljob_episode", "rljob_tool", "rljob_environment"))]
