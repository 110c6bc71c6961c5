"""An RLJob's replacements: counted once, told once, across polls, driver restarts and operator restarts."""

from __future__ import annotations

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import Restarts
from rljob_operator.status.observe import DriverInfo
from rljob_operator.status.restarts import count_restarts, restart_events


def snapshot(run_id: str, *pools: str) -> control_pb.JobStatus:
    status = control_pb.JobStatus(run_id=run_id)
    for i, pool in enumerate(pools):
        replica = "trainer group" if pool == "trainer" else f"{pool}-{i}"
        status.restarts.add(
            pool=pool, replica=replica, cause="its process died", replacement=f"{pool}-new", seconds=7.5, step=3 + i
        )
    return status


def test_each_replacement_is_counted_and_told_once_over_repeated_polls() -> None:
    first = snapshot("a", "rollout")
    after = count_restarts(None, first, None)
    assert (after.rollout, after.reward, after.trainer, after.seen) == (1, 0, 0, 1)
    told = "rollout replica rollout-0 lost at step 3 (its process died); replaced by rollout-new in 7.5s"
    assert restart_events(None, first, None) == [("ReplicaReplaced", told)]
    # The same snapshot again (the next poll, or the operator restarted and read status back): nothing new.
    assert count_restarts(after, first, None) == after
    assert restart_events(after, first, None) == []
    second = snapshot("a", "rollout", "reward", "trainer")
    later = count_restarts(after, second, None)
    assert (later.rollout, later.reward, later.trainer, later.seen) == (1, 1, 1, 3)
    reasons = [reason for reason, _ in restart_events(after, second, None)]
    assert reasons == ["ReplicaReplaced", "TrainerRestarted"]
    assert restart_events(after, second, None)[1][1].startswith("trainer group lost at step 5")


def test_a_new_driver_process_starts_its_list_again_and_its_pod_failure_is_told() -> None:
    before = count_restarts(None, snapshot("a", "rollout", "reward"), None)
    driver = DriverInfo(failed_attempts=1)
    fresh = snapshot("b", "reward")  # the new driver's own list: one entry, not the old two
    after = count_restarts(before, fresh, driver)
    assert (after.rollout, after.reward, after.driver, after.run_id, after.seen) == (1, 2, 1, "b", 1)
    events = restart_events(before, fresh, driver)
    assert [reason for reason, _ in events] == ["ReplicaReplaced", "DriverRestarted"]
    assert events[1][1].startswith("driver pod 1 failed; its Job starts another")


def test_no_snapshot_keeps_the_counts_and_a_failed_job_is_not_a_restart() -> None:
    before = Restarts(rollout=2, run_id="a", seen=2, driver=1)
    assert count_restarts(before, None, None) == before
    assert restart_events(before, None, None) == []
    done = DriverInfo(failed=True, failed_attempts=3)  # the third failure ended the Job: two were restarts
    assert count_restarts(before, None, done).driver == 2
    assert [r for r, _ in restart_events(before, None, done)] == ["DriverRestarted"]
