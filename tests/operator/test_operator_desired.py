"""The operator's own decisions about a job's pools (desired.py): the reward group's size, the run's end."""

from __future__ import annotations

from pathlib import Path

import yaml

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import RLJob, parse_rljob
from rljob_api.workercfg import Pool
from rljob_operator.options import ElasticGroup, ElasticGroups
from rljob_operator.status.desired import Desired, next_desired, read_back
from rljob_operator.status.observe import DriverInfo, Observed, PodInfo

REPO = Path(__file__).resolve().parents[2]
RUNNING = DriverInfo(pod=PodInfo("driver", phase="Running", ready=True))
DONE = DriverInfo(complete=True)
REWARD_PODS: dict[Pool, tuple[PodInfo, ...]] = {
    "reward": tuple(PodInfo(f"r-{i}", phase="Running", ready=True) for i in range(3))
}


def job(suspend: bool = False) -> RLJob:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["reward"]["replicas"] = {"min": 1, "max": 4}
    doc["spec"]["suspend"] = suspend
    return parse_rljob(doc)


def wants(desired: int, drained: tuple[str, ...] = ()) -> control_pb.JobStatus:
    reward = control_pb.PoolStatus(desired=desired, drained=list(drained))
    return control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, reward=reward)


def live(driver: DriverInfo | None = RUNNING) -> Observed:
    return Observed(ray_cluster=True, groups=ElasticGroups(ElasticGroup(1)), pods=REWARD_PODS, driver=driver)


def test_read_back_takes_what_the_children_hold() -> None:
    observed = Observed(ray_cluster=True, groups=ElasticGroups(ElasticGroup(3, ("r-1",))), driver=DONE)
    assert read_back(observed) == Desired(ElasticGroups(ElasticGroup(3, ("r-1",))), finished=True)
    assert read_back(Observed()) == Desired()


def test_the_reward_group_follows_the_controller() -> None:
    assert next_desired(job(), Desired(ElasticGroups(ElasticGroup(1))), live(), wants(3)) == Desired(
        ElasticGroups(ElasticGroup(3))
    )
    scaled_down = next_desired(job(), Desired(ElasticGroups(ElasticGroup(3))), live(), wants(2, drained=("r-2",)))
    assert scaled_down == Desired(ElasticGroups(ElasticGroup(2, ("r-2",))))


def test_without_a_fresh_decision_or_a_ray_cluster_the_size_stays() -> None:
    assert next_desired(job(), Desired(ElasticGroups(ElasticGroup(3))), live()) == Desired(
        ElasticGroups(ElasticGroup(3))
    )
    no_cluster = Observed(driver=RUNNING)
    assert next_desired(job(), Desired(ElasticGroups(ElasticGroup(3))), no_cluster, wants(1)) == Desired(
        ElasticGroups(ElasticGroup(3))
    )


def test_a_finished_run_wants_no_pools_even_once_its_driver_job_is_gone() -> None:
    ended = next_desired(job(), Desired(ElasticGroups(ElasticGroup(3))), live(DONE), wants(4))
    assert ended == Desired(finished=True)
    assert next_desired(job(), ended, Observed()) == Desired(finished=True)
    assert next_desired(job(), Desired(), Observed()) == Desired()  # no driver Job yet: a new run


def test_suspend_clears_the_decisions() -> None:
    assert next_desired(job(suspend=True), Desired(ElasticGroups(ElasticGroup(3))), live(), wants(4)) == Desired()
    assert next_desired(job(suspend=True), Desired(finished=True), live(DONE)) == Desired()


def test_the_environment_group_follows_its_own_decision_and_drains() -> None:
    """A `kind: python` environment's group is sized from the controller's `environment` decision, apart
    from the reward group; a scale-down removes only the environment pods the controller drained."""
    doc = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    calculator = parse_rljob(doc)
    pods: dict[Pool, tuple[PodInfo, ...]] = {
        "environment": tuple(PodInfo(f"e-{i}", phase="Running", ready=True) for i in range(4))
    }
    observed = Observed(ray_cluster=True, pods=pods, driver=RUNNING)
    grow = control_pb.JobStatus(phase=control_pb.RUN_PHASE_RUNNING, environment=control_pb.PoolStatus(desired=4))
    grown = next_desired(calculator, Desired(), observed, grow)
    assert grown.groups == ElasticGroups(environment=ElasticGroup(4))
    shrink = control_pb.PoolStatus(desired=2, drained=["e-3", "e-1", "not-a-pod"])
    shrunk = next_desired(calculator, grown, observed, control_pb.JobStatus(environment=shrink))
    assert shrunk.groups.environment == ElasticGroup(2, ("e-1", "e-3"))
    too_many = control_pb.JobStatus(environment=control_pb.PoolStatus(desired=9))
    assert next_desired(calculator, shrunk, observed, too_many).groups.environment.replicas == 4  # its max
