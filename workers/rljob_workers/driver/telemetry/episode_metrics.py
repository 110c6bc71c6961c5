"""Prometheus series of spec.environment's episodes: what each step's episodes did (gauges) and what happened
to episodes, turns, tool calls and environment errors over the run (counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from rljob_workers.driver.controller.report import Counts, StepReport

TURNS_HELP = "Model turns per episode of the last step"
LATENCY_HELP = "Latency of environment calls since the step before"
# StepReport.episodes keys with a gauge: key -> (gauge, help, its one label and value, or None)
STEP_GAUGES: dict[str, tuple[str, str, tuple[str, str] | None]] = {
    "turns_mean": ("rljob_episode_turns", TURNS_HELP, ("stat", "mean")),
    "turns_max": ("rljob_episode_turns", TURNS_HELP, ("stat", "max")),
    "episode_tokens_mean": ("rljob_episode_tokens_mean", "Tokens of the last step's episodes (mean)", None),
    "truncated_share": ("rljob_episode_truncated_fraction", "Share of the last step's episodes truncated", None),
    "return_mean": ("rljob_episode_return_mean", "Mean return (turn rewards plus final) of the last step", None),
    "episodes_in_flight": ("rljob_episodes_in_flight", "Episodes being played", None),
    "prefix_cache_hit_rate": (
        "rljob_prefix_cache_hit_rate",
        "Share of the prompt tokens of episodes' later turns the engine served from its prefix cache",
        None,
    ),
    "environment_step_seconds_p50": ("rljob_environment_step_seconds", LATENCY_HELP, ("quantile", "0.5")),
    "environment_step_seconds_p99": ("rljob_environment_step_seconds", LATENCY_HELP, ("quantile", "0.99")),
}
# Counts fields counted as rljob_episodes_total{outcome}
EPISODE_OUTCOMES = {
    "episodes": "played",
    "episode_restarts": "restarted",
    "excluded_environment_error": "excluded",
}
TOOL_CALLS, ERRORS = "tool_calls_", "environment_errors_"


class EpisodeMetrics:
    """Updated from each StepReport of a run with spec.environment (its `episodes` dict)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.labels = labels
        names = list(labels)
        self._gauges: dict[str, Gauge] = {}
        for name, help_text, label in STEP_GAUGES.values():
            if name not in self._gauges:
                self._gauges[name] = Gauge(name, help_text, [*names, *(label[:1] if label else ())], registry=registry)

        def counter(name: str, help_text: str, *more: str) -> Counter:
            return Counter(name, help_text, [*names, *more], registry=registry)

        self.episodes = counter("rljob_episodes", "Episodes by what happened to them", "outcome")
        self.turns = counter("rljob_episode_turns_played", "Model turns of the episodes played")
        self.tool_calls = counter("rljob_tool_calls", "Tool calls of the trained episodes, by tool", "tool")
        self.errors = counter("rljob_environment_errors", "Episode attempts an environment error ended", "kind")
        self._seen = Counts()

    def update(self, report: StepReport) -> None:
        stats = report.episodes
        for key, (name, _, label) in STEP_GAUGES.items():
            if key in stats:
                extra = dict([label]) if label else {}
                self._gauges[name].labels(**self.labels, **extra).set(stats[key])
        for key, value in stats.items():
            if key.startswith(TOOL_CALLS) and value > 0:
                self.tool_calls.labels(**self.labels, tool=key[len(TOOL_CALLS) :]).inc(value)
            elif key.startswith(ERRORS) and value > 0:
                self.errors.labels(**self.labels, kind=key[len(ERRORS) :]).inc(value)
        for field, outcome in EPISODE_OUTCOMES.items():
            delta = getattr(report.counts, field) - getattr(self._seen, field)
            if delta > 0:
                self.episodes.labels(**self.labels, outcome=outcome).inc(delta)
        if report.counts.turns > self._seen.turns:
            self.turns.labels(**self.labels).inc(report.counts.turns - self._seen.turns)
        self._seen = report.counts
