"""The operator on GPU pools of a real control plane: placement, a lost reward node, and scale.

Same setup as test_operator_integration.py (one e2e cluster per module, the operator as a
subprocess with the chart's RBAC, a stand-in ControlService, the tests as the kubelet of the head and
driver pods: the fixtures of e2e_fixtures.py), but with the three tainted GPU pools of
e2e/pools.example.yaml and jobs that select them (helpers in e2e_gpu.py). The last test adds 1,000
fake GPU nodes and applies 50 RLJobs at once (2-3 minutes on 2 cores).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from e2e_cluster import Cluster, OperatorProcess, skip_without_binaries, wait_for
from e2e_gpu import (
    POOLS,
    TAINT,
    Pool,
    all_pools_running,
    create_nodes,
    gpu_job,
    misplaced,
    node_labels,
    operator_errors,
    pods_summary,
    pool,
    pool_pods,
    wait_ready,
)
from e2e_jobs import condition, phase_is, run_pods, status_of, status_where

pytestmark = [skip_without_binaries(), pytest.mark.cluster]
pytest_plugins = ["e2e_fixtures"]
NS_PREFIX = "s"
# test_reward_node_lost_and_back has a reward pool of its own (one node), so deleting that node
# touches no other test's pods; its nodes still carry `rljob.io/pool: reward`.
LOST_POOL = Pool(name="reward-lost", count=1, gpus=4, labels={"rljob.io/pool": "reward"}, taints=TAINT)
SCALE_NODES = 1000
SCALE_JOBS = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("e2e-scale-state"))
    try:
        c.start()
        # The pools of e2e/pools.example.yaml (labels, taints, GPUs), rollout and trainer with two nodes
        # each so that two jobs of 8+8 GPUs fit at once, and the pool of the lost-node test.
        create_nodes(c, [*pool("rollout", 2, 8), *pool("trainer", 2, 8), *pool("reward", 1, 4), *LOST_POOL.nodes()])
        wait_ready(c, "rljob.io/e2e-pool in (rollout,trainer,reward,reward-lost)", 6, timeout=60)
        yield c
    finally:
        c.script("clean")


# ---------------------------------------------------------------- the tests


def test_pool_pods_land_on_their_pool_and_job_runs(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    """Not covered by test_operator_integration.py: there the pools are a CPU pool with no
    nodeSelector, and no test compares a pod's node with its pool."""
    cluster.apply(gpu_job("placed", ns))
    pods = wait_for("a Running pod in every pool", lambda: all_pools_running(cluster, ns, "placed"), timeout=120)
    nodes = node_labels(cluster)
    assert not misplaced(pods, nodes), misplaced(pods, nodes)
    assert sorted(p["metadata"]["labels"]["rljob.io/pool"] for p in pods) == sorted(POOLS)
    gpus = {
        p["metadata"]["labels"]["rljob.io/pool"]: p["spec"]["containers"][0]["resources"]
        .get("limits", {})
        .get("nvidia.com/gpu")
        for p in pods
    }
    assert gpus["rollout"] == "8" and gpus["trainer"] == "8", gpus
    run_pods(cluster, "placed", ns)
    status = wait_for("phase Running", lambda: phase_is(cluster, "placed", ns, "Running"), timeout=60)
    assert status["pools"] == {p: {"desired": 1, "ready": 1} for p in POOLS}, status["pools"]
    for kind in ("RolloutReady", "TrainerReady", "RewardReady"):
        assert condition(status, kind)["status"] == "True", condition(status, kind)
    assert condition(status, "Degraded")["status"] == "False", condition(status, "Degraded")


def test_reward_node_lost_and_back(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    cluster.apply(gpu_job("lost", ns, reward_selector={"rljob.io/e2e-pool": LOST_POOL.name}))
    pods = wait_for("a Running pod in every pool", lambda: all_pools_running(cluster, ns, "lost"), timeout=120)
    (reward,) = [p for p in pods if p["metadata"]["labels"]["rljob.io/pool"] == "reward"]
    node = reward["spec"]["nodeName"]
    assert node == LOST_POOL.node_names()[0], node
    run_pods(cluster, "lost", ns)
    wait_for("phase Running", lambda: phase_is(cluster, "lost", ns, "Running"), timeout=60)

    t0 = time.monotonic()
    cluster.kubectl("delete", "node", node, "--wait=true", "--timeout=60s")

    def reported() -> dict[str, Any] | None:
        s = status_of(cluster, "lost", ns)
        ready = condition(s, "RewardReady")
        degraded = condition(s, "Degraded")
        ok = (
            s.get("pools", {}).get("reward", {}).get("ready") == 0
            and ready.get("status") == "False"
            and degraded.get("status") == "True"
            and "reward" in degraded.get("message", "")
        )
        return s if ok else None

    # The pod GC removes the pods of a vanished node after a 40 s quarantine; KubeRay makes a new
    # reward pod, which no node can take.
    status = wait_for("the lost reward node reported", reported, timeout=150, every=1.0)
    print(f"reward node deleted -> reported in {time.monotonic() - t0:.1f}s: {condition(status, 'Degraded')}")
    assert status["phase"] == "Provisioning", status["phase"]
    assert condition(status, "RewardReady")["reason"] == "Unschedulable", condition(status, "RewardReady")
    assert condition(status, "Degraded")["reason"] == "Unschedulable", condition(status, "Degraded")
    assert (
        condition(status, "RolloutReady")["status"] == "True" and condition(status, "TrainerReady")["status"] == "True"
    )
    wait_for(
        "an event naming the reward pool",
        lambda: [e for e in cluster.events(ns, "lost") if e["reason"] == "Unschedulable" and "reward" in e["message"]],
    )
    old = reward["metadata"]["name"]
    assert old not in [p["metadata"]["name"] for p in pool_pods(cluster, ns, "rljob.io/job=lost")]

    t1 = time.monotonic()
    bring_back_cordoned(cluster, node)
    try:
        pods = wait_for("reward pod rescheduled, Running", lambda: all_pools_running(cluster, ns, "lost"), timeout=90)
    except AssertionError as e:
        raise AssertionError(f"{e}; pods: {pods_summary(cluster, ns, 'rljob.io/job=lost')}") from None
    (again,) = [p for p in pods if p["metadata"]["labels"]["rljob.io/pool"] == "reward"]
    assert again["metadata"]["name"] != old and again["spec"]["nodeName"] == node, again["spec"].get("nodeName")
    status = wait_for(
        "phase Running with the reward pool ready again",
        lambda: phase_is(cluster, "lost", ns, "Running"),
        timeout=60,
    )
    print(f"reward node back -> Running in {time.monotonic() - t1:.1f}s")
    assert status["pools"]["reward"] == {"desired": 1, "ready": 1}
    assert condition(status, "RewardReady")["status"] == "True"
    assert condition(status, "Degraded")["status"] == "False", condition(status, "Degraded")


def bring_back_cordoned(cluster: Cluster, node: str) -> None:
    """The lost node registers again, as a kubelet would, but cordoned until kwok holds its Lease.

    kwok (v0.8) plays a pod only on a node whose Lease its cache shows it holding; a pod bound in the
    moment before (the node was just created, the pod waited Pending for it) is skipped and never looked
    at again. A real kubelet has no such window, so the test keeps the pod off the node until then."""
    create_nodes(cluster, [{**n, "spec": {**n.get("spec", {}), "unschedulable": True}} for n in LOST_POOL.nodes()])
    wait_ready(cluster, f"rljob.io/e2e-pool={LOST_POOL.name}", 1, timeout=60)
    wait_for(f"kwok holding the Lease of {node}", lambda: cluster.get("lease", node, "kube-node-lease"), timeout=60)
    cluster.kubectl("uncordon", node)


def test_pool_pod_marked_not_ready_and_back(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    """A Running pool pod marked NotReady, as the node lifecycle controller marks the pods of a node whose
    Lease came late, is Ready again (e2e/stages/pod-ready-resync.yaml, a kubelet's status sync) and its job
    Running. Before that stage such a pod stayed NotReady for good: under load the scale test's jobs then
    never left Provisioning."""
    cluster.apply(gpu_job("flap", ns))
    pods = wait_for("a Running pod in every pool", lambda: all_pools_running(cluster, ns, "flap"), timeout=120)
    run_pods(cluster, "flap", ns)
    wait_for("phase Running", lambda: phase_is(cluster, "flap", ns, "Running"), timeout=60)
    (rollout,) = [p for p in pods if p["metadata"]["labels"]["rljob.io/pool"] == "rollout"]
    name = rollout["metadata"]["name"]
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "NodeNotReady"}]}}
    patched = cluster.kubectl(
        "patch", "pod", name, "-n", ns, "--subresource=status", "--type=strategic", "-p", json.dumps(not_ready),
        "-o", "json",
    )  # fmt: skip
    assert condition(json.loads(patched.stdout)["status"], "Ready")["status"] == "False"

    def ready_again() -> dict[str, Any] | None:
        pod = cluster.get("pod", name, ns)
        ready = condition((pod or {}).get("status") or {}, "Ready")
        return pod if ready.get("status") == "True" and pod and pod["status"].get("phase") == "Running" else None

    def running(status: dict[str, Any]) -> bool:
        return status.get("phase") == "Running" and status.get("pools", {}).get("rollout") == {"desired": 1, "ready": 1}

    wait_for(f"{name} Ready again", ready_again, timeout=30)
    status = wait_for("phase Running, rollout ready", lambda: status_where(cluster, "flap", ns, running), timeout=30)
    assert condition(status, "RolloutReady")["status"] == "True", condition(status, "RolloutReady")


def test_scale_1000_gpu_nodes_50_jobs(
    cluster: Cluster, operator: OperatorProcess, ns: str, request: pytest.FixtureRequest
) -> None:
    add_scale_nodes(cluster)
    names = [f"job-{i:02d}" for i in range(SCALE_JOBS)]
    docs = "\n---\n".join(json.dumps(gpu_job(n, ns)) for n in names)
    seen = FirstSeen(cluster, ns)  # watches RLJobs and RayClusters while the apply runs
    request.addfinalizer(seen.stop)
    applied = time.monotonic()
    cluster.kubectl("apply", "--server-side", "-f", "-", input=docs)
    apply_s = time.monotonic() - applied
    play_kubelet_until_running(cluster, ns, seen, deadline=applied + 240)
    all_running = time.monotonic() - applied
    seen.stop()
    assert sorted(seen.raycluster) == names, sorted(set(names) - set(seen.raycluster))
    assert sorted(seen.rljob) == names, sorted(set(names) - set(seen.rljob))

    pods = pool_pods(cluster, ns)
    assert len(pods) == 3 * SCALE_JOBS, len(pods)
    labels = node_labels(cluster)
    assert not misplaced(pods, labels), misplaced(pods, labels)[:10]
    assert all(p["status"].get("phase") == "Running" for p in pods)
    errors = operator_errors(operator)
    assert not errors, errors

    waits = sorted(seen.raycluster[n] - seen.rljob[n] for n in names)
    p50 = statistics.median(waits)
    p99 = waits[min(len(waits) - 1, round(0.99 * (len(waits) - 1)))]
    print(
        f"{SCALE_JOBS} RLJobs: kubectl apply {apply_s:.1f}s; RLJob -> RayCluster p50 {p50:.1f}s p99 {p99:.1f}s "
        f"max {waits[-1]:.1f}s (first seen by kubectl watches); "
        f"all Running after {all_running:.1f}s; "
        f"pods on {len({p['spec']['nodeName'] for p in pods})} distinct nodes"
    )


def add_scale_nodes(cluster: Cluster) -> None:
    """1,000 kwok GPU nodes (8 GPUs each) in the three pools, all Ready."""
    t0 = time.monotonic()
    per_pool = {"rollout": 400, "trainer": 400, "reward": 200}
    assert sum(per_pool.values()) == SCALE_NODES
    nodes = [n for name, count in per_pool.items() for n in pool(name, count, 8, prefix="scale-")]
    create_nodes(cluster, nodes)
    created = time.monotonic() - t0
    selector = "rljob.io/e2e-pool in (scale-rollout,scale-trainer,scale-reward)"
    wait_ready(cluster, selector, SCALE_NODES, timeout=180)
    print(f"{SCALE_NODES} kwok GPU nodes: applied in {created:.1f}s, all Ready after {time.monotonic() - t0:.1f}s")
    sample = cluster.get("node", "scale-reward-199", "")
    assert sample is not None and sample["status"]["allocatable"].get("nvidia.com/gpu") == "8", sample


def play_kubelet_until_running(cluster: Cluster, ns: str, seen: FirstSeen, deadline: float) -> None:
    """Play the kubelet of the head and driver pods until every RLJob of `ns` is Running; fail naming
    the jobs that are not after `deadline` (time.monotonic())."""
    kubeleted: set[str] = set()
    running: list[str] = []
    while True:
        # Play the kubelet of the head and driver pods that appeared since the last round.
        system = [
            name
            for name, phase in phases(cluster, "pods", ns, "rljob.io/component in (head,driver)").items()
            if name not in kubeleted and phase == "Pending"
        ]
        with ThreadPoolExecutor(4) as pool_:
            list(pool_.map(lambda name: _kubelet_pod(cluster, ns, name), system))
        kubeleted.update(system)
        jobs = phases(cluster, "rljobs", ns)
        running = sorted(name for name, phase in jobs.items() if phase == "Running")
        if len(running) == SCALE_JOBS:
            return
        if time.monotonic() > deadline:
            stuck = {name: phase for name, phase in jobs.items() if phase != "Running"}
            raise AssertionError(
                f"{len(running)}/{SCALE_JOBS} jobs Running after 240s; RayClusters {len(seen.raycluster)}; "
                f"not Running: {stuck}; first of them: {_explain(cluster, ns, sorted(stuck)[0])}"
            )
        time.sleep(1.0)


def phases(cluster: Cluster, kind: str, ns: str, selector: str = "") -> dict[str, str]:
    """{name: status.phase} of the namespace's objects of `kind`, read with a jsonpath: a loop of `-o json`
    lists of 50 objects with their managed fields kept a core busy beside the operator it waited on."""
    args = ["get", kind, "-n", ns, "-o", 'jsonpath={range .items[*]}{.metadata.name}{" "}{.status.phase}{"\\n"}{end}']
    if selector:
        args += ["-l", selector]
    rows = [line.split(" ", 1) for line in cluster.kubectl(*args).stdout.splitlines() if line.strip()]
    return {row[0]: row[1].strip() if len(row) == 2 else "" for row in rows}


def _kubelet_pod(cluster: Cluster, ns: str, name: str) -> None:
    """Cluster.kubelet(..., "Running") for one pod known by name: one kubectl call, not a list and a patch."""
    ready = [{"type": t, "status": "True"} for t in ("PodScheduled", "Ready", "ContainersReady")]
    cluster.kubectl(
        "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Running", "conditions": ready}}),
    )  # fmt: skip


def _explain(cluster: Cluster, ns: str, job: str) -> str:
    """A stuck job's pools and conditions, and its pods' phases and nodes (for failure messages)."""
    status = status_of(cluster, job, ns)
    conditions = {c["type"]: (c["status"], c["reason"], c.get("message", "")) for c in status.get("conditions", [])}
    pods = [
        (p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"))
        for p in cluster.objects("pods", ns, f"rljob.io/job={job}")
    ]
    return f"pools {status.get('pools')}; conditions {conditions}; pods {pods}"


class FirstSeen:
    """`kubectl get --watch` of the namespace's RLJobs and of its RayClusters, each a subprocess printing one
    name per event, recording when each job's RLJob and RayCluster was first seen (time.monotonic()). A watch
    is told of each object as it is written; a loop listing 100 objects with `kubectl get -o json` took
    ~2.7 s a round under the test's load and kept a core busy, slowing the operator it measured."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.rljob: dict[str, float] = {}
        self.raycluster: dict[str, float] = {}
        kubectl = cluster.kubectl_binary
        self._watches = [
            self._watch(
                [kubectl, "get", kind, "-n", ns, "--watch", "-o", f'jsonpath={name}{{"\\n"}}'], cluster.env, seen
            )
            for kind, name, seen in (
                ("rljobs", "{.metadata.name}", self.rljob),
                ("rayclusters", "{.metadata.labels.rljob\\.io/job}", self.raycluster),
            )
        ]

    @staticmethod
    def _watch(
        command: list[str], env: dict[str, str], seen: dict[str, float]
    ) -> tuple[subprocess.Popen[str], threading.Thread]:
        watch = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def read() -> None:
            assert watch.stdout is not None
            for line in watch.stdout:
                if line.strip():
                    seen.setdefault(line.strip(), time.monotonic())

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        return watch, reader

    def stop(self) -> None:
        for watch, reader in self._watches:
            watch.terminate()
            watch.wait(timeout=10)
            reader.join(timeout=10)
