"""What an RLJob's pools should be beyond its spec: the operator's own two decisions. Pure.

The spec says what to run. The operator decides the reward group's size (the controller's elastic
decision, within the spec's bounds: group_sizing.py) and whether the run has ended (its driver Job is
Complete or Failed: the pools are released, the driver Job kept). `Desired` holds both decisions;
it is the one source the RayCluster is rendered from (`writer.write_children`, its only
writer), so a scale decision and a release are changes of `Desired`, never writes of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob

from .group_sizing import decide_reward_group
from .observe import Observed
from .options import RewardGroup


@dataclass(frozen=True)
class Desired:
    """The reward group as last decided (replicas None: the spec's min), and whether the run has ended."""

    reward: RewardGroup = field(default_factory=RewardGroup)
    finished: bool = False


def read_back(observed: Observed) -> Desired:
    """The decisions a job's children hold, for a job this process has decided nothing for yet (new, or
    the operator restarted): the RayCluster's reward group is the size last applied."""
    driver = observed.driver
    reward = RewardGroup(observed.reward_replicas, observed.reward_workers_to_delete)
    return Desired(reward, finished=driver is not None and driver.finished)


def next_desired(
    job: RLJob, current: Desired, observed: Observed, snapshot: control_pb.JobStatus | None = None
) -> Desired:
    """The decisions after looking at the children and, when `snapshot` is given, the controller's
    fresh decision (None: nothing new from the controller, the reward group keeps its size).

    Suspended: none; a resume starts the pools afresh, the reward group at its min. The driver Job
    finished: no pools, and a driver Job gone afterwards does not bring them back. Otherwise the
    reward group follows the controller once the RayCluster exists, removing only drained pods.
    """
    if job.spec.suspend:
        return Desired()
    driver = observed.driver
    finished = driver.finished if driver is not None else current.finished
    if finished:
        return Desired(finished=True)
    if snapshot is None or not observed.ray_cluster:
        return Desired(current.reward)
    pods = {p.name for p in observed.pool_pods("reward") if not p.deleting}
    reward = snapshot.reward
    decided = decide_reward_group(job.spec.reward.replicas, current.reward, reward.desired, list(reward.drained), pods)
    return Desired(decided)
