"""The reward group's size: the controller's decision within min..max; only drained replicas go."""

from __future__ import annotations

import pytest

from rljob_api import ReplicaRange
from rljob_operator.options import ElasticGroup
from rljob_operator.render.group_sizing import decide_group

BOUNDS = ReplicaRange(min=2, max=8)
PODS = {"r-a", "r-b", "r-c", "r-d", "r-e"}


def decide(current: int | None, desired: int | None, drained=(), pods=PODS, pending=()) -> ElasticGroup:
    return decide_group(BOUNDS, ElasticGroup(current, tuple(pending)), desired, list(drained), pods)


def test_starts_at_min_without_a_decision() -> None:
    assert decide(None, None) == ElasticGroup(2, ())


@pytest.mark.parametrize("desired", [None, 0])
def test_no_decision_keeps_the_size(desired: int | None) -> None:
    assert decide(5, desired) == ElasticGroup(5, ())


@pytest.mark.parametrize(("desired", "expected"), [(6, 6), (8, 8), (50, 8)])
def test_scale_up_within_max(desired: int, expected: int) -> None:
    assert decide(5, desired) == ElasticGroup(expected, ())


def test_scale_down_waits_for_drained_replicas() -> None:
    assert decide(5, 3) == ElasticGroup(5, ())


def test_scale_down_removes_only_drained_replicas() -> None:
    assert decide(5, 3, drained=["r-d", "r-b"]) == ElasticGroup(3, ("r-b", "r-d"))


def test_scale_down_removes_no_more_than_asked() -> None:
    assert decide(5, 4, drained=["r-d", "r-b", "r-a"]) == ElasticGroup(4, ("r-a",))


def test_scale_down_never_below_min() -> None:
    assert decide(3, 1, drained=["r-a", "r-b", "r-c"]) == ElasticGroup(2, ("r-a",))


def test_drained_names_without_a_pod_are_ignored() -> None:
    assert decide(5, 3, drained=["gone-1", "r-c"]) == ElasticGroup(4, ("r-c",))


def test_pending_deletions_are_kept_and_not_counted_twice() -> None:
    # Last tick: replicas 5 -> 4 deleting r-c; KubeRay has not acted yet. The controller still lists r-c.
    assert decide(4, 3, drained=["r-c"], pending=["r-c"]) == ElasticGroup(4, ("r-c",))
    # Once the pod is gone it drops out of workersToDelete.
    assert decide(4, 3, drained=["r-c"], pending=["r-c"], pods=PODS - {"r-c"}) == ElasticGroup(4, ())
    # A new drained replica adds to the pending list.
    assert decide(4, 3, drained=["r-c", "r-e"], pending=["r-c"]) == ElasticGroup(3, ("r-c", "r-e"))


def test_bounds_changed_by_the_user_are_followed() -> None:
    assert decide_group(ReplicaRange(min=1, max=3), ElasticGroup(5), None, [], PODS) == ElasticGroup(3, ())
    assert decide_group(ReplicaRange(min=6, max=9), ElasticGroup(5), 2, ["r-a"], PODS) == ElasticGroup(6, ())
