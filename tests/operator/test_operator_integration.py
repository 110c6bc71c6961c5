"""The operator against a real kube-apiserver, etcd, controller-manager, scheduler, kwok and KubeRay.

The module starts its own control plane with e2e/cluster.sh (in a temporary state folder) and
stops it at the end; it is skipped, with the reason, when the e2e binaries are not built
(`e2e/build.sh`). The operator runs as a subprocess (`python -m rljob_operator`); a stand-in
ControlService plays the controller, and the tests play the kubelet of the head and driver pods
(see e2e_cluster.py for why). The operator authenticates as the Helm chart's ServiceAccount with
the chart's cluster-wide RBAC, so every test also checks that those permissions suffice. Its log
is kept in pytest's temporary folder (the path is printed). The fixtures are e2e_fixtures.py's;
the API server's own checks of RLJobs are test_operator_crd.py's.

RLJOB_TEST_CRD=path installs another CRD file than crds/rljob.io_rljobs.yaml (to try a
regenerated one before committing it).
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import kubernetes
import prometheus_client
import pytest
from e2e_cluster import Cluster, FakeControl, OperatorProcess, skip_without_binaries, wait_for
from e2e_jobs import (
    ARITHMETIC,
    CHILD_COUNTS,
    all_children,
    children,
    condition,
    counted_children,
    phase_is,
    pools_ready,
    rljob,
    run_pods,
    status_where,
)

from rljob.v1 import control_service_pb2 as control_pb
from rljob_operator.config import OperatorConfig
from rljob_operator.kube.client import Kube
from rljob_operator.kube.control import ControlClients
from rljob_operator.kube.rights import CLUSTER_RIGHTS, RIGHTS, verbs_by_resource
from rljob_operator.process.handlers import poll_job
from rljob_operator.reconcile.context import Context
from rljob_operator.reconcile.metrics import OperatorMetrics

pytestmark = [skip_without_binaries(), pytest.mark.cluster]
pytest_plugins = ["e2e_fixtures"]


def test_children_appear_owned_and_labelled(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    cluster.apply(rljob("owned", ns))
    uid = wait_for("the RLJob", lambda: cluster.get("rljob", "owned", ns))["metadata"]["uid"]
    found = wait_for("every child", lambda: all_children(cluster, "owned", ns))
    assert [s["metadata"]["name"] for s in found["service"]] == ["owned-control", "owned-metrics", "owned-reward"]
    for kind, objects in found.items():
        for obj in objects:
            meta = obj["metadata"]
            assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in meta["ownerReferences"]] == [
                ("RLJob", "owned", uid, True)
            ], kind
            assert meta["labels"]["app.kubernetes.io/managed-by"] == "rljob-operator"
            assert meta["labels"]["team"] == "e2e"
            if kind == "secret":  # created once, never applied: the token must not change
                continue
            managers = {m["manager"] for m in meta.get("managedFields", []) if m["operation"] == "Apply"}
            assert managers == {"rljob-operator"}, kind
    # Applied at the first attempt (a RoleBinding applied before its Role is refused, for one).
    assert "ApplyFailed" not in [e["reason"] for e in cluster.events(ns, "owned")]
    # KubeRay made the pool pods from the worker groups; kwok runs them on the fake CPU nodes.
    for pool in ("rollout", "trainer", "reward"):
        wait_for(
            f"{pool} pod running",
            lambda pool=pool: [
                p
                for p in cluster.objects("pods", ns, f"rljob.io/job=owned,rljob.io/pool={pool}")
                if p["status"].get("phase") == "Running"
            ],
        )


def test_status_events_and_progress(cluster: Cluster, operator: OperatorProcess, fake: FakeControl, ns: str) -> None:
    cluster.apply(rljob("progress", ns))
    status = wait_for("pools ready", lambda: pools_ready(cluster, "progress", ns))
    assert status["phase"] == "Provisioning"  # head and driver are not up yet
    assert status["observedGeneration"] == 1
    run_pods(cluster, "progress", ns)
    status = wait_for("phase Running", lambda: phase_is(cluster, "progress", ns, "Running"))
    assert condition(status, "Progressing")["reason"] == "ControllerUnreachable"
    fake.status = control_pb.JobStatus(
        phase=control_pb.RUN_PHASE_RUNNING, step=3, total_steps=60, policy_version=3, reward_mean=0.5
    )
    status = wait_for("step 3", lambda: status_where(cluster, "progress", ns, lambda s: s.get("step") == 3))
    assert status["reward"]["mean"] == 0.5 and status["policyVersion"] == 3
    assert condition(status, "Progressing")["reason"] == "Training"
    line = cluster.kubectl("get", "rljob", "progress", "-n", ns, "--no-headers").stdout.split()
    assert line[:3] == ["progress", "Running", "3"], line  # printer columns: name, phase, step
    # The run ends: the driver pod succeeds, the Job completes, the pools are released.
    fake.status = None
    assert condition(status, "Ready")["status"] == "True" and condition(status, "Succeeded")["status"] == "False"
    cluster.kubelet(ns, "rljob.io/job=progress,rljob.io/component=driver", "Succeeded")
    # As a user (or a pipeline) waits for a run: kubectl wait on the terminal condition returns once it ends.
    waited = cluster.kubectl("wait", "--for=condition=Succeeded", "rljob/progress", "-n", ns, "--timeout=60s")
    assert "condition met" in waited.stdout, waited.stdout
    status = wait_for("phase Succeeded", lambda: phase_is(cluster, "progress", ns, "Succeeded"))
    assert condition(status, "Failed")["status"] == "False" and condition(status, "Ready")["status"] == "False"
    assert status["completionTime"] and status["step"] == 3
    wait_for("RayCluster released", lambda: cluster.get("raycluster", "progress-ray", ns) is None)
    assert cluster.get("job", "progress-driver", ns) is not None
    reasons = [e["reason"] for e in cluster.events(ns, "progress")]
    for reason in ("Provisioning", "Running", "Succeeded", "PoolsReleased"):
        assert reason in reasons, reasons
    # The poller sent the job's own token, from the Secret the operator made for it.
    secret = cluster.get("secret", "progress-token", ns)
    assert secret is not None and secret["type"] == "Opaque"
    assert f"Bearer {base64.b64decode(secret['data']['token']).decode()}" in fake.tokens


def test_insufficient_gpus_is_degraded(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    rollout = {
        **ARITHMETIC["spec"]["rollout"],
        "replicas": 2,
        "engine": "vllm",
        "tensorParallelSize": 8,
        "gpusPerReplica": 8,
        "nodeSelector": {"rljob.io/pool": "rollout"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    cluster.apply(rljob("greedy", ns, rollout=rollout))
    status = wait_for(
        "Degraded, with the one rollout pod that fits running",
        lambda: status_where(
            cluster,
            "greedy",
            ns,
            lambda s: condition(s, "Degraded").get("status") == "True" and s["pools"]["rollout"]["ready"] == 1,
        ),
    )
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "InsufficientGPUs" and "rollout" in degraded["message"], degraded
    assert condition(status, "RolloutReady")["reason"] == "InsufficientGPUs"
    assert status["pools"]["rollout"] == {"desired": 2, "ready": 1}
    wait_for("warning event", lambda: [e for e in cluster.events(ns, "greedy") if e["reason"] == "InsufficientGPUs"])


def test_suspend_and_resume(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    cluster.apply(rljob("pause", ns))
    wait_for("pools ready", lambda: pools_ready(cluster, "pause", ns))
    cluster.kubectl("patch", "rljob", "pause", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for("phase Suspended", lambda: phase_is(cluster, "pause", ns, "Suspended"))
    wait_for("pools torn down", lambda: cluster.get("raycluster", "pause-ray", ns) is None)
    wait_for("driver deleted", lambda: cluster.get("job", "pause-driver", ns) is None)
    wait_for("pool pods gone", lambda: not cluster.objects("pods", ns, "rljob.io/job=pause"))
    assert cluster.get("configmap", "pause-config", ns) is not None  # the config (and checkpoint path) stays
    cluster.kubectl("patch", "rljob", "pause", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for("RayCluster re-created", lambda: cluster.get("raycluster", "pause-ray", ns))
    wait_for("driver re-created", lambda: cluster.get("job", "pause-driver", ns))
    wait_for("pools ready again", lambda: pools_ready(cluster, "pause", ns))
    assert "Suspended" in [e["reason"] for e in cluster.events(ns, "pause")]


def test_a_claim_without_the_access_mode_its_pods_need_is_named(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    """Two trainer nodes write the checkpoints: a ReadWriteOnce claim cannot serve them. The job is suspended,
    so nothing is scheduled and the claim needs no volume behind it."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "runs", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    cluster.apply(claim)
    trainer = {**ARITHMETIC["spec"]["trainer"], "nodes": 2}
    checkpoint = {**ARITHMETIC["spec"]["checkpoint"], "volume": {"claimName": "runs", "mountPath": "/runs"}}
    cluster.apply(rljob("spread", ns, suspend=True, trainer=trainer, checkpoint=checkpoint))
    status = wait_for(
        "VolumesReady False",
        lambda: status_where(cluster, "spread", ns, lambda s: condition(s, "VolumesReady").get("status") == "False"),
    )
    volumes = condition(status, "VolumesReady")
    assert volumes["reason"] == "ClaimAccessMode", volumes
    assert f"{ns}/runs" in volumes["message"] and "needs ReadWriteMany" in volumes["message"], volumes
    wait_for("warning event", lambda: [e for e in cluster.events(ns, "spread") if e["reason"] == "ClaimAccessMode"])


def test_reward_group_follows_the_controller(
    cluster: Cluster, operator: OperatorProcess, fake: FakeControl, ns: str
) -> None:
    reward = {**ARITHMETIC["spec"]["reward"], "replicas": {"min": 1, "max": 4}}
    cluster.apply(rljob("elastic", ns, reward=reward))
    wait_for("pools ready", lambda: pools_ready(cluster, "elastic", ns))
    run_pods(cluster, "elastic", ns)
    selector = "rljob.io/job=elastic,rljob.io/pool=reward"

    def running_reward() -> list[str]:
        pods = cluster.objects("pods", ns, selector)
        return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))

    fake.status = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, reward=control_pb.PoolStatus(desired=9))
    wait_for("4 reward pods (max)", lambda: len(running_reward()) == 4)
    names = running_reward()
    # Asked for 1, with none drained: nothing goes.
    fake.status = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, reward=control_pb.PoolStatus(desired=1))
    time.sleep(3)
    assert running_reward() == names
    # Two drained: exactly those two go, the group shrinks to 2.
    drained = [names[0], names[2]]
    fake.status = control_pb.JobStatus(
        phase=control_pb.RUN_PHASE_RUNNING, reward=control_pb.PoolStatus(desired=1, drained=drained)
    )
    wait_for("drained pods removed", lambda: running_reward() == [names[1], names[3]])
    rc = cluster.get("raycluster", "elastic-ray", ns)
    assert rc is not None
    group = next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == "reward")
    assert group["replicas"] == 2
    time.sleep(2)
    assert running_reward() == [names[1], names[3]]  # KubeRay deleted no random pod
    assert "RewardScaled" in [e["reason"] for e in cluster.events(ns, "elastic")]


def test_delete_removes_every_child(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    cluster.apply(rljob("gone", ns))
    wait_for("children", lambda: cluster.get("raycluster", "gone-ray", ns))
    wait_for("pods", lambda: cluster.objects("pods", ns, "rljob.io/job=gone"))
    cluster.kubectl("delete", "rljob", "gone", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        "garbage collection",
        lambda: (
            not any(children(cluster, "gone", ns).values()) and not cluster.objects("pods", ns, "rljob.io/job=gone")
        ),
        timeout=90,
    )


def with_status(body: dict[str, Any] | None) -> dict[str, Any] | None:
    return body if body and body.get("status") else None


def test_a_job_deleted_while_polled_leaves_no_error_and_nothing_remembered(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    """The race behind a flaky scale run: the poller took an RLJob's body, then the RLJob was deleted
    (there is no finalizer to hold it). Played in process, in order, against the real API server, as the
    chart's ServiceAccount and without the children's indexes: the reads the operator falls back on (GET of the
    RayCluster and the Job) are audited as its own, whatever the running operator's watches did."""
    cluster.apply(rljob("vanish", ns))
    key = (ns, "vanish")

    async def play() -> tuple[OperatorMetrics, Context, Context]:
        kube = Kube(kubernetes.config.new_client_from_config(config_file=operator.env["KUBECONFIG"]), workers=2)
        metrics = OperatorMetrics()

        def context() -> Context:
            return Context(config=OperatorConfig(), kube=kube, control=ControlClients(0.5), metrics=metrics)

        # 1. Deleted before its status patch: the patch finds no RLJob (404).
        body = wait_for("the RLJob", lambda: cluster.get("rljob", "vanish", ns))
        body.pop("status", None)  # no status yet: the refresh patches one
        cluster.kubectl("delete", "rljob", "vanish", "-n", ns, "--wait=true")
        patched = context()
        patched.jobs[key] = body
        await poll_job(patched, key, body, full=True)

        # 2. Its DELETED event arrives while a refresh is under way, between its API reads and its
        # bookkeeping: what the refresh then keeps of the job must not outlive it.
        cluster.apply(rljob("vanish", ns))
        body = wait_for("the RLJob again", lambda: cluster.get("rljob", "vanish", ns))
        raced = context()
        raced.jobs[key] = body
        await poll_job(raced, key, body, full=True)  # writes a status; the body below carries it
        body = wait_for("its status", lambda: with_status(cluster.get("rljob", "vanish", ns)))
        raced.jobs[key] = body
        polling = asyncio.create_task(poll_job(raced, key, body, full=True))
        await asyncio.sleep(0)  # the refresh is now waiting on the API server
        await raced.forget(key)  # what the `remember` handler does on DELETED
        await polling
        cluster.kubectl("delete", "rljob", "vanish", "-n", ns, "--wait=true")
        kube.close()
        return metrics, patched, raced

    metrics, patched, raced = asyncio.run(play())
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert 'rljob_operator_reconciles_total{handler="poll",result="ok"} 3.0' in text, text
    assert "rljob_operator_errors_total{" not in text, text
    for ctx in (patched, raced):
        assert key not in ctx.last and key not in ctx.snapshots, (ctx.last, ctx.snapshots)
    assert 'rljob="vanish"' not in text, text  # no job series left behind
    assert 'rljob_operator_jobs{phase="Pending"} 0.0' in text, text


def test_deleting_rljobs_while_another_is_polled(
    cluster: Cluster, operator: OperatorProcess, fake: FakeControl, ns: str
) -> None:
    """Deleting an RLJob closed the controller channel of its address, which the stand-in's jobs share;
    a poll of another job in flight on it raised CancelledError, which ended the operator's poller: no
    status changed again (stop 26's CI, the scale test). Each poll here is in flight for 0.3 s of the
    1 s interval, and six jobs are deleted, one every 0.35 s."""
    cluster.apply(rljob("polled", ns))
    wait_for("pools ready", lambda: pools_ready(cluster, "polled", ns))
    run_pods(cluster, "polled", ns)
    wait_for("phase Running", lambda: phase_is(cluster, "polled", ns, "Running"))
    doomed = [f"doomed-{i}" for i in range(6)]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(rljob(n, ns)) for n in doomed))
    for name in doomed:
        wait_for(f"{name} seen by the operator", lambda name=name: (cluster.get("rljob", name, ns) or {}).get("status"))
    fake.delay = 0.3
    fake.status = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, step=5, total_steps=60)
    wait_for("step 5", lambda: status_where(cluster, "polled", ns, lambda s: s.get("step") == 5))
    for name in doomed:
        cluster.kubectl("delete", "rljob", name, "-n", ns, "--wait=false")
        time.sleep(0.35)
    fake.status = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, step=6, total_steps=60)
    wait_for("step 6 after the deletions", lambda: status_where(cluster, "polled", ns, lambda s: s.get("step") == 6))
    errors = [line for line in operator.metrics().splitlines() if line.startswith("rljob_operator_errors_total{")]
    assert not [line for line in errors if "CancelledError" in line], errors


def test_operator_restart_mid_reconcile_creates_no_duplicates(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    names = [f"restart-{i}" for i in range(6)]
    docs = "\n---\n".join(json.dumps(rljob(n, ns)) for n in names)
    cluster.kubectl("apply", "--server-side", "-f", "-", input=docs)
    # Kill the operator as soon as the first child appears: most jobs are half-applied then.
    wait_for("a first child", lambda: cluster.objects("configmap", ns, "rljob.io/job"), every=0.05)
    operator.stop(signal.SIGKILL)
    half = {n: sum(len(v) for v in children(cluster, n, ns).values()) for n in names}
    operator.start()
    for n in names:  # each child once: none doubled by the restart
        assert wait_for(f"children of {n}", lambda n=n: counted_children(cluster, n, ns)) == CHILD_COUNTS, n
    for n in names:
        wait_for(f"{n} pools ready", lambda n=n: pools_ready(cluster, n, ns))
        pods = cluster.objects("pods", ns, f"rljob.io/job={n}")
        pools = [p["metadata"]["labels"].get("rljob.io/pool") for p in pods]
        assert sorted(p for p in pools if p) == ["reward", "rollout", "trainer"], (n, pools)
        drivers = [p for p in pods if p["metadata"]["labels"].get("rljob.io/component") == "driver"]
        assert len(drivers) == 1, (n, [p["metadata"]["name"] for p in drivers])
    print("children per job when the operator was killed:", half)


def test_operator_metrics(cluster: Cluster, operator: OperatorProcess) -> None:
    # The operator restarted in the test above: its counters start again at zero, and its resumed jobs' reconciles
    # may still be under way (CI14 read the metrics before the first had ended).
    def counted() -> str | None:
        text = operator.metrics()
        return text if 'rljob_operator_reconciles_total{handler="reconcile",result="ok"}' in text else None

    text = wait_for("a reconcile counted", counted, timeout=60)
    assert "rljob_operator_reconcile_seconds_bucket" in text
    assert 'rljob_operator_jobs{phase="Running"}' in text
    assert "rljob_operator_pool_replicas" in text


@pytest.fixture(scope="module", autouse=True)
def requests_exactly_its_rights(cluster: Cluster, operator: OperatorProcess) -> Iterator[None]:
    """After every test of this module, whatever order they ran in (CI ran them out of file order, and a
    test meant to be last saw the claim test's request missing): the operator's requests checked."""
    yield
    assert_requested_exactly_its_rights(cluster)


def assert_requested_exactly_its_rights(cluster: Cluster) -> None:
    """Over the module's tests, the operator (as the chart's ServiceAccount) was refused nothing, requested
    nothing rights.py does not list, and every right listed as requested."""
    account = "system:serviceaccount:rljob-system:rljob-rljob-operator"
    events = [e for e in cluster.audit() if e["user"]["username"] == account and e.get("objectRef")]
    assert events, "no audit events of the operator: is the API server's audit log on (e2e/cluster.sh)?"
    # RBAC's refusals (not admission's, such as a namespace being deleted)
    refused = {
        (e["verb"], e["requestURI"])
        for e in events
        if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
    }
    assert not refused, f"the chart's RBAC refused the operator: {sorted(refused)}"
    used = set()
    for e in events:
        ref = e["objectRef"]
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, e["verb"]))
    listed = verbs_by_resource(RIGHTS + CLUSTER_RIGHTS, requested_only=True)
    may_request = verbs_by_resource(RIGHTS + CLUSTER_RIGHTS, requested_only=True, with_fallback=True)
    print("requested, not listed:", sorted(used - may_request), "listed, never requested:", sorted(listed - used))
    assert used - may_request == set(), "requested but not in rights.py (nor, so, in the chart)"
    # Fallback reads (before the watch cache syncs) may or may not come, as the operator's start races its
    # first reconcile: only the requested verbs must all show.
    missing = listed - used
    assert not missing, (
        f"in rights.py as requested, but never requested: {sorted(missing)}; {len(events)} events of the operator "
        f"in {cluster.audit_files()}, the first at {events[0].get('requestReceivedTimestamp')}, the last at "
        f"{events[-1].get('requestReceivedTimestamp')}; its claim reads: "
        f"{[e['requestURI'] for e in cluster.audit() if 'persistentvolumeclaims' in e.get('requestURI', '')]}"
    )
