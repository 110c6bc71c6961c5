"""Whether the job's PersistentVolumeClaims can be mounted where its pods run: the access modes each claim
needs, checked against the claims as the API server has them (read by kube/claims.py), and the VolumesReady
condition. Pure.

Every pool pod and the driver mount every claim of the job (pods.volumes). Kubernetes attaches a
ReadWriteOnce claim to one node (its pods there share it), a ReadWriteOncePod claim to one pod. So once
the pods may run on more than one node, a read-only claim (model, data) needs ReadOnlyMany or
ReadWriteMany, and a written one (checkpoints: trainer rank 0 writes them, the driver reads them and writes
the run's metrics beside them) ReadWriteMany. A claim that lacks its mode leaves pods stuck in
ContainerCreating with a Multi-Attach error on some node; the VolumesReady condition says why up front.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rljob_api import RLJob
from rljob_operator.render.pods import claims

ONE_NODE = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany")  # modes that serve several pods on one node
SERVES: dict[str, tuple[str, ...]] = {
    "ReadOnlyMany": ("ReadOnlyMany", "ReadWriteMany"),
    "ReadWriteMany": ("ReadWriteMany",),
}


@dataclass(frozen=True)
class ClaimNeed:
    """A claim of the job and the access mode its pods need (ReadOnlyMany, ReadWriteMany, or ReadWriteOnce
    while they all run on one node)."""

    claim: str
    mode: str
    why: str


def spread(job: RLJob) -> str:
    """Why the job's pods may run on more than one node, or "" when the spec lets them share one."""
    spec = job.spec
    sizes = {
        "rollout": (spec.rollout.replicas, "replicas"),
        "trainer": (spec.trainer.nodes, "nodes"),
        "reward": (spec.reward.replicas.max, "replicas at most"),
    }
    for pool, (count, what) in sizes.items():
        if count > 1:
            return f"pool {pool} has {count} {what}"
    selectors = {"rollout": spec.rollout, "trainer": spec.trainer, "reward": spec.reward}
    for (a, left), (b, right) in itertools.combinations(selectors.items(), 2):
        for key, value in left.node_selector.items():
            other = right.node_selector.get(key)
            if other is not None and other != value:
                # a node has one value per label: the two pools never share a node
                return f"pools {a} and {b} select different nodes ({key}: {value} / {other})"
    return ""


def claim_needs(job: RLJob) -> list[ClaimNeed]:
    """Each claim of the job once, with the access mode its pods need."""
    why = spread(job)
    writable: dict[str, bool] = {}
    for source in claims(job):
        writable[source.claim_name] = writable.get(source.claim_name, False) or not source.read_only
    if not why:
        return [ClaimNeed(c, "ReadWriteOnce", "every pod of the job may share one node") for c in writable]
    return [ClaimNeed(c, "ReadWriteMany" if w else "ReadOnlyMany", why) for c, w in writable.items()]


@dataclass(frozen=True)
class ClaimProblem:
    reason: str  # ClaimNotFound or ClaimAccessMode
    message: str


def claim_problem(need: ClaimNeed, claim: Mapping[str, Any] | None, namespace: str) -> ClaimProblem | None:
    """What keeps the job's pods from mounting the claim, or None. The modes of a bound claim are its
    volume's (status), else the ones it asks for (spec)."""
    name = f"PersistentVolumeClaim {namespace}/{need.claim}"
    if claim is None:
        return ClaimProblem("ClaimNotFound", f"{name} does not exist; the pods that mount it stay Pending")
    bound = (claim.get("status") or {}).get("phase") == "Bound"
    modes = list(((claim.get("status") if bound else claim.get("spec")) or {}).get("accessModes") or [])
    if any(m in (ONE_NODE if need.mode == "ReadWriteOnce" else SERVES[need.mode]) for m in modes):
        return None
    return ClaimProblem(
        "ClaimAccessMode",
        f"{name} has access modes {modes} but needs {need.mode}: every pool pod and the driver mount it, and "
        f"{need.why}, so they may run on more than one node",
    )


def volumes_condition(job: RLJob, problems: Sequence[ClaimProblem] | None) -> tuple[str, str, str]:
    """The VolumesReady condition: (status, reason, message). `problems` None: not checked yet."""
    if not claims(job):
        return "True", "NoClaims", "the job mounts no PersistentVolumeClaim"
    if problems is None:
        return "Unknown", "NotChecked", "the claims' access modes are not checked yet"
    if problems:
        return "False", problems[0].reason, "; ".join(p.message for p in problems)
    names = ", ".join(n.claim for n in claim_needs(job))
    return "True", "ClaimsUsable", f"claims {names} exist with the access modes the pods need"
