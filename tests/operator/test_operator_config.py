"""The operator's flags (each defaulting to an RLJOB_OPERATOR_* variable) and its metrics bookkeeping."""

from __future__ import annotations

import pytest

from rljob_api import PoolReplicas, PoolsStatus, Restarts, RLJobStatus
from rljob_operator.config import OperatorConfig
from rljob_operator.options import RenderOptions
from rljob_operator.process.flags import parse_config
from rljob_operator.reconcile.metrics import OperatorMetrics


def test_defaults() -> None:
    config = parse_config([], {})
    assert config == OperatorConfig()
    assert config.clusterwide and config.render == RenderOptions()


def test_environment_then_flags() -> None:
    env = {
        "RLJOB_OPERATOR_NAMESPACES": "research, team-a",
        "RLJOB_OPERATOR_INTERVAL": "2.5",
        "RLJOB_OPERATOR_SYSTEM_NODE_SELECTOR": '{"pool": "cpu"}',
        "RLJOB_OPERATOR_DRIVER_BACKOFF_LIMIT": "5",
    }
    config = parse_config(["--interval", "1", "--system-tolerations", '[{"key": "cpu", "operator": "Exists"}]'], env)
    assert config.namespaces == ("research", "team-a") and not config.clusterwide
    assert config.interval_seconds == 1.0  # the flag wins over the environment
    assert config.render.system_node_selector == {"pool": "cpu"}
    assert config.render.system_tolerations == ({"key": "cpu", "operator": "Exists"},)
    assert config.render.driver_backoff_limit == 5


def test_bad_json_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_config(["--system-node-selector", "[1, 2]"], {})


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_reconcile_counted_by_result() -> None:
    metrics = OperatorMetrics()
    with metrics.reconcile("reconcile"):
        pass
    with pytest.raises(ValueError), metrics.reconcile("reconcile"):
        raise ValueError("boom")
    assert value(metrics, "rljob_operator_reconciles_total", handler="reconcile", result="ok") == 1
    assert value(metrics, "rljob_operator_reconciles_total", handler="reconcile", result="ValueError") == 1
    assert value(metrics, "rljob_operator_errors_total", handler="reconcile", kind="ValueError") == 1
    assert value(metrics, "rljob_operator_reconcile_seconds_count", handler="reconcile", result="ok") == 1


def test_jobs_by_phase_and_forget() -> None:
    metrics = OperatorMetrics()
    pools = PoolsStatus(reward=PoolReplicas(desired=3, ready=2))
    metrics.observe_job(("ns", "a"), RLJobStatus(phase="Running", pools=pools), None)
    metrics.observe_job(("ns", "b"), RLJobStatus(phase="Running", restarts=Restarts(reward=2, driver=1)), None)
    metrics.observe_job(("ns", "c"), RLJobStatus(phase="Suspended"), None)
    assert value(metrics, "rljob_operator_jobs", phase="Running") == 2
    assert value(metrics, "rljob_operator_job_phase", namespace="ns", rljob="a", phase="Running") == 1
    assert value(metrics, "rljob_operator_pool_replicas", namespace="ns", rljob="a", pool="reward", state="ready") == 2
    assert value(metrics, "rljob_operator_restarts", namespace="ns", rljob="b", what="reward") == 2
    assert value(metrics, "rljob_operator_restarts", namespace="ns", rljob="b", what="driver") == 1
    assert value(metrics, "rljob_operator_restarts", namespace="ns", rljob="a", what="reward") is None  # none yet
    metrics.forget(("ns", "a"))
    assert value(metrics, "rljob_operator_jobs", phase="Running") == 1
    assert value(metrics, "rljob_operator_job_phase", namespace="ns", rljob="a", phase="Running") is None
