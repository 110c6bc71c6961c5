"""What every handler shares (the `Context`, made at startup), and an RLJob body read into the model."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, RLJobInvalid, RLJobStatus, parse_rljob
from rljob_api.colocate_fit import refuse_on_a_cluster
from rljob_api.workercfg import WorkerConfigs
from rljob_operator.config import OperatorConfig
from rljob_operator.kube.children import Children
from rljob_operator.kube.client import Kube
from rljob_operator.kube.control import ControlClients
from rljob_operator.names import control_service_name
from rljob_operator.options import Owner
from rljob_operator.reconcile.metrics import OperatorMetrics
from rljob_operator.status.desired import Desired
from rljob_operator.status.volumes import ClaimProblem

Key = tuple[str, str]


def plain(value: Any) -> Any:
    """kopf's body views as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def parse_job(body: Mapping[str, Any]) -> RLJob:
    """The RLJob model of a body (spec and the metadata workers read); RLJobInvalid names each field."""
    meta = body.get("metadata") or {}
    document = {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace") or "default",
            "labels": plain(meta.get("labels") or {}),
        },
        "spec": plain(body.get("spec") or {}),
    }
    source = f"{meta.get('namespace')}/{meta.get('name')}"
    job = parse_rljob(document, source)
    refuse_on_a_cluster(job, source)  # one machine's GPUs shared by two pools: `rljob run`'s, not the operator's
    return job


def stored_status(body: Mapping[str, Any]) -> RLJobStatus | None:
    try:
        return RLJobStatus.model_validate(plain(body.get("status") or {}))
    except ValidationError:
        return None


def owner_of(body: Mapping[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], uid=meta["uid"])


@dataclass
class Context:
    """What every handler shares; made at startup, kept in kopf's memo."""

    config: OperatorConfig
    kube: Kube
    control: ControlClients
    metrics: OperatorMetrics
    children: Children | None = None  # kopf's indexes of RayClusters, Jobs, pods (kube/children.py); None: read the API
    jobs: dict[Key, dict[str, Any]] = field(default_factory=dict)  # newest body of each RLJob, from the watch
    last: dict[Key, RLJobStatus] = field(default_factory=dict)  # the status last written
    snapshots: dict[Key, control_pb.JobStatus | None] = field(default_factory=dict)  # the controller's, last poll
    desired: dict[Key, Desired] = field(default_factory=dict)  # what the pools are rendered from (status/desired.py)
    pools: dict[Key, dict[str, dict[str, Any] | None]] = field(default_factory=dict)  # as last written; None: deleted
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    tokens: dict[Key, str] = field(default_factory=dict)  # each job's token (its Secret), once read or made
    claims: dict[Key, tuple[ClaimProblem, ...]] = field(default_factory=dict)  # the last check of its claims
    taken: dict[Key, str] = field(default_factory=dict)  # a child's name someone else holds (kube/ownership.py)
    rbac_checked: set[Key] = field(default_factory=set)  # jobs whose legacy Role/RoleBinding were looked for
    token_checked: set[Key] = field(default_factory=set)  # jobs whose token Secret was made or found whole
    poked: set[Key] = field(default_factory=set)  # jobs whose children changed since the last refresh
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def poke(self, key: Key) -> None:
        """A child of `key` changed: refresh it soon (called on the event loop)."""
        self.poked.add(key)
        self.wake.set()

    def control_address(self, job: RLJob, configs: WorkerConfigs) -> str:
        return self.config.control_address.format(
            service=control_service_name(job),
            namespace=job.metadata.namespace,
            job=job.metadata.name,
            port=configs.ports.control,
        )

    def drop(self, key: Key) -> None:
        """Forget what was kept of a job's state (its status, snapshot, decisions, pools as written)."""
        for table in (self.last, self.snapshots, self.desired, self.pools, self.tokens, self.claims, self.taken):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.rbac_checked.discard(key)
        self.token_checked.discard(key)

    async def forget(self, key: Key) -> None:
        self.drop(key)
        for table in (self.jobs, self.locks):
            table.pop(key, None)  # type: ignore[attr-defined]
        self.metrics.forget(key)
        await self.control.forget(key)


def key_of(job: RLJob) -> Key:
    return (job.metadata.namespace, job.metadata.name)


def invalid_message(exc: RLJobInvalid) -> str:
    return "; ".join(str(e) for e in exc.errors)
