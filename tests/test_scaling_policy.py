"""The elastic reward policy on recorded traces: a spike, a ramp, an idle stretch, a load at a boundary."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from rljob_api.reward import ReplicaRange, ScalingSpec
from rljob_workers.driver.pools.scaling_policy import ScalingDecision, ScalingObservation, ScalingState, decide

INTERVAL = 5.0
SPEC = ScalingSpec(target_backlog_per_replica=16, cooldown_seconds=30, max_step_up=4, max_step_down=1)


@dataclass(frozen=True)
class Point:
    """One recorded observation of the pool (the replica count comes from the policy's own decisions)."""

    backlog: int
    rate: float = 0.0
    latency: float | None = None


def replay(
    trace: Callable[[float], Point], seconds: float, bounds: ReplicaRange, start: int, spec: ScalingSpec = SPEC
) -> list[tuple[float, ScalingDecision]]:
    """Run the policy every INTERVAL over a trace; each decision is applied at once."""
    state, replicas, out = ScalingState(), start, []
    t = 0.0
    while t <= seconds:
        p = trace(t)
        decision = decide(state, ScalingObservation(t, p.backlog, p.rate, p.latency, replicas), bounds, spec)
        out.append((t, decision))
        state, replicas = decision.state, decision.replicas
        t += INTERVAL
    return out


def recorded(points: list[Point]) -> Callable[[float], Point]:
    """A trace of one recorded point per interval."""
    return lambda t: points[int(t / INTERVAL)]


def changes(decisions: list[tuple[float, ScalingDecision]]) -> list[tuple[float, int, int]]:
    return [(t, d.previous, d.replicas) for t, d in decisions if d.changed]


def assert_cooldown_respected(decisions: list[tuple[float, ScalingDecision]], cooldown: float) -> None:
    """No two changes within a cooldown, except starting a first replica for waiting work."""
    times = [t for t, before, _ in changes(decisions) if before > 0]
    assert all(b - a >= cooldown for a, b in itertools.pairwise(times)), times


def test_spike_scales_up_fast_capped_by_step_and_max() -> None:
    def spike(t: float) -> Point:
        return Point(400) if 20 <= t < 120 else Point(0)

    decisions = replay(spike, 200, ReplicaRange(min=1, max=8), start=1)
    assert changes(decisions)[:2] == [(20.0, 1, 5), (50.0, 5, 8)]  # +4 at once, then the rest up to max
    first = dict(decisions)[20.0]
    assert "load 400" in first.reason and "needs 25 (max 8)" in first.reason
    assert "capped by maxStepUp" in first.reason and first.wanted == 8
    assert "cooldown" in dict(decisions)[25.0].reason
    assert max(d.replicas for _, d in decisions) == 8
    # After the spike it steps back down, one per cooldown.
    down = [c for c in changes(decisions) if c[2] < c[1]]
    assert down and all(before - after == 1 for _, before, after in down)
    assert_cooldown_respected(decisions, 30)


def test_ramp_follows_the_load_monotonically() -> None:
    def ramp(t: float) -> Point:
        return Point(int(t * 200 / 300)) if t <= 300 else Point(200)

    decisions = replay(ramp, 400, ReplicaRange(min=1, max=16), start=1)
    counts = [d.replicas for _, d in decisions]
    assert counts == sorted(counts), "a rising load never scales down"
    assert counts[-1] == 13  # ceil(200 / 16)
    assert all(after - before <= 4 for _, before, after in changes(decisions))
    assert_cooldown_respected(decisions, 30)
    for t, d in decisions:  # never far behind: at most one cooldown's worth of ramp
        assert d.replicas >= min(13, (int(t * 200 / 300) - 40) / 16), (t, d)


def test_idle_stretch_scales_down_one_step_per_cooldown_to_min() -> None:
    decisions = replay(lambda t: Point(0), 400, ReplicaRange(min=2, max=8), start=8)
    assert changes(decisions) == [(30.0 * i, 8 - i, 7 - i) for i in range(6)]
    assert decisions[-1][1].replicas == 2 and decisions[-1][1].reason.startswith("hold 2")
    assert "scale down 8 → 7" in decisions[0][1].reason


def test_arrival_rate_times_latency_counts_as_load() -> None:
    # A short backlog, but 40 samples/s at 2 s each keep 80 in flight: 5 replicas at 16.
    obs = ScalingObservation(now=0, backlog=3, arrival_rate=40, latency_seconds=2.0, replicas=2)
    decision = decide(ScalingState(), obs, ReplicaRange(min=1, max=10), SPEC)
    assert (decision.replicas, decision.wanted) == (5, 5)
    assert "40/s × 2s" in decision.reason


def test_no_flapping_at_a_boundary() -> None:
    def boundary(t: float) -> Point:
        return Point(33 if int(t / INTERVAL) % 2 else 31)  # needs 3, then 2, then 3, ...

    decisions = replay(boundary, 600, ReplicaRange(min=1, max=8), start=3)
    assert changes(decisions) == [], "31..33 fits 3 replicas with the headroom: no change at all"
    decisions = replay(lambda t: Point(70 if int(t / 10) % 2 else 10), 600, ReplicaRange(min=1, max=8), start=1)
    assert_cooldown_respected(decisions, 30)


def test_zero_replicas_with_work_waiting_start_at_once() -> None:
    bounds = ReplicaRange(min=0, max=4)
    state = ScalingState(last_change=100.0)  # just scaled down to zero
    decision = decide(state, ScalingObservation(now=101, backlog=1, replicas=0), bounds, SPEC)
    assert decision.replicas == 1 and decision.state.last_change == 101
    idle = decide(ScalingState(), ScalingObservation(now=0, backlog=0, replicas=1), bounds, SPEC)
    assert idle.replicas == 0


@pytest.mark.parametrize("current", [0, 12])
def test_count_outside_bounds_is_corrected_at_once(current: int) -> None:
    bounds = ReplicaRange(min=2, max=6)
    decision = decide(ScalingState(last_change=0.0), ScalingObservation(1.0, 50, replicas=current), bounds, SPEC)
    assert decision.replicas == (2 if current == 0 else 6)
    assert decision.reason.startswith(f"correct {current} →")


def test_random_traces_stay_within_bounds_steps_and_cooldown() -> None:
    rng = random.Random(7)
    for _ in range(50):
        lo = rng.randint(0, 3)
        bounds = ReplicaRange(min=lo, max=rng.randint(max(lo, 1), 12))
        spec = ScalingSpec(
            target_backlog_per_replica=rng.choice([4, 16, 50]),
            cooldown_seconds=rng.choice([0, 10, 30]),
            max_step_up=rng.randint(1, 4),
            max_step_down=rng.randint(1, 3),
        )
        points = [
            Point(rng.choice([0, 0, 5, 40, 300]), rng.random() * 50, rng.choice([None, 0.1, 2.0])) for _ in range(80)
        ]
        decisions = replay(recorded(points), 79 * INTERVAL, bounds, bounds.min, spec)
        for _, d in decisions:
            assert bounds.min <= d.replicas <= bounds.max
            assert -spec.max_step_down <= d.replicas - d.previous <= spec.max_step_up
        assert_cooldown_respected(decisions, spec.cooldown_seconds)


def test_a_burst_the_pool_clears_within_an_interval_adds_no_replica() -> None:
    """Rollout hands over a step's samples at once. 128 samples at 10 ms each are 1.28 slot-seconds of work,
    gone within one 1 s interval on one replica: a backlog of 128 at the moment of looking asks for none
    more. (On the real node the burst alone held the pool at its maximum for the whole run.)"""
    spec = ScalingSpec(target_backlog_per_replica=12, interval_seconds=1, cooldown_seconds=5, max_step_up=3)
    burst = ScalingObservation(now=100, backlog=128, arrival_rate=128, latency_seconds=0.01, replicas=1)
    assert decide(ScalingState(), burst, ReplicaRange(min=1, max=3), spec).replicas == 1
    at_three = ScalingObservation(now=100, backlog=128, arrival_rate=128, latency_seconds=0.01, replicas=3)
    assert decide(ScalingState(), at_three, ReplicaRange(min=1, max=3), spec).replicas == 2  # one step down


def test_a_backlog_that_outlasts_the_interval_scales_up() -> None:
    """The same burst at 0.6 s a sample is 77 slot-seconds: 7 replicas of 12 to clear it in a second."""
    spec = ScalingSpec(target_backlog_per_replica=12, interval_seconds=1, cooldown_seconds=5, max_step_up=8)
    slow = ScalingObservation(now=100, backlog=128, arrival_rate=20, latency_seconds=0.6, replicas=1)
    decision = decide(ScalingState(), slow, ReplicaRange(min=1, max=10), spec)
    assert (decision.replicas, decision.wanted) == (7, 7), decision.reason


def real_node_trace(t: float) -> ScalingObservation:
    """The real-node elastic run's slow stretch (0.6 s a sample, 128 samples a step, 1.6 s a step on three
    replicas), as the driver saw it each second: the pool full, except for the second each step when rollout
    waits for the trainer and only a step's tail is left. From t=40 the judge is fast again (10 ms)."""
    if t >= 40:
        return ScalingObservation(t, backlog=20, arrival_rate=100, latency_seconds=0.01, replicas=0)
    if int(t) % 2:
        return ScalingObservation(t, backlog=12, arrival_rate=0, latency_seconds=0.6, replicas=0)
    return ScalingObservation(t, backlog=150, arrival_rate=128, latency_seconds=0.6, replicas=0)


def replay_each_second(spec: ScalingSpec, seconds: int) -> list[tuple[float, ScalingDecision]]:
    state, replicas, out = ScalingState(), 3, []
    for t in range(seconds):
        obs = real_node_trace(float(t))
        decision = decide(state, ScalingObservation(obs.now, obs.backlog, obs.arrival_rate, obs.latency_seconds,
                                                    replicas), ReplicaRange(min=1, max=3), spec)  # fmt: skip
        out.append((float(t), decision))
        state, replicas = decision.state, decision.replicas
    return out


REAL_NODE = ScalingSpec(
    target_backlog_per_replica=12, interval_seconds=1, cooldown_seconds=5, max_step_up=3, max_step_down=2
)


def test_a_dip_between_two_steps_keeps_the_replicas_the_next_step_needs() -> None:
    """On the real node a one-second dip mid-stretch shed a replica whose pod took 10 s to come back. Within
    the scale-down window the pool holds; once the judge is fast for a whole window, it sheds both at once."""
    decisions = replay_each_second(REAL_NODE.model_copy(update={"scale_down_window_seconds": 4}), 60)
    assert changes(decisions) == [(38.0 + 4, 3, 1)], changes(decisions)  # 4 s after the last full second
    held = dict(decisions)[41.0]
    assert "fits 3 (the most over the last 4s; 1 now)" in held.reason, held.reason


def test_without_a_window_the_dip_sheds_a_replica() -> None:
    """The same trace with no window: the first dip scales down (the defect the window fixes)."""
    decisions = replay_each_second(REAL_NODE.model_copy(update={"scale_down_window_seconds": 0}), 40)
    assert changes(decisions)[0] == (1.0, 3, 1)
