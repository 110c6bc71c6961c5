"""Sizing the elastic worker groups (reward, environment) from the controller's decision. Pure.

The controller runs the elastic policy (backlog, arrival rate, latency, cooldown) and reports the
replicas it wants and the replicas it has drained (no new work, in-flight finished). The operator
only applies that decision to the RayCluster's group of the pool, within the spec's min..max, and never
removes a replica the controller has not drained: a scale-down lists exactly the drained pods in
KubeRay's `scaleStrategy.workersToDelete` and lowers `replicas` by as many, so KubeRay deletes those
pods and no random one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from rljob_api import ReplicaRange, RLJob
from rljob_api.workercfg import Pool
from rljob_operator.options import ElasticGroup


def elastic_bounds(job: RLJob, pool: Pool) -> ReplicaRange:
    """The spec's min..max of an elastic pool (reward or environment)."""
    environment = job.spec.environment
    if pool == "environment" and environment is not None:
        return environment.replicas
    return job.spec.reward.replicas


def clamp_replicas(job: RLJob, pool: Pool, replicas: int | None) -> int:
    """An elastic group's size: the scaling policy's (the spec's min when there is none yet), within min..max."""
    bounds = elastic_bounds(job, pool)
    wanted = bounds.min if replicas is None else replicas
    return max(bounds.min, min(bounds.max, wanted))


def decide_group(
    bounds: ReplicaRange,
    current: ElasticGroup,
    desired: int | None,
    drained: Sequence[str],
    pods: Collection[str],
) -> ElasticGroup:
    """An elastic group's next replicas and workersToDelete.

    bounds:  the spec's replicas min..max of the pool.
    current: the group as the RayCluster holds it (replicas None before it exists: start at min), with
             the workersToDelete KubeRay may not have acted on yet.
    desired: the controller's desired count (None or 0 when it has not decided: keep the current size).
    drained: names of replicas the controller drained, which are pod names on a cluster.
    pods:    the group's pods that exist and are not being deleted.
    """
    # Names still waiting for KubeRay stay listed (else it would delete random pods to match replicas);
    # names whose pods are gone are dropped.
    pending = tuple(name for name in current.workers_to_delete if name in pods)
    now = bounds.min if current.replicas is None else current.replicas
    now = max(bounds.min, min(bounds.max, now))  # the spec's bounds changed: follow them
    if not desired:
        return ElasticGroup(replicas=now, workers_to_delete=pending)
    target = max(bounds.min, min(bounds.max, desired))
    if target >= now:
        return ElasticGroup(replicas=target, workers_to_delete=pending)
    removable = sorted({name for name in drained if name in pods} - set(pending))
    remove = tuple(removable[: now - target])
    return ElasticGroup(replicas=now - len(remove), workers_to_delete=pending + remove)
