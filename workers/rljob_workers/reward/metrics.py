"""Prometheus metrics of one reward replica, in a registry of its own (`RewardMetrics.registry`).

| metric | labels | what |
|---|---|---|
| `rljob_reward_backlog` | | samples accepted and not yet answered (queued + in flight) |
| `rljob_reward_function_latency_seconds` | kind, function | histogram of one function's time on one sample |
| `rljob_reward_latency_recent_seconds` | kind, quantile | p50 and p99 of each kind over its last 2048 calls |
| `rljob_reward_sample_latency_seconds` | | histogram of a whole sample's time (every function) |
| `rljob_reward_errors_total` | kind, function, error_class | failed calls; invalid requests have kind `request` |
| `rljob_reward_refused_total` | reason | samples declined unscored (`resource_exhausted`, `draining`) |
| `rljob_reward_scored_total` | | samples answered with a score |

Recording is a counter increment and a deque append; quantiles are computed only when scraped.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rljob.v1 import sample_pb2
from rljob_workers.reward.base import ERROR_CLASS_NAMES

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RECENT_WINDOW = 2048
QUANTILES = (0.5, 0.99)


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (nearest rank); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class RewardMetrics:
    """The metrics of one reward replica; see the module docstring."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._server: WSGIServer | None = None  # serving /metrics, once `serve` is called
        self._thread: threading.Thread | None = None
        r = self.registry
        self.backlog = Gauge("rljob_reward_backlog", "Samples accepted and not yet answered", registry=r)
        self.latency = Histogram(
            "rljob_reward_function_latency_seconds",
            "Seconds one reward function spent on one sample",
            ["kind", "function"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.sample_latency = Histogram(
            "rljob_reward_sample_latency_seconds", "Seconds to score one sample", buckets=LATENCY_BUCKETS, registry=r
        )
        self.errors = Counter(
            "rljob_reward_errors", "Failed reward function calls", ["kind", "function", "error_class"], registry=r
        )
        self.refused = Counter("rljob_reward_refused", "Samples declined without scoring", ["reason"], registry=r)
        self.scored = Counter("rljob_reward_scored", "Samples answered with a score", registry=r)
        self._recent: dict[str, deque[float]] = {}
        self._lock = threading.Lock()  # the scrape runs in the HTTP server's thread
        r.register(_RecentQuantiles(self))

    def observe_call(self, kind: str, function: str, seconds: float, error_class: int | None) -> None:
        """One reward function's call on one sample."""
        self.latency.labels(kind, function).observe(seconds)
        with self._lock:
            self._recent.setdefault(kind, deque(maxlen=RECENT_WINDOW)).append(seconds)
        if error_class is not None:
            self.errors.labels(kind, function, ERROR_CLASS_NAMES.get(error_class, "unspecified")).inc()

    def observe_answer(self, score: sample_pb2.SampleScore) -> None:
        """One scored sample's answer (error or not)."""
        self.sample_latency.observe(score.latency_seconds)
        if not score.HasField("error"):
            self.scored.inc()

    def observe_invalid(self) -> None:
        self.errors.labels("request", "", ERROR_CLASS_NAMES[sample_pb2.ERROR_CLASS_INVALID]).inc()

    def latency_quantiles(self) -> dict[str, dict[str, float]]:
        """p50 and p99 seconds of each kind over its recent calls: ``{"rule": {"p50": ..., "p99": ...}}``."""
        with self._lock:
            recent = {kind: list(values) for kind, values in self._recent.items()}
        return {kind: {f"p{round(q * 100)}": quantile(v, q) for q in QUANTILES} for kind, v in recent.items()}

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve /metrics over HTTP until `close`; port 0 picks a free one. Returns the port."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving /metrics (with the replica), so neither its thread nor its port outlives it."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            if self._thread is not None:
                self._thread.join(5)


class _RecentQuantiles(Collector):
    def __init__(self, metrics: RewardMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "rljob_reward_latency_recent_seconds",
            f"Quantiles of reward function latency per kind over its last {RECENT_WINDOW} calls",
            labels=["kind", "quantile"],
        )
        for kind, values in self.metrics.latency_quantiles().items():
            for name, value in values.items():
                family.add_metric([kind, str(int(name[1:]) / 100)], value)
        yield family
