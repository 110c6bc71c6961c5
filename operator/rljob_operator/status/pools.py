"""The pools' replica counts as the status shows them: how many each should have, how many serve. Pure."""

from __future__ import annotations

from rljob_api import PoolReplicas, PoolsStatus, RLJob
from rljob_api.workercfg import Pool, cluster_pools
from rljob_operator.render.group_sizing import clamp_replicas
from rljob_operator.status.observe import Observed

GPU_SHORTAGE = "Insufficient nvidia.com/gpu"


def desired_replicas(job: RLJob, observed: Observed, pool: Pool, *, live: bool) -> int:
    """Pods a pool should have: none while suspended or finished, or for a pool the job does not run; an
    elastic group as last scaled."""
    if not live or pool not in cluster_pools(job.spec):
        return 0
    if pool == "rollout":
        return job.spec.rollout.replicas
    if pool == "trainer":
        return job.spec.trainer.nodes
    return clamp_replicas(job, pool, observed.groups.of(pool).replicas)


def pool_counts(job: RLJob, observed: Observed, *, live: bool) -> PoolsStatus:
    counts = {
        pool: PoolReplicas(
            desired=desired_replicas(job, observed, pool, live=live),
            ready=sum(1 for p in observed.pool_pods(pool) if p.serving),
        )
        for pool in cluster_pools(job.spec)
    }
    return PoolsStatus(**counts)


def is_ready(counts: PoolReplicas | None) -> bool:
    return counts is not None and counts.ready >= counts.desired


def counts_text(counts: PoolReplicas | None) -> str:
    return f"{counts.ready}/{counts.desired}" if counts is not None else "-"


def unschedulable(observed: Observed, pool: Pool) -> list[str]:
    return [p.unschedulable for p in observed.pool_pods(pool) if p.unschedulable and not p.deleting]
