"""The access modes a job's claims need (pure), the problems found against the claims as the API server has
them, the VolumesReady condition, and the Warning Event the operator posts once per problem."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from rljob_api import RLJob, parse_rljob
from rljob_operator.config import OperatorConfig
from rljob_operator.reconcile.context import Context
from rljob_operator.reconcile.metrics import OperatorMetrics
from rljob_operator.reconcile.reconciler import check_claims_of
from rljob_operator.status.compute import compute_status
from rljob_operator.status.observe import observe
from rljob_operator.status.volumes import ClaimNeed, ClaimProblem, claim_needs, claim_problem, spread, volumes_condition

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def cluster_doc() -> dict[str, Any]:
    """examples/arithmetic-cluster.yaml: every pool of one replica, no node selectors, claims rljob-assets
    (model and data, read-only) and rljob-runs (checkpoints, written)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "arithmetic-cluster.yaml").read_text())
    doc["metadata"]["namespace"] = "team"
    return doc


def job(**pools: dict[str, Any]) -> RLJob:
    doc = cluster_doc()
    for pool, fields in pools.items():
        doc["spec"][pool].update(fields)
    return parse_rljob(doc)


def pvc(*modes: str, bound: bool = True) -> dict[str, Any]:
    """A claim asking for `modes`; bound, its volume's modes are the same."""
    claim: dict[str, Any] = {"kind": "PersistentVolumeClaim", "spec": {"accessModes": list(modes)}}
    claim["status"] = {"phase": "Bound", "accessModes": list(modes)} if bound else {"phase": "Pending"}
    return claim


def test_pods_that_may_share_one_node_need_no_many_mode() -> None:
    one_node = job()
    assert spread(one_node) == ""
    assert claim_needs(one_node) == [
        ClaimNeed("rljob-assets", "ReadWriteOnce", "every pod of the job may share one node"),
        ClaimNeed("rljob-runs", "ReadWriteOnce", "every pod of the job may share one node"),
    ]


@pytest.mark.parametrize(
    ("pools", "why"),
    [
        ({"rollout": {"replicas": 2}}, "pool rollout has 2 replicas"),
        ({"trainer": {"nodes": 3}}, "pool trainer has 3 nodes"),
        ({"reward": {"replicas": {"min": 1, "max": 4}}}, "pool reward has 4 replicas at most"),
        (
            {"rollout": {"nodeSelector": {"pool": "a"}}, "trainer": {"nodeSelector": {"pool": "b"}}},
            "pools rollout and trainer select different nodes (pool: a / b)",
        ),
    ],
)
def test_pods_on_several_nodes_need_read_only_many_for_model_and_data_and_read_write_many_for_checkpoints(
    pools: dict[str, dict[str, Any]], why: str
) -> None:
    needs = claim_needs(job(**pools))
    assert needs == [ClaimNeed("rljob-assets", "ReadOnlyMany", why), ClaimNeed("rljob-runs", "ReadWriteMany", why)]


def test_selectors_that_may_meet_on_one_node_do_not_spread() -> None:
    # different keys, or the same key and value: a node may carry both
    assert spread(job(rollout={"nodeSelector": {"gpu": "h100"}}, trainer={"nodeSelector": {"zone": "a"}})) == ""
    assert spread(job(rollout={"nodeSelector": {"gpu": "h100"}}, trainer={"nodeSelector": {"gpu": "h100"}})) == ""


def test_a_claim_mounted_writable_anywhere_needs_read_write_many() -> None:
    doc = cluster_doc()
    doc["spec"]["rollout"]["replicas"] = 2
    doc["spec"]["checkpoint"]["volume"] = {"claimName": "rljob-assets", "mountPath": "/mnt/runs"}  # one claim
    (need,) = claim_needs(parse_rljob(doc))
    assert (need.claim, need.mode) == ("rljob-assets", "ReadWriteMany")


@pytest.mark.parametrize(
    ("mode", "claim", "problem"),
    [
        ("ReadOnlyMany", pvc("ReadOnlyMany"), None),
        ("ReadOnlyMany", pvc("ReadWriteMany"), None),
        ("ReadOnlyMany", pvc("ReadWriteOnce"), "ClaimAccessMode"),
        ("ReadWriteMany", pvc("ReadWriteOnce", "ReadOnlyMany"), "ClaimAccessMode"),
        ("ReadWriteMany", pvc("ReadWriteMany"), None),
        ("ReadWriteMany", pvc("ReadWriteMany", bound=False), None),  # pending: the modes it asks for
        ("ReadWriteOnce", pvc("ReadWriteOnce"), None),
        ("ReadWriteOnce", pvc("ReadWriteOncePod"), "ClaimAccessMode"),  # one pod only; the job has several
        ("ReadWriteOnce", None, "ClaimNotFound"),
    ],
)
def test_claim_problem(mode: str, claim: dict[str, Any] | None, problem: str | None) -> None:
    found = claim_problem(ClaimNeed("runs", mode, "pool rollout has 2 replicas"), claim, "team")
    assert (found.reason if found else None) == problem


def test_the_message_names_the_claim_the_mode_it_needs_and_why() -> None:
    found = claim_problem(ClaimNeed("runs", "ReadWriteMany", "pool trainer has 2 nodes"), pvc("ReadWriteOnce"), "team")
    assert found == ClaimProblem(
        "ClaimAccessMode",
        "PersistentVolumeClaim team/runs has access modes ['ReadWriteOnce'] but needs ReadWriteMany: every pool "
        "pod and the driver mount it, and pool trainer has 2 nodes, so they may run on more than one node",
    )


def test_volumes_condition() -> None:
    one_node = job()
    assert volumes_condition(one_node, None)[:2] == ("Unknown", "NotChecked")
    assert volumes_condition(one_node, ())[:2] == ("True", "ClaimsUsable")
    problem = ClaimProblem("ClaimAccessMode", "PersistentVolumeClaim team/rljob-runs needs ReadWriteMany")
    assert volumes_condition(one_node, (problem,)) == ("False", "ClaimAccessMode", problem.message)
    doc = cluster_doc()
    for part in ("model", "data", "checkpoint"):
        doc["spec"][part].pop("volume")
    doc["spec"]["model"]["path"] = doc["spec"]["data"]["path"] = "/x"
    assert volumes_condition(parse_rljob(doc), None)[:2] == ("True", "NoClaims")


class Claims:
    """The Kube adapter's get over a table of claims, and the Events posted."""

    def __init__(self, claims: dict[str, dict[str, Any]]) -> None:
        self.claims = claims
        self.gets: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str, str]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append((kind, namespace, name))
        return self.claims.get(name)

    async def post_event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.events.append((kind, reason, message))


def test_the_operator_reads_the_claims_warns_once_and_says_so_in_status() -> None:
    spread_job = job(trainer={"nodes": 2})
    body = {"apiVersion": "rljob.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "arithmetic", "uid": "u"}}
    kube = Claims({"rljob-assets": pvc("ReadOnlyMany"), "rljob-runs": pvc("ReadWriteOnce")})
    ctx = Context(config=OperatorConfig(), kube=cast(Any, kube), control=cast(Any, None), metrics=OperatorMetrics())

    async def check() -> None:
        await check_claims_of(ctx, spread_job, body)

    asyncio.run(check())
    assert kube.gets == [
        ("PersistentVolumeClaim", "team", "rljob-assets"),
        ("PersistentVolumeClaim", "team", "rljob-runs"),
    ]
    ((kind, reason, message),) = kube.events
    assert (kind, reason) == ("Warning", "ClaimAccessMode")
    assert "team/rljob-runs" in message and "needs ReadWriteMany" in message and "trainer has 2 nodes" in message
    status = compute_status(
        spread_job, observe(None, (), None), None, now=NOW, claim_problems=ctx.claims[("team", "arithmetic")]
    )
    (volumes,) = [c for c in status.conditions if c.type == "VolumesReady"]
    assert (volumes.status, volumes.reason, volumes.message) == ("False", "ClaimAccessMode", message)

    asyncio.run(check())  # the same problem again: no second Event
    assert len(kube.events) == 1
    kube.claims["rljob-runs"] = pvc("ReadWriteMany")  # the claim re-made with the mode it needs
    asyncio.run(check())
    assert ctx.claims[("team", "arithmetic")] == () and len(kube.events) == 1
