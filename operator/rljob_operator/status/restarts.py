"""Counting an RLJob's replacements and telling each one as an Event. Pure.

Two sources: the driver's status lists every replica and trainer group it replaced (a list per driver
process, told apart by its run_id), and the driver Job counts its failed pods. `status.restarts` keeps
the totals and how much of the current driver's list is counted, so that neither an operator restart
nor a repeated poll tells a replacement twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api import Restarts
from rljob_operator.status.observe import DriverInfo

REASONS = {
    "rollout": "ReplicaReplaced",
    "reward": "ReplicaReplaced",
    "environment": "ReplicaReplaced",
    "trainer": "TrainerRestarted",
}


def _new_entries(before: Restarts, snapshot: control_pb.JobStatus | None) -> Sequence[control_pb.Restart]:
    if snapshot is None or not snapshot.run_id:
        return ()
    counted = before.seen if snapshot.run_id == before.run_id else 0
    return snapshot.restarts[counted:]


def count_restarts(
    before: Restarts | None, snapshot: control_pb.JobStatus | None, driver: DriverInfo | None
) -> Restarts:
    """The totals after this snapshot and the driver Job's failed pods."""
    before = before or Restarts()
    after = before.model_copy()
    for entry in _new_entries(before, snapshot):
        if entry.pool in REASONS:
            setattr(after, entry.pool, getattr(after, entry.pool) + 1)
    if snapshot is not None and snapshot.run_id:
        after.run_id, after.seen = snapshot.run_id, len(snapshot.restarts)
    after.driver = max(before.driver, _driver_restarts(driver))
    return after


def _driver_restarts(driver: DriverInfo | None) -> int:
    """Failed driver pods the Job replaced: all of them but the last once the Job itself failed."""
    if driver is None:
        return 0
    return max(driver.failed_attempts - (1 if driver.failed else 0), 0)


def restart_events(
    before: Restarts | None, snapshot: control_pb.JobStatus | None, driver: DriverInfo | None
) -> list[tuple[str, str]]:
    """(reason, message) of each replacement not told yet."""
    before = before or Restarts()
    events = []
    for entry in _new_entries(before, snapshot):
        if entry.pool in REASONS:
            what = f"{entry.pool} replica {entry.replica}" if entry.pool != "trainer" else entry.replica
            replaced = f"replaced by {entry.replacement} in {entry.seconds:.1f}s"
            events.append((REASONS[entry.pool], f"{what} lost at step {entry.step} ({entry.cause}); {replaced}"))
    for attempt in range(before.driver + 1, _driver_restarts(driver) + 1):
        message = f"driver pod {attempt} failed; its Job starts another, which resumes from the last checkpoint"
        events.append(("DriverRestarted", message))
    return events
