"""Children are the job's or are left alone (#53), against a real kube-apiserver: objects of a child's name
that are someone else's stay byte for byte as they were and are not adopted; the job says `NameTaken`
naming one. Two jobs sharing one service account reconcile side by side, and deleting one leaves the
other's children. The fixtures (control plane, the operator with the chart's RBAC) are e2e_fixtures.py's.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e_cluster import Cluster, OperatorProcess, skip_without_binaries, wait_for
from e2e_jobs import children, condition, rljob, status_where

pytestmark = [skip_without_binaries(), pytest.mark.cluster]
pytest_plugins = ["e2e_fixtures"]

ACCOUNT = "payments"


def _theirs(ns: str) -> list[dict[str, Any]]:
    """Another application's objects: named as the job `taken`'s ConfigMap, control Service and NetworkPolicy
    would be, and a Role and RoleBinding named as its service account."""
    labels = {"app": ACCOUNT}
    meta = lambda name: {"name": name, "namespace": ns, "labels": labels}  # noqa: E731
    role_rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("taken-config"), "data": {"db": "payments:5432"}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta("taken-control"),
            "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": 8443}]},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta("taken-pods"),
            "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"]},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(ACCOUNT)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(ACCOUNT), "rules": role_rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(ACCOUNT),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": ns}],
        },
    ]


def _as_stored(cluster: Cluster, doc: dict[str, Any], ns: str) -> dict[str, Any]:
    found = cluster.get(doc["kind"].lower(), doc["metadata"]["name"], ns)
    assert found is not None, doc["metadata"]["name"]
    return found


def test_objects_of_a_childs_name_are_left_alone_and_named(
    cluster: Cluster, operator: OperatorProcess, ns: str
) -> None:
    theirs = _theirs(ns)
    for doc in theirs:
        cluster.apply(doc)
    before = [_as_stored(cluster, doc, ns) for doc in theirs]
    cluster.apply(rljob("taken", ns, serviceAccountName=ACCOUNT))
    status = wait_for(
        "Degraded NameTaken",
        lambda: status_where(cluster, "taken", ns, lambda s: condition(s, "Degraded").get("reason") == "NameTaken"),
    )
    message = condition(status, "Degraded")["message"]
    print(f"Degraded: {message}")
    assert f"ConfigMap {ns}/taken-config exists and is not this RLJob's" in message
    assert "NameTaken" in [e["reason"] for e in cluster.events(ns, "taken")]
    time.sleep(20)  # past the handler's next try (NAME_TAKEN_RETRY_SECONDS)
    after = [_as_stored(cluster, doc, ns) for doc in theirs]
    for old, new in zip(before, after, strict=True):
        assert new == old, f"{old['kind']} {old['metadata']['name']} changed"
        assert "ownerReferences" not in new["metadata"]
    assert not any(children(cluster, "taken", ns).values()), "a child was written while a name was taken"
    # The names are freed: the job's children are written, and the account's Role and RoleBinding stay theirs.
    for doc in theirs[:3]:
        cluster.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "-n", ns)
    wait_for("the RayCluster", lambda: cluster.get("raycluster", "taken-ray", ns), timeout=90)
    wait_for(
        "NameTaken cleared",
        lambda: status_where(cluster, "taken", ns, lambda s: condition(s, "Degraded").get("reason") != "NameTaken"),
    )
    assert [_as_stored(cluster, doc, ns) for doc in theirs[3:]] == before[3:]


def test_two_jobs_sharing_an_account_keep_to_their_own(cluster: Cluster, operator: OperatorProcess, ns: str) -> None:
    cluster.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "shared", "namespace": ns}})
    for name in ("share-a", "share-b"):
        cluster.apply(rljob(name, ns, serviceAccountName="shared"))
    for name in ("share-a", "share-b"):
        wait_for(f"{name}'s RayCluster", lambda name=name: cluster.get("raycluster", f"{name}-ray", ns))
        wait_for(f"{name}'s driver Job", lambda name=name: cluster.get("job", f"{name}-driver", ns))
    kept = {kind: [o["metadata"]["uid"] for o in objs] for kind, objs in children(cluster, "share-b", ns).items()}
    assert kept["configmap"] and kept["service"] and kept["raycluster"] and kept["job"]
    cluster.kubectl("delete", "rljob", "share-a", "-n", ns, "--wait=true", "--timeout=60s")
    wait_for(
        "share-a's children collected",
        lambda: not any(children(cluster, "share-a", ns).values()),
        timeout=90,
    )
    after = {kind: [o["metadata"]["uid"] for o in objs] for kind, objs in children(cluster, "share-b", ns).items()}
    assert after == kept, "deleting one job touched the other's children"
    assert cluster.get("serviceaccount", "shared", ns) is not None
