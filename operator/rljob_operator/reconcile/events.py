"""Events on an RLJob: one per phase change, per new Degraded reason and per replacement, posted best effort."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJobStatus
from rljob_operator.kube.client import describe
from rljob_operator.reconcile.context import Context
from rljob_operator.status.observe import DriverInfo
from rljob_operator.status.restarts import restart_events

log = logging.getLogger(__name__)


async def announce(
    ctx: Context,
    body: Mapping[str, Any],
    before: RLJobStatus | None,
    after: RLJobStatus,
    snapshot: control_pb.JobStatus | None = None,
    driver: DriverInfo | None = None,
) -> None:
    """An Event per phase change, per Degraded condition that turned True or changed its reason, and
    per replacement of a replica, a trainer group or a driver pod."""
    if before is None or before.phase != after.phase:
        kind = "Warning" if after.phase == "Failed" else "Normal"
        await post(ctx, body, kind, after.phase or "Pending", after.message or "")
    old = {c.type: c for c in (before.conditions if before else [])}.get("Degraded")
    new = next((c for c in after.conditions if c.type == "Degraded"), None)
    told_below = new is not None and new.reason == "DriverRestarted"  # one Event per failed driver pod, below
    changed = new is not None and (old is None or (old.status, old.reason) != ("True", new.reason))
    if new is not None and new.status == "True" and changed and not told_below:
        await post(ctx, body, "Warning", new.reason, new.message)
    for reason, message in restart_events(before.restarts if before else None, snapshot, driver):
        await post(ctx, body, "Warning", reason, message)


async def post(ctx: Context, body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the RLJob; a failure to post is logged, never raised."""
    meta = body.get("metadata") or {}
    ref = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
    }
    try:
        await ctx.kube.post_event(ref, kind, reason, message)
    except Exception as exc:  # an Event is best effort
        log.warning("posting event %s on %s/%s: %s", reason, meta.get("namespace"), meta.get("name"), describe(exc))
