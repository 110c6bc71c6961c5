"""One writer of the RayCluster: every change of an RLJob's pools is one write, whoever asked for it.

The handlers (`ensure_children`) and the poller (`refresh`: reward scaling, a finished run) change the
job's desired state; `write_children` alone renders the RayCluster from it and writes it. Played in
process against a fake API server whose cached children lag behind on purpose, as kopf's indexes may: a cache
that has not seen the last write yet must not make the operator write the RayCluster again, or write
back an older reward group (replica counts that flap, and KubeRay deleting pods nobody drained).
"""

from __future__ import annotations

import asyncio
import base64
import copy
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import derive_worker_configs, parse_rljob
from rljob_operator.config import OperatorConfig
from rljob_operator.kube.ownership import NameTaken
from rljob_operator.reconcile.context import Context, owner_of, parse_job
from rljob_operator.reconcile.metrics import OperatorMetrics
from rljob_operator.reconcile.reconciler import ensure_children, refresh
from rljob_operator.reconcile.writer import job_token

REPO = Path(__file__).resolve().parents[2]
NS = "team"
NAME = "elastic"
RC = "elastic-ray"
ObjectKey = tuple[str, str, str]  # kind, namespace, name
OWNED = {"apiVersion": "rljob.io/v1alpha1", "kind": "RLJob", "name": NAME, "uid": "uid-1", "controller": True}


class FakeKube:
    """The Kube adapter over a dict of objects, recording every write as (verb, kind, name)."""

    def __init__(self) -> None:
        self.objects: dict[ObjectKey, dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str]] = []

    def put(self, obj: dict[str, Any]) -> None:
        """What another controller (KubeRay, the Job controller, a kubelet) writes."""
        meta = obj["metadata"]
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj

    async def apply(self, doc: dict[str, Any], *, urgent: bool = False) -> dict[str, Any]:
        self.writes.append(("apply", doc["kind"], doc["metadata"]["name"]))
        self.put(copy.deepcopy(doc))
        return doc

    async def create(self, doc: dict[str, Any]) -> bool:
        meta = doc["metadata"]
        if (doc["kind"], meta["namespace"], meta["name"]) in self.objects:
            return False
        self.writes.append(("create", doc["kind"], meta["name"]))
        self.put(copy.deepcopy(doc))
        return True

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, namespace, name)))

    async def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        self.writes.append(("delete", kind, name))
        return self.objects.pop((kind, namespace, name), None) is not None

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        return True

    async def post_event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def ray_cluster_writes(self) -> list[tuple[str, str, str]]:
        """The RayCluster writes since the last call."""
        found = [w for w in self.writes if w[1] == "RayCluster"]
        self.writes.clear()
        return found

    def reward_group(self) -> tuple[int, list[str]]:
        rc = self.objects[("RayCluster", NS, RC)]
        (group,) = [g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == "reward"]
        return group["replicas"], group["scaleStrategy"]["workersToDelete"]

    async def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """(Last: the name hides the builtin in the class body.)"""
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind and ns == namespace]


class _Informer:
    def __init__(self, cache: LaggingInformers, kind: str) -> None:
        self.cache, self.kind = cache, kind

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cache.seen.get((self.kind, namespace, name))

    def of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [
            o
            for (k, ns, _), o in self.cache.seen.items()
            if k == self.kind and ns == namespace and o["metadata"]["labels"].get("rljob.io/job") == job
        ]


class LaggingInformers:
    """Indexes (children.Children) that have seen the objects as of the last `sync()` only."""

    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.seen: dict[ObjectKey, dict[str, Any]] = {}
        self.ray_clusters, self.jobs, self.pods = (_Informer(self, k) for k in ("RayCluster", "Job", "Pod"))

    def sync(self) -> None:
        self.seen = copy.deepcopy(self.kube.objects)


class FakeControl:
    """The controller's ControlService: `status` is its answer (None: it does not answer)."""

    def __init__(self) -> None:
        self.status: control_pb.JobStatus | None = None

    async def snapshot(self, job: tuple[str, str], address: str, token: str) -> control_pb.JobStatus | None:
        return self.status

    async def forget(self, job: tuple[str, str]) -> None:
        pass


def running(desired: int, drained: tuple[str, ...] = ()) -> control_pb.JobStatus:
    reward = control_pb.PoolStatus(desired=desired, drained=list(drained))
    return control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, reward=reward)


def body(**spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["metadata"] = {"name": NAME, "namespace": NS, "uid": "uid-1", "generation": 1, "labels": {"team": "a"}}
    doc["spec"]["reward"]["replicas"] = {"min": 1, "max": 4}
    doc["spec"].update(spec)
    parse_rljob(doc)
    return doc


def pod(name: str, labels: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    ready = "True" if phase == "Running" else "False"
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"rljob.io/job": NAME, **labels}},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


def driver_job(complete: bool = False) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    meta = {"name": "elastic-driver", "namespace": NS, "labels": {"rljob.io/job": NAME}, "ownerReferences": [OWNED]}
    return {"kind": "Job", "metadata": meta, "status": {"conditions": conditions}}


def context() -> tuple[Context, FakeKube, LaggingInformers, FakeControl]:
    kube, control = FakeKube(), FakeControl()
    cache = LaggingInformers(kube)
    ctx = Context(config=OperatorConfig(), kube=cast(Any, kube), control=cast(Any, control), metrics=OperatorMetrics())
    ctx.children = cast(Any, cache)
    return ctx, kube, cache, control


async def handle(ctx: Context, doc: dict[str, Any]) -> None:
    """What the create/update/resume handler does."""
    job = parse_job(doc)
    configs = derive_worker_configs(job)
    await ensure_children(ctx, job, configs, doc)
    await refresh(ctx, job, configs, doc)


async def poll(ctx: Context, doc: dict[str, Any], full: bool = True) -> None:
    """What the poller does: every interval (`full`: the controller is polled), or when a child changed."""
    job = parse_job(doc)
    await refresh(ctx, job, derive_worker_configs(job), doc, poll_controller=full)


def test_one_ray_cluster_write_per_change_while_the_cached_children_lag() -> None:
    async def play() -> None:
        ctx, kube, cache, control = context()
        doc = body()
        await handle(ctx, doc)  # created
        assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)]
        assert kube.reward_group() == (1, [])
        # The run starts: the driver and one reward replica are up; the cache sees them.
        for p in (pod("elastic-driver-x", {"rljob.io/component": "driver"}), pod("r-0", {"rljob.io/pool": "reward"})):
            kube.put(p)
        kube.put(driver_job())
        cache.sync()
        control.status = running(desired=0)  # no decision yet
        await poll(ctx, doc)
        assert kube.ray_cluster_writes() == []

        # The controller wants 3: one write. The cache has not seen it yet.
        control.status = running(desired=3)
        await poll(ctx, doc)
        assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)]
        assert kube.reward_group() == (3, [])
        await poll(ctx, doc)  # the same decision again, read against the stale cache: nothing to write
        await poll(ctx, doc, full=False)
        assert kube.ray_cluster_writes() == []

        # A spec change (a label) while the cache still holds replicas 1: one write, and it keeps 3.
        doc["metadata"]["labels"] = {"team": "b"}
        await handle(ctx, doc)
        assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)]
        assert kube.reward_group() == (3, [])

        # Scale down: only the replica the controller drained goes, in one write.
        for name in ("r-1", "r-2"):
            kube.put(pod(name, {"rljob.io/pool": "reward"}))
        cache.sync()
        control.status = running(desired=2, drained=("r-1",))
        await poll(ctx, doc)
        assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)]
        assert kube.reward_group() == (2, ["r-1"])
        await poll(ctx, doc)
        assert kube.ray_cluster_writes() == []

        # The run ends: the pools are released by one delete, whatever the cache still shows.
        control.status = None
        kube.put(driver_job(complete=True))
        kube.put(pod("elastic-driver-x", {"rljob.io/component": "driver"}, phase="Succeeded"))
        cache.sync()
        await poll(ctx, doc, full=False)
        assert kube.ray_cluster_writes() == [("delete", "RayCluster", RC)]
        await poll(ctx, doc)
        await handle(ctx, doc)  # a spec change after the end: still no pools
        assert [w for w in kube.ray_cluster_writes() if w[0] == "apply"] == []
        assert ("Job", NS, "elastic-driver") in kube.objects  # the record of how the run ended stays

        reasons = [reason for reason, _ in kube.events]
        assert reasons.count("RewardScaled") == 2 and reasons.count("PoolsReleased") == 1, kube.events

    asyncio.run(play())


def test_suspend_tears_the_pools_down_and_resume_starts_them_at_min() -> None:
    async def play() -> None:
        ctx, kube, cache, control = context()
        doc = body()
        await handle(ctx, doc)
        kube.put(pod("elastic-driver-x", {"rljob.io/component": "driver"}))
        kube.put(pod("r-0", {"rljob.io/pool": "reward"}))
        cache.sync()
        control.status = running(desired=4)
        await poll(ctx, doc)
        assert kube.reward_group() == (4, [])
        kube.ray_cluster_writes()
        cache.sync()

        suspended = {**doc, "spec": {**doc["spec"], "suspend": True}}
        control.status = None  # the controller goes with its driver
        await handle(ctx, suspended)
        assert kube.ray_cluster_writes() == [("delete", "RayCluster", RC)]
        assert ("Job", NS, "elastic-driver") not in kube.objects
        await poll(ctx, suspended)
        assert kube.ray_cluster_writes() == []
        assert ("Suspended", f"deleted RayCluster {RC}") in kube.events

        await handle(ctx, doc)  # resumed; the cache still shows the old RayCluster of 4
        assert kube.ray_cluster_writes() == [("apply", "RayCluster", RC)]
        assert kube.reward_group() == (1, [])

    asyncio.run(play())


def foreign(kind: str, name: str) -> dict[str, Any]:
    """Another application's object, of a child's name."""
    meta = {"name": name, "namespace": NS, "labels": {"app": "payments"}, "resourceVersion": "7"}
    return {"kind": kind, "metadata": meta, "data": {"theirs": "1"}}


def test_a_name_someone_else_holds_stops_every_write_until_it_is_free() -> None:
    async def play() -> None:
        ctx, kube, _, _ = context()
        doc = body()
        theirs = foreign("ConfigMap", "elastic-config")
        kube.put(copy.deepcopy(theirs))
        with pytest.raises(NameTaken, match="ConfigMap team/elastic-config exists and is not this RLJob's"):
            await handle(ctx, doc)
        assert kube.writes == [], "nothing of the job is written while one name is taken"
        assert kube.objects[("ConfigMap", NS, "elastic-config")] == theirs
        ctx.taken[(NS, NAME)] = "ConfigMap team/elastic-config exists"
        job = parse_job(doc)
        status = await refresh(ctx, job, derive_worker_configs(job), doc)
        assert status is not None
        (degraded,) = [c for c in status.conditions if c.type == "Degraded"]
        assert (degraded.status, degraded.reason) == ("True", "NameTaken")
        del kube.objects[("ConfigMap", NS, "elastic-config")]  # its owner frees the name
        ctx.taken.clear()
        await handle(ctx, doc)
        assert ("apply", "ConfigMap", "elastic-config") in kube.writes

    asyncio.run(play())


def test_a_suspended_job_deletes_no_pool_of_its_name_that_is_not_its_own() -> None:
    async def play() -> None:
        ctx, kube, _, _ = context()
        doc = body(suspend=True)
        theirs = {**foreign("RayCluster", RC), "spec": {}}
        kube.put(copy.deepcopy(theirs))  # a suspended job renders no pools: the name is not checked, only spared
        await handle(ctx, doc)
        assert kube.objects[("RayCluster", NS, RC)] == theirs
        assert ("delete", "RayCluster", RC) not in kube.writes

    asyncio.run(play())


def test_only_the_jobs_own_legacy_role_and_binding_are_removed() -> None:
    async def play() -> None:
        ctx, kube, _, _ = context()
        doc = body(serviceAccountName="payments")
        for kind in ("Role", "RoleBinding"):
            kube.put(foreign(kind, "payments"))  # another application's, named like the account
        await handle(ctx, doc)
        assert {k for k, _, _ in kube.objects} >= {"Role", "RoleBinding"}
        other, _, _, _ = context()
        other.kube = cast(Any, kube)
        kube.objects.clear()
        for kind in ("Role", "RoleBinding"):  # what an older operator made for this job
            kube.put({"kind": kind, "metadata": {"name": "payments", "namespace": NS, "ownerReferences": [OWNED]}})
        await handle(other, doc)
        assert not [k for k, _, _ in kube.objects if k in ("Role", "RoleBinding")]

    asyncio.run(play())


def test_a_token_secret_that_is_not_the_jobs_is_never_sent() -> None:
    async def play() -> None:
        ctx, kube, _, _ = context()
        doc = body()
        secret = foreign("Secret", "elastic-token")
        secret["data"] = {"token": base64.b64encode(b"someone-elses").decode()}
        kube.put(secret)
        assert await job_token(ctx, parse_job(doc), owner_of(doc)) is None
        with pytest.raises(NameTaken, match="Secret team/elastic-token"):
            await handle(ctx, doc)

    asyncio.run(play())


def test_the_jobs_token_secret_carries_rays_key_made_new_or_by_an_older_operator() -> None:
    """KubeRay reads Ray's token (authOptions.secretName) under `auth_token`: a new Secret holds the job's token
    under both keys, and one an older operator made with `token` alone gains the other, the token unchanged."""

    async def play() -> None:
        ctx, kube, _, _ = context()
        doc = body()
        await handle(ctx, doc)
        made = kube.objects[("Secret", NS, "elastic-token")]["stringData"]
        assert made["auth_token"] == made["token"] and len(made["token"]) >= 32
        older, _, _, _ = context()
        older.kube = cast(Any, kube)
        kube.objects.clear()
        token = base64.b64encode(b"the-jobs-token").decode()
        meta = {"name": "elastic-token", "namespace": NS, "ownerReferences": [OWNED]}
        kube.put({"kind": "Secret", "metadata": meta, "data": {"token": token}})
        await handle(older, doc)
        assert kube.objects[("Secret", NS, "elastic-token")]["data"] == {"auth_token": token}  # the applied key
        cluster = kube.objects[("RayCluster", NS, "elastic-ray")]["spec"]["authOptions"]
        assert cluster == {"mode": "token", "secretName": "elastic-token"}

    asyncio.run(play())
