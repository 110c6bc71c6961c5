"""Children are the job's or are left alone: an object of a child's name that does not carry the job's
ownerReference (its uid) is never modified, adopted or deleted.

Server-side apply with force would otherwise take over any object of the name (another application's
ConfigMap `<job>-config`, say) and add the job's ownerReference, so deleting the RLJob would garbage-collect
it. Before the first child is written, `taken_names` reads each; the writer writes none while one is taken.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from rljob_operator.kube.client import Kube


class NameTaken(RuntimeError):
    """An object of a child's name exists and is not this job's; the message names it."""


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid for ref in refs)


def describe_taken(kind: str, namespace: str, name: str, obj: Mapping[str, Any]) -> str:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    owner = ", ".join(f"{r.get('kind')} {r.get('name')}" for r in refs) or "no owner"
    return f"{kind} {namespace}/{name} exists and is not this RLJob's ({owner}); it is left alone"


async def taken_names(kube: Kube, docs: Iterable[Mapping[str, Any]], uid: str) -> list[str]:
    """Each child of `docs` whose name an object of someone else holds, described; [] when all are free or ours."""
    wanted = [(d["kind"], d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs]
    found = await asyncio.gather(*(kube.get(kind, ns, name) for kind, ns, name in wanted))
    return [
        describe_taken(kind, ns, name, obj)
        for (kind, ns, name), obj in zip(wanted, found, strict=True)
        if obj is not None and not owned_by(obj, uid)
    ]


async def delete_if_owned(kube: Kube, kind: str, namespace: str, name: str, uid: str) -> bool:
    """Delete the object if it is the job's (checked on its own uid too: not one made since under the name);
    False when there is none, or it is someone else's."""
    obj = await kube.get(kind, namespace, name)
    if obj is None or not owned_by(obj, uid):
        return False
    return await kube.delete(kind, namespace, name, uid=obj["metadata"].get("uid"))


LEGACY_RBAC = ("RoleBinding", "Role")  # made per service account before the driver's rights were dropped


async def remove_legacy_rbac(kube: Kube, namespace: str, account: str, uid: str) -> list[str]:
    """Delete the Role and RoleBinding an older operator made for the job (named after its service account),
    only where they are this job's; the kinds deleted."""
    deleted = []
    for kind in LEGACY_RBAC:
        if await delete_if_owned(kube, kind, namespace, account, uid):
            deleted.append(kind)
    return deleted
