"""The children an RLJob owns (RayClusters, driver Jobs, pods), kept in memory by kopf: its watches (with
their reconnects and back-off) feed an index per kind (`@kopf.index`, objects labelled `rljob.io/job`), and
each index function asks for the owning job's refresh as soon as one of them changes.

A status refresh then reads memory, not the API server: with many RLJobs, polling each job's children every
interval would cost three requests per job per interval. kopf calls no other handler before every index is
filled from its first listing, so a job is never refreshed from a half-read cache. The label filter is
kopf's, applied to what the watch of each kind brings (kopf does not pass label selectors to the API
server): in a namespace with many pods not of an RLJob, the operator reads their events and drops them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from rljob_operator.names import LABEL_JOB

Key = tuple[str, str]  # (namespace, job name)
OF_A_JOB = {LABEL_JOB: kopf.PRESENT}
# kopf hands each index to every handler as the keyword argument of its id
INDEXES = ("rljob_ray_clusters", "rljob_driver_jobs", "rljob_pods")


class ByName:
    """An index of one kind by (namespace, name): each key holds the one object of that name."""

    def __init__(self, index: kopf.Index[Key, dict[str, Any]]) -> None:
        self.index = index

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(iter(self.index.get((namespace, name), ())), None)


class ByJob:
    """An index of one kind by (namespace, job): each key holds the objects that job owns."""

    def __init__(self, index: kopf.Index[Key, dict[str, Any]]) -> None:
        self.index = index

    def of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return list(self.index.get((namespace, job), ()))


class Children:
    """The three indexes a status refresh reads, as kopf hands them to the handlers."""

    def __init__(
        self,
        ray_clusters: kopf.Index[Key, dict[str, Any]],
        jobs: kopf.Index[Key, dict[str, Any]],
        pods: kopf.Index[Key, dict[str, Any]],
    ) -> None:
        self.ray_clusters, self.jobs, self.pods = ByName(ray_clusters), ByName(jobs), ByJob(pods)

    @classmethod
    def of_handler(cls, kwargs: Mapping[str, Any]) -> Children:
        """The indexes from a handler's keyword arguments (kopf names each after its function)."""
        return cls(*(kwargs[name] for name in INDEXES))


def _poke(memo: kopf.Memo, namespace: str | None, job: str) -> None:
    ctx = memo.get("rljob")
    if ctx is not None:
        ctx.poke((namespace or "", job))


# The index functions are coroutines: kopf runs a plain function in a thread pool, a hop per event that
# costs more CPU than everything else the operator does with a child's event. Each one also asks for
# the owning job's refresh (a burst of changes becomes one refresh: process/handlers.py), so an event costs one
# handler call; only a deletion, which kopf indexes without calling them, needs a handler of its own.
@kopf.index("ray.io", "v1", "rayclusters", labels=OF_A_JOB, id=INDEXES[0])
@kopf.index("batch", "v1", "jobs", labels=OF_A_JOB, id=INDEXES[1])
async def index_by_name(
    namespace: str | None, name: str | None, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> dict[Key, Any]:
    _poke(memo, namespace, labels[LABEL_JOB])
    return {(namespace or "", name or ""): dict(body)}


@kopf.index("v1", "pods", labels=OF_A_JOB, id=INDEXES[2])
async def index_pod(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> dict[Key, Any]:
    _poke(memo, namespace, labels[LABEL_JOB])
    return {(namespace or "", labels[LABEL_JOB]): dict(body)}


def _deleted(type: str | None, **_: Any) -> bool:  # kopf names it `type`
    return type == "DELETED"


@kopf.on.event("ray.io", "v1", "rayclusters", labels=OF_A_JOB, when=_deleted)
@kopf.on.event("batch", "v1", "jobs", labels=OF_A_JOB, when=_deleted)
@kopf.on.event("v1", "pods", labels=OF_A_JOB, when=_deleted)
async def child_deleted(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    """Refresh the job whose child is gone, soon."""
    _poke(memo, namespace, labels[LABEL_JOB])
