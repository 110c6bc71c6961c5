"""The operator's Prometheus metrics: reconciles (count, latency, errors by result), jobs by phase,
and per-job pool sizes, idle fractions and replacements (read from the cluster and the controller) for
the dashboard."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import PHASES, PoolReplicas, RLJobStatus
from rljob_api.workercfg import POOLS

Key = tuple[str, str]  # (namespace, name)
RESTARTED = ("rollout", "reward", "environment", "trainer", "driver")  # the counts of RLJobStatus.restarts


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            "rljob_operator_reconciles", "Reconciles by handler and result", ["handler", "result"], registry=r
        )
        self.latency = Histogram(
            "rljob_operator_reconcile_seconds",
            "Reconcile latency by handler and result",
            ["handler", "result"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.errors = Counter("rljob_operator_errors", "Errors by handler and kind", ["handler", "kind"], registry=r)
        self.jobs = Gauge("rljob_operator_jobs", "RLJobs by phase", ["phase"], registry=r)
        self.job_phase = Gauge(
            "rljob_operator_job_phase", "1 for the RLJob's current phase", ["namespace", "rljob", "phase"], registry=r
        )
        self.pool_replicas = Gauge(
            "rljob_operator_pool_replicas",
            "Replicas of an RLJob's pool (state desired or ready)",
            ["namespace", "rljob", "pool", "state"],
            registry=r,
        )
        self.idle = Gauge(
            "rljob_operator_pool_idle_fraction",
            "Fraction of the last interval a pool was idle, as the controller reports it",
            ["namespace", "rljob", "pool"],
            registry=r,
        )
        self.restarts = Gauge(
            "rljob_operator_restarts",
            "Replacements so far of an RLJob's rollout and reward replicas, trainer groups and driver pods",
            ["namespace", "rljob", "what"],
            registry=r,
        )
        self._phases: dict[Key, str] = {}

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_address[1])

    @contextmanager
    def reconcile(self, handler: str) -> Iterator[None]:
        """Count and time one reconcile; an exception is counted with its type as the result."""
        start = time.perf_counter()
        result = "ok"
        try:
            yield
        except BaseException as exc:
            result = type(exc).__name__
            self.errors.labels(handler, result).inc()
            raise
        finally:
            self.reconciles.labels(handler, result).inc()
            self.latency.labels(handler, result).observe(time.perf_counter() - start)

    def observe_job(self, key: Key, status: RLJobStatus, snapshot: control_pb.JobStatus | None) -> None:
        namespace, name = key
        self._phases[key] = status.phase or "Pending"
        for phase in PHASES:
            self.job_phase.labels(namespace, name, phase).set(1 if phase == status.phase else 0)
        if status.pools is not None:
            for pool in POOLS:
                counts = status.pools.of(pool) or PoolReplicas()
                self.pool_replicas.labels(namespace, name, pool, "desired").set(counts.desired)
                self.pool_replicas.labels(namespace, name, pool, "ready").set(counts.ready)
        if snapshot is not None:
            for pool in POOLS:
                self.idle.labels(namespace, name, pool).set(getattr(snapshot, pool).idle_fraction)
        if status.restarts is not None:
            for what in RESTARTED:
                self.restarts.labels(namespace, name, what).set(getattr(status.restarts, what))
        self._count_phases()

    def forget(self, key: Key) -> None:
        """Drop a deleted RLJob's series."""
        namespace, name = key
        self._phases.pop(key, None)
        for gauge in (self.job_phase, self.pool_replicas, self.idle, self.restarts):
            gauge.remove_by_labels({"namespace": namespace, "rljob": name})
        self._count_phases()

    def _count_phases(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase).set(sum(1 for p in self._phases.values() if p == phase))
