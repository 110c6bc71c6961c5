"""RLJobs of the operator's e2e modules, and what they read back: status, conditions, children."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from typing import Any

import yaml
from e2e_cluster import REPO, Cluster, wait_for

ARITHMETIC = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
CHILD_KINDS = (
    "networkpolicy",
    "secret",
    "serviceaccount",
    "configmap",
    "service",
    "raycluster",
    "job",
)

CHILD_COUNTS = {kind: 3 if kind == "service" else 1 for kind in CHILD_KINDS}  # a running job's children


def rljob(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(ARITHMETIC)
    doc["metadata"] = {"name": name, "namespace": namespace, "labels": {"team": "e2e"}}
    doc["spec"].update(spec)
    return doc


def status_of(cluster: Cluster, name: str, ns: str) -> dict[str, Any]:
    return (cluster.get("rljob", name, ns) or {}).get("status") or {}


def phase_is(cluster: Cluster, name: str, ns: str, *phases: str) -> dict[str, Any] | None:
    status = status_of(cluster, name, ns)
    return status if status.get("phase") in phases else None


def status_where(
    cluster: Cluster, name: str, ns: str, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    status = status_of(cluster, name, ns)
    return status if status and predicate(status) else None


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def children(cluster: Cluster, name: str, ns: str) -> dict[str, list[dict[str, Any]]]:
    return {kind: cluster.objects(kind, ns, f"rljob.io/job={name}") for kind in CHILD_KINDS}


def counted_children(
    cluster: Cluster, name: str, ns: str, expected: dict[str, int] | None = None
) -> dict[str, int] | None:
    """A job's children by kind once each kind has all `expected` (CHILD_COUNTS; a wave's Services are
    applied side by side, so one may be seen before the others), or any kind has more (a duplicate)."""
    expected = expected or CHILD_COUNTS
    counts = {kind: len(objs) for kind, objs in children(cluster, name, ns).items()}
    done = all(counts[k] >= v for k, v in expected.items()) or any(counts[k] > v for k, v in expected.items())
    return counts if done else None


def all_children(cluster: Cluster, name: str, ns: str) -> dict[str, list[dict[str, Any]]] | None:
    found = children(cluster, name, ns)
    return found if all(found.values()) else None


def pools_ready(cluster: Cluster, name: str, ns: str) -> dict[str, Any] | None:
    status = status_of(cluster, name, ns)
    pools = status.get("pools") or {}
    ok = pools and all(p.get("ready", 0) >= p.get("desired", 1) > 0 for p in pools.values())
    return status if ok else None


def run_pods(cluster: Cluster, name: str, ns: str) -> None:
    """Head and driver up, as their kubelet would report them."""
    wait_for("head pod", lambda: cluster.objects("pods", ns, f"rljob.io/job={name},rljob.io/component=head"))
    cluster.kubelet(ns, f"rljob.io/job={name},rljob.io/component=head", "Running")
    wait_for("driver pod", lambda: cluster.objects("pods", ns, f"rljob.io/job={name},rljob.io/component=driver"))
    cluster.kubelet(ns, f"rljob.io/job={name},rljob.io/component=driver", "Running")


def start_kubectl_wait(cluster: Cluster, name: str, ns: str, condition: str) -> subprocess.Popen[str]:
    """`kubectl wait --for=condition=<condition> rljob/<name>` as a pipeline would run it, started now and left
    to return by itself; the caller reads its exit status and output once the job has ended."""
    wait = ["wait", f"--for=condition={condition}", f"rljob/{name}", "-n", ns, "--timeout=3600s"]
    command = [cluster.kubectl_binary, *wait]
    return subprocess.Popen(command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
