"""Run metrics: Prometheus gauges and counters, one JSON line per train step, and the step's sample log."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from rljob_workers.driver.controller.eval_report import EvalReport
from rljob_workers.driver.controller.report import Counts, StepReport
from rljob_workers.driver.telemetry.episode_metrics import EpisodeMetrics
from rljob_workers.driver.telemetry.files import METRICS_JSONL
from rljob_workers.driver.telemetry.sample_log import SampleLog
from rljob_workers.driver.telemetry.trackers import Trackers

COUNT_HELP = {
    "generated": "Completions received from rollout",
    "scored": "Samples with a reward",
    "trained": "Samples used by a train step",
    "discarded_stale": "Samples older than maxStaleness (their prompts are regenerated)",
    "excluded_reward_error": "Samples excluded after a reward error (onError: exclude)",
    "lost_replica": "Samples regenerated after their rollout replica was lost",
    "reward_retries": "Reward calls retried after an error",
    "filtered": "Samples of groups dynamic sampling dropped (all rewards equal)",
    "masked_truncated": "Samples cut at maxNewTokens and left out of the loss (overlong.maskTruncated)",
    "failed_prompts": "Prompts set aside in failed.jsonl (too long, or failed by the engine past rollout.retries)",
}


class EvalGauges:
    """The newest round of the held-out eval (spec.data.eval), made by RunMetrics' `gauge`."""

    def __init__(self, gauge: Callable[..., Gauge]) -> None:
        self.step = gauge("rljob_eval_step", "Train steps completed when the newest held-out eval round ran")
        self.reward_mean = gauge("rljob_eval_reward_mean", "Mean reward on the held-out eval, newest round")
        self.reward = gauge(
            "rljob_eval_reward", "Mean score of each reward function on the held-out eval, newest round", "function"
        )
        self.pass_at_k = gauge("rljob_eval_pass_at_k", "pass@k (unbiased) on the held-out eval, newest round", "k")

    def update(self, labels: dict[str, str], report: EvalReport) -> None:
        self.step.labels(**labels).set(report.step)
        self.reward_mean.labels(**labels).set(report.reward_mean)
        for function, mean in report.rewards.items():
            self.reward.labels(**labels, function=function).set(mean)
        for k, value in report.pass_at_k.items():
            self.pass_at_k.labels(**labels, k=str(k)).set(value)


class SignalGauges:
    """Each step's training signals: the trainer's loss terms and the samples' lengths, per-function rewards and
    throughput, made by RunMetrics' `gauge`."""

    # The trainer's metrics (StepReport.train_metrics) with a gauge of their own, an attribute each.
    TRAINER = ("policy_loss", "clip_fraction", "grad_norm", "entropy")

    def __init__(self, gauge: Callable[..., Gauge]) -> None:
        self.policy_loss = gauge("rljob_policy_loss", "Policy (surrogate) loss of the last train step")
        self.kl = gauge(
            "rljob_kl",
            "KL of the last step's tokens: to the reference policy (klCoef > 0), and of the trained policy to "
            "the one that sampled them (behaviour, k3)",
            "to",
        )
        self.clip_fraction = gauge("rljob_clip_fraction", "Share of the last step's tokens whose ratio was clipped")
        self.grad_norm = gauge("rljob_grad_norm", "Gradient norm of the last step, before clipping (maxGradNorm)")
        self.entropy = gauge("rljob_entropy", "Mean entropy of the sampling distribution over the last step's tokens")
        self.response_length = gauge(
            "rljob_response_length_tokens", "Completion length of the last step's samples (mean, max)", "stat"
        )
        self.function_reward = gauge(
            "rljob_reward_function_mean", "Mean score of each reward function over the last batch", "function"
        )
        self.tokens_per_second = gauge(
            "rljob_trained_tokens_per_second", "Completion tokens the last train step trained per second"
        )

    def update(self, labels: dict[str, str], report: StepReport) -> None:
        """The trainer's loss terms (those it computed: no KL to a reference without one) and the samples'."""
        for name in self.TRAINER:
            if name in report.train_metrics:
                getattr(self, name).labels(**labels).set(report.train_metrics[name])
        for name, to in (("kl_ref", "reference"), ("kl_reward", "reference"), ("approx_kl", "behaviour")):
            if name in report.train_metrics:
                self.kl.labels(**labels, to=to).set(report.train_metrics[name])
        self.response_length.labels(**labels, stat="mean").set(report.response_length_mean)
        self.response_length.labels(**labels, stat="max").set(report.response_length_max)
        for function, mean in report.reward_by_function.items():
            self.function_reward.labels(**labels, function=function).set(mean)
        self.tokens_per_second.labels(**labels).set(report.tokens_per_second)


class RunMetrics:
    """Prometheus metrics of one run, updated from each StepReport."""

    def __init__(self, job: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"job_name": job}
        self.labels = labels

        def gauge(name: str, help_text: str, *more: str) -> Gauge:
            return Gauge(name, help_text, [*labels, *more], registry=self.registry)

        self.step = gauge("rljob_step", "Train steps completed")
        self.version = gauge("rljob_policy_version", "Policy version published")
        self.reward = gauge("rljob_reward_mean", "Mean reward of the last batch")
        self.staleness = gauge("rljob_staleness_mean", "Mean staleness of the last batch")
        self.step_seconds = gauge("rljob_step_seconds", "Seconds of the last train step")
        self.trainer_wait = gauge("rljob_trainer_wait_seconds", "Seconds the trainer waited for its last batch")
        self.group_latency = gauge(
            "rljob_group_latency_max_seconds", "Slowest prompt group of the last batch, from dispatch to its last score"
        )
        self.sync_seconds = gauge(
            "rljob_weight_sync_seconds", "Seconds of the last train step spent syncing weights to the rollout pool"
        )
        self.reward_backlog = gauge("rljob_reward_backlog", "Samples waiting for a reward replica or being scored")
        self.reward_replicas = gauge(
            "rljob_reward_replicas", "Reward replicas the elastic policy wants (desired) and that take samples (ready)",
            "state",
        )  # fmt: skip
        self.environment_backlog = gauge(
            "rljob_environment_backlog", "Environment calls in service, and episodes waiting for an environment replica"
        )
        self.environment_replicas = gauge(
            "rljob_environment_replicas",
            "Environment replicas the elastic policy wants (desired) and that take episodes (ready)",
            "state",
        )
        self.idle = gauge("rljob_pool_idle_fraction", "Fraction of the last minute a pool was idle", "pool")
        self.truncated = gauge("rljob_truncated_fraction", "Share of the last step's samples cut at maxNewTokens")
        self.mismatch = gauge(
            "rljob_logprob_mismatch",
            "|rollout engine log-prob - trainer log-prob| of the last step's tokens the trained weights generated",
            "stat",
        )
        self.signals = SignalGauges(gauge)
        self.eval = EvalGauges(gauge)
        self.episodes = EpisodeMetrics(self.registry, labels)
        self.filtered_groups = Counter(
            "rljob_filtered_groups",
            "Prompt groups dynamic sampling dropped (all rewards equal)",
            list(labels),
            registry=self.registry,
        )
        self.samples = Counter(
            "rljob_samples", "Samples by what happened to them", [*labels, "outcome"], registry=self.registry
        )
        self._seen = Counts()
        self._server: Any = None
        self._thread: Any = None

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics until `close`; port 0 picks a free one. Returns the port."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving, so the port is free for the run that follows in this process (a restart)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def set_idle(self, fractions: dict[str, float]) -> None:
        for pool, fraction in fractions.items():
            self.idle.labels(**self.labels, pool=pool).set(fraction)

    def set_elastic(self, pool: str, backlog: int, desired: int, ready: int) -> None:
        """An elastic pool's (reward, environment) backlog and replicas."""
        backlogs, replicas = (
            (self.reward_backlog, self.reward_replicas)
            if pool == "reward"
            else (self.environment_backlog, self.environment_replicas)
        )
        backlogs.labels(**self.labels).set(backlog)
        replicas.labels(**self.labels, state="desired").set(desired)
        replicas.labels(**self.labels, state="ready").set(ready)

    def update_eval(self, report: EvalReport) -> None:
        self.eval.update(self.labels, report)

    def update(self, report: StepReport) -> None:
        self.step.labels(**self.labels).set(report.step)
        self.version.labels(**self.labels).set(report.version)
        self.reward.labels(**self.labels).set(report.reward_mean)
        self.staleness.labels(**self.labels).set(report.staleness_mean)
        self.step_seconds.labels(**self.labels).set(report.step_seconds)
        self.trainer_wait.labels(**self.labels).set(report.wait_seconds)
        self.group_latency.labels(**self.labels).set(report.group_latency_max)
        self.sync_seconds.labels(**self.labels).set(report.sync_seconds)
        self.truncated.labels(**self.labels).set(report.truncated_fraction)
        for stat, value in (("mean", report.logprob_mismatch_mean), ("max", report.logprob_mismatch_max)):
            if value is not None:
                self.mismatch.labels(**self.labels, stat=stat).set(value)
        self.signals.update(self.labels, report)
        self.episodes.update(report)
        if report.counts.filtered_groups > self._seen.filtered_groups:
            self.filtered_groups.labels(**self.labels).inc(report.counts.filtered_groups - self._seen.filtered_groups)
        for outcome in COUNT_HELP:
            delta = getattr(report.counts, outcome) - getattr(self._seen, outcome)
            if delta > 0:
                self.samples.labels(**self.labels, outcome=outcome).inc(delta)
        self._seen = report.counts


def report_record(report: StepReport) -> dict[str, Any]:
    """One JSON-able line of metrics.jsonl (the logged samples go to their own files: `sample_log`)."""
    record = asdict(replace(report, logged_samples=[]))  # not copied only to be dropped
    record["counts"] = asdict(report.counts)
    del record["logged_samples"]
    return record


class JsonlWriter:
    """Appends one JSON line per step (append: a resumed run continues the same file)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def write(self, report: StepReport, **extra: Any) -> dict[str, Any]:
        """The step's line: the report's fields, then `extra`'s, in one write (a buffered file wrote a line
        longer than its buffer in pieces, and a reader following the run saw half of it). Returns the line."""
        record = {**report_record(report), **extra}
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, (json.dumps(record) + "\n").encode())
        finally:
            os.close(descriptor)
        return record


class StepLog:
    """Each step's report in the run's output folder: its line of metrics.jsonl, and its logged samples
    (spec.logging.samples) in samples/, written in the background; the line's numbers go to the trackers
    (spec.logging.trackers). A context: leaving it waits for the samples."""

    def __init__(self, output: Path, trackers: Trackers | None = None) -> None:
        self.metrics = JsonlWriter(output / METRICS_JSONL)
        self.samples = SampleLog(output)
        self.trackers = trackers or Trackers()

    def write(self, report: StepReport, **extra: Any) -> None:
        self.trackers.log(report.step, self.metrics.write(report, **extra))
        self.samples.write(report)
        self.trackers.log_samples(report.step, report.logged_samples)

    def close(self) -> None:
        self.samples.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The steps of a metrics.jsonl, perhaps still being written: its complete lines only."""
    if not path.exists():
        return []
    *complete, _ = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


def first_reaching(records: list[dict[str, Any]], target: float, window: int) -> dict[str, Any] | None:
    """The first step whose last `window` steps' mean reward is `target` or more (None: none yet). The first,
    not the last: a run stopped once it reached the target still finishes the step under way."""
    for end in range(window, len(records) + 1):
        if sum(r["reward_mean"] for r in records[end - window : end]) / window >= target:
            return records[end - 1]
    return None
