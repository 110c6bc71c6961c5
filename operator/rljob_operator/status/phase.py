"""An RLJob's phase, from its spec, its children and the controller's report. Pure."""

from __future__ import annotations

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import PoolsStatus, RLJob
from rljob_api.status import Phase
from rljob_api.workercfg import cluster_pools
from rljob_operator.status.observe import Observed
from rljob_operator.status.pools import is_ready

TERMINAL: tuple[Phase, ...] = ("Succeeded", "Failed")


def phase_of(job: RLJob, observed: Observed, pools: PoolsStatus, snapshot: control_pb.JobStatus | None) -> Phase:
    driver = observed.driver
    run = snapshot.phase if snapshot is not None else control_pb.RUN_PHASE_UNSPECIFIED
    if job.spec.suspend:
        return "Suspended"
    if (driver is not None and driver.failed) or run == control_pb.RUN_PHASE_FAILED:
        return "Failed"
    if (driver is not None and driver.succeeded) or run == control_pb.RUN_PHASE_SUCCEEDED:
        return "Succeeded"
    if not observed.ray_cluster and driver is None:
        return "Pending"
    if run in (control_pb.RUN_PHASE_RUNNING, control_pb.RUN_PHASE_STOPPING):
        # The controller trains: its pools serve, whatever their pods' Ready conditions say yet
        # (KubeRay's probes lag the Ray workers by seconds; an elastic pool grows while it trains).
        return "Running"
    head_ready = observed.head is not None and observed.head.serving
    pools_ready = head_ready and all(is_ready(pools.of(p)) for p in cluster_pools(job.spec))
    driving = driver is not None and driver.running
    return "Running" if observed.ray_cluster and pools_ready and driving else "Provisioning"
