"""Helpers of the operator's e2e modules on GPU pools: tainted fake GPU nodes (kwok) made in batches,
RLJobs that select them, and checks of where their pool pods landed and of the operator's errors."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2e_cluster import E2E, Cluster, OperatorProcess, wait_for
from e2e_jobs import ARITHMETIC, rljob

sys.path.insert(0, str(E2E))
from nodes import Pool

GPU_TOLERATION = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
POOLS = ("rollout", "trainer", "reward")


def gpu_job(name: str, ns: str, reward_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The arithmetic example on the GPU pools: 8 GPUs for the rollout replica (vLLM, tensor-parallel 8) and the
    trainer rank."""
    return rljob(
        name,
        ns,
        rollout={
            **ARITHMETIC["spec"]["rollout"],
            "engine": "vllm",  # 8 GPUs per replica take a sharded engine: tensor-parallel 8
            "tensorParallelSize": 8,
            "gpusPerReplica": 8,
            "nodeSelector": {"rljob.io/pool": "rollout"},
            "tolerations": GPU_TOLERATION,
        },
        trainer={
            **ARITHMETIC["spec"]["trainer"],
            "gpusPerNode": 8,
            "nodeSelector": {"rljob.io/pool": "trainer"},
            "tolerations": GPU_TOLERATION,
        },
        reward={
            **ARITHMETIC["spec"]["reward"],
            "nodeSelector": reward_selector or {"rljob.io/pool": "reward"},
            "tolerations": GPU_TOLERATION,
        },
    )


def pool(name: str, count: int, gpus: int, prefix: str = "") -> list[dict[str, Any]]:
    p = Pool(name=f"{prefix}{name}", count=count, gpus=gpus, labels={"rljob.io/pool": name}, taints=TAINT)
    return p.nodes()


def create_nodes(cluster: Cluster, nodes: list[dict[str, Any]], batch: int = 100, workers: int = 4) -> None:
    """Server-side apply in batches, a few kubectl processes at once. The status in the document is
    kept when the node is created (kwok then keeps it Ready); capacity is checked by the callers."""
    chunks = [nodes[i : i + batch] for i in range(0, len(nodes), batch)]

    def one(chunk: list[dict[str, Any]]) -> None:
        docs = "\n---\n".join(json.dumps(n) for n in chunk)
        cluster.kubectl(
            "apply", "--server-side", "--field-manager=rljob-e2e-nodes", "--force-conflicts", "-f", "-", input=docs
        )

    with ThreadPoolExecutor(workers) as pool_:
        list(pool_.map(one, chunks))


def ready_nodes(cluster: Cluster, selector: str) -> dict[str, dict[str, str]]:
    """Ready nodes matching `selector`: name -> labels."""
    items = json.loads(cluster.kubectl("get", "nodes", "-l", selector, "-o", "json").stdout)["items"]
    return {
        n["metadata"]["name"]: n["metadata"]["labels"]
        for n in items
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
    }


def wait_ready(cluster: Cluster, selector: str, count: int, timeout: float) -> dict[str, dict[str, str]]:
    return wait_for(
        f"{count} Ready nodes ({selector})",
        lambda: (lambda got: got if len(got) == count else None)(ready_nodes(cluster, selector)),
        timeout=timeout,
        every=1.0,
    )


def node_labels(cluster: Cluster) -> dict[str, dict[str, str]]:
    out = cluster.kubectl("get", "nodes", "-o", "json").stdout
    return {n["metadata"]["name"]: n["metadata"]["labels"] for n in json.loads(out)["items"]}


def pool_pods(cluster: Cluster, ns: str, selector: str = "rljob.io/pool") -> list[dict[str, Any]]:
    return [p for p in cluster.objects("pods", ns, selector) if not p["metadata"].get("deletionTimestamp")]


def pods_summary(cluster: Cluster, ns: str, selector: str) -> list[str]:
    """One line per pod for a failure message: name, phase, node and why it is not scheduled."""
    lines = []
    for p in cluster.objects("pods", ns, selector):
        status = p.get("status") or {}
        scheduled: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "PodScheduled"), {})
        deleting = " deleting" if p["metadata"].get("deletionTimestamp") else ""
        lines.append(
            f"{p['metadata']['name']} {status.get('phase')}{deleting} on {p['spec'].get('nodeName')!r}"
            f" scheduled={scheduled.get('status')} {scheduled.get('message', '')}".rstrip()
        )
    return lines


def misplaced(pods: list[dict[str, Any]], nodes: dict[str, dict[str, str]]) -> list[str]:
    """Pool pods on a node of another pool (or on no known node)."""
    bad = []
    for p in pods:
        pool_ = p["metadata"]["labels"]["rljob.io/pool"]
        node = p["spec"].get("nodeName")
        if nodes.get(node or "", {}).get("rljob.io/pool") != pool_:
            bad.append(f"{p['metadata']['name']} (pool {pool_}) on {node!r} {nodes.get(node or '')}")
    return bad


def all_pools_running(cluster: Cluster, ns: str, job: str) -> list[dict[str, Any]] | None:
    pods = pool_pods(cluster, ns, f"rljob.io/job={job},rljob.io/pool")
    pools = sorted(p["metadata"]["labels"]["rljob.io/pool"] for p in pods if p["status"].get("phase") == "Running")
    return pods if pools == sorted(POOLS) else None


def operator_errors(op: OperatorProcess) -> list[str]:
    """Metric samples that count a failed reconcile or an operator error (non-zero only)."""
    bad = []
    for line in op.metrics().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        failed = name.startswith("rljob_operator_errors_total") or (
            name.startswith("rljob_operator_reconciles_total") and 'result="ok"' not in name
        )
        if failed and float(value) > 0:
            bad.append(line)
    return bad
