"""What an RLJob's pools should be beyond its spec: the operator's own two decisions. Pure.

The spec says what to run. The operator decides the elastic groups' sizes (the controller's elastic
decisions for the reward and environment pools, within the spec's bounds: render/group_sizing.py) and whether
the run has ended (its driver Job is Complete or Failed: the pools are released, the driver Job kept).
`Desired` holds both decisions; it is the one source the RayCluster is rendered from
(`writer.write_children`, its only writer), so a scale decision and a release are changes of
`Desired`, never writes of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob
from rljob_api.workercfg import ELASTIC_POOLS, cluster_pools
from rljob_operator.options import ElasticGroups
from rljob_operator.render.group_sizing import decide_group, elastic_bounds
from rljob_operator.status.observe import Observed


@dataclass(frozen=True)
class Desired:
    """The elastic groups as last decided (replicas None: the spec's min), and whether the run has ended."""

    groups: ElasticGroups = field(default_factory=ElasticGroups)
    finished: bool = False


def read_back(observed: Observed) -> Desired:
    """The decisions a job's children hold, for a job this process has decided nothing for yet (new, or
    the operator restarted): the RayCluster's elastic groups are the sizes last applied."""
    driver = observed.driver
    return Desired(observed.groups, finished=driver is not None and driver.finished)


def next_desired(
    job: RLJob, current: Desired, observed: Observed, snapshot: control_pb.JobStatus | None = None
) -> Desired:
    """The decisions after looking at the children and, when `snapshot` is given, the controller's
    fresh decision (None: nothing new from the controller, the groups keep their sizes).

    Suspended: none; a resume starts the pools afresh, each elastic group at its min. The driver Job
    finished: no pools, and a driver Job gone afterwards does not bring them back. Otherwise each elastic
    group follows the controller once the RayCluster exists, removing only drained pods.
    """
    if job.spec.suspend:
        return Desired()
    driver = observed.driver
    finished = driver.finished if driver is not None else current.finished
    if finished:
        return Desired(finished=True)
    if snapshot is None or not observed.ray_cluster:
        return Desired(current.groups)
    groups = current.groups
    for pool in ELASTIC_POOLS:
        if pool not in cluster_pools(job.spec):
            continue
        pods = {p.name for p in observed.pool_pods(pool) if not p.deleting}
        decision = getattr(snapshot, pool)
        decided = decide_group(
            elastic_bounds(job, pool), groups.of(pool), decision.desired, list(decision.drained), pods
        )
        groups = groups.with_group(pool, decided)
    return Desired(groups)
