"""Every Kubernetes API right the operator uses, and why. The chart's RBAC grants exactly these
(tests/operator/test_operator_chart.py); the e2e suite's audit log shows the operator requests
nothing else and every verb listed as requested (tests/operator/test_operator_integration.py).

`requested` verbs appear as requests of their own. `fallback` ones are requested only on a path a run may not
take: the RayCluster and the driver Job read directly while the operator's watch cache has not synced yet
(at its start), the job's token Secret read by an operator process that did not create it (a restarted one,
once its poller or reconcile gets to the job). `implied` ones are checked by the API server on
the operator's behalf: a server-side apply that creates an object needs create as well as patch;
an ownerReference with blockOwnerDeletion needs update on the owner's finalizers.

Every child is read (get) before the first is written: one whose name someone else holds is left alone
(kube/ownership.py). The driver holds no rights at all (no Role), so the operator needs none to grant; it only
deletes, if they are the job's, the Role and RoleBinding an older operator made for the driver.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Right:
    group: str
    resource: str  # with its subresource: rljobs/status
    requested: tuple[str, ...]
    implied: tuple[str, ...]
    why: str
    fallback: tuple[str, ...] = ()

    @property
    def verbs(self) -> tuple[str, ...]:
        return self.requested + self.fallback + self.implied


# Namespaced: a ClusterRole in cluster mode, a Role in each watched namespace otherwise.
RIGHTS: tuple[Right, ...] = (
    Right("rljob.io", "rljobs", ("list", "watch", "patch"), (), "kopf watches RLJobs; its progress is in annotations"),
    Right("rljob.io", "rljobs/status", ("patch",), (), "the status the operator computes"),
    Right("rljob.io", "rljobs/finalizers", (), ("update",), "children's ownerReferences block the RLJob's deletion"),
    Right("", "events", ("create",), (), "Events on RLJobs (phase changes, scaling, kopf's own)"),
    Right(
        "",
        "secrets",
        ("create",),
        (),
        "the job's token: made once, read back by an operator that did not make it, and given Ray's key "
        "where an older operator made it without",
        ("get", "patch"),
    ),
    Right("", "configmaps", ("get", "patch"), ("create",), "the job's rljob.yaml"),
    Right("", "services", ("get", "patch"), ("create",), "the control, metrics and reward Services"),
    Right("", "serviceaccounts", ("get", "patch"), ("create",), "the driver's account (it holds no rights)"),
    Right("rbac.authorization.k8s.io", "roles", ("get",), (), "an older operator's driver Role", ("delete",)),
    Right("rbac.authorization.k8s.io", "rolebindings", ("get",), (), "its RoleBinding", ("delete",)),
    Right("networking.k8s.io", "networkpolicies", ("get", "patch"), ("create",), "ingress from the job's pods only"),
    Right("ray.io", "rayclusters", ("get", "list", "watch", "patch", "delete"), ("create",), "the pools"),
    Right("batch", "jobs", ("get", "list", "watch", "patch", "delete"), ("create",), "the driver"),
    Right("", "pods", ("list", "watch"), (), "pool pods (readiness, drained replicas)"),
    Right("", "persistentvolumeclaims", ("get",), (), "the access modes of the claims the job's pods mount"),
)
# Cluster-wide in both modes.
CLUSTER_RIGHTS: tuple[Right, ...] = (
    Right("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), (), "kopf notices the RLJob CRD"),
)


def verbs_by_resource(
    rights: tuple[Right, ...], *, requested_only: bool = False, with_fallback: bool = False
) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every right; `requested_only`: the requested verbs (and, `with_fallback`,
    the fallback ones)."""

    def chosen(right: Right) -> tuple[str, ...]:
        if not requested_only:
            return right.verbs
        return right.requested + right.fallback if with_fallback else right.requested

    return {(r.group, r.resource, verb) for r in rights for verb in chosen(r)}
