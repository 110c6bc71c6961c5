"""The elastic reward policy: one pure function from what the reward pool sees to how many replicas it should have.

The load is the number of slots (samples in service at once) the pool needs: the larger of the
steady state that the arrival rate implies at the service latency (Little's law, ``rate ×
latency``) and what clears the backlog now (queued plus in flight) within one interval
(``backlog × latency / intervalSeconds``). Rollout hands a step's samples over at once, so the
backlog at the moment of looking swings from zero to a whole step's samples; counted as slots as
it was, such a burst that one replica clears in a fraction of a second held the pool at its
maximum. Before any latency is known the backlog itself is the load. The pool aims at
``targetBacklogPerReplica`` samples per replica:

- up to ``ceil(load / target)`` replicas, at most ``maxStepUp`` more at once;
- down only when the load would fit fewer replicas with ``DOWN_HEADROOM`` to spare
  (``ceil(load / (target × DOWN_HEADROOM))``) at every observation of the last
  ``scaleDownWindowSeconds``, at most ``maxStepDown`` fewer at once: the gap between the two
  thresholds keeps a load at a boundary from flapping, and the window a dip (the pipeline between
  two steps, when rollout waits for the trainer) from shedding a replica the next step needs again,
  whose pod would take seconds to come back;
- never outside ``min..max``, and no change within ``cooldownSeconds`` of the last one — except
  a pool of zero replicas with work waiting, which gets one at once, and a count outside
  ``min..max``, which is corrected at once.

The caller (the local launcher, or the operator on a cluster) runs `decide` every
``intervalSeconds``, applies ``decision.replicas`` (starting replicas, or draining then stopping
them), and passes ``decision.state`` to the next call. No clock, I/O or globals are read here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rljob_api.reward import ReplicaRange, ScalingSpec

# Scale down only when the load would fit the smaller pool at this fraction of the target.
DOWN_HEADROOM = 0.8


@dataclass(frozen=True)
class ScalingObservation:
    """What the pool looks like at time `now` (seconds, any monotonic origin)."""

    now: float
    backlog: int  # samples queued plus in flight
    arrival_rate: float = 0.0  # samples per second arriving lately
    latency_seconds: float | None = None  # service time of one sample lately; None before any
    replicas: int = 0  # replicas now (ready plus starting)


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between calls: when it last changed the count, and the replicas the load
    would have fitted at each observation within the scale-down window, as (now, replicas)."""

    last_change: float | None = None
    fitted: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True)
class ScalingDecision:
    """The replica count to have, why, and the state to pass to the next call."""

    replicas: int
    previous: int
    wanted: int  # the count the load asks for (within min..max), before step limits and cooldown
    reason: str
    state: ScalingState

    @property
    def changed(self) -> bool:
        return self.replicas != self.previous


def load_of(obs: ScalingObservation, interval: float) -> float:
    """Slots needed: the arrival rate's steady state, or clearing the backlog within `interval` seconds."""
    if not obs.latency_seconds:
        return float(obs.backlog)
    return max(obs.arrival_rate, obs.backlog / interval) * obs.latency_seconds


def decide(state: ScalingState, obs: ScalingObservation, bounds: ReplicaRange, scaling: ScalingSpec) -> ScalingDecision:
    """The reward replica count for `obs`; see the module docstring."""
    current, target = obs.replicas, scaling.target_backlog_per_replica
    load = load_of(obs, scaling.interval_seconds)
    need = math.ceil(load / target)
    up = _clamp(need, bounds)
    fits_now = _clamp(math.ceil(load / (target * DOWN_HEADROOM)), bounds)
    window = scaling.scale_down_window_seconds
    fitted = (*((t, n) for t, n in state.fitted if obs.now - t < window), (obs.now, fits_now))
    down = max(n for _, n in fitted)
    wanted = up if up > current else down if down < current else current
    why = f"load {load:g} ({_load_text(obs)}) at {target:g} per replica needs {need}"
    if need > bounds.max:
        why += f" (max {bounds.max})"
    fits = f"fits {down}" + (f" (the most over the last {window:g}s; {fits_now} now)" if down > fits_now else "")

    def to(count: int, reason: str) -> ScalingDecision:
        last_change = obs.now if count != current else state.last_change
        return ScalingDecision(count, current, _clamp(wanted, bounds), reason, ScalingState(last_change, fitted))

    if not bounds.min <= current <= bounds.max:
        fixed = _clamp(current, bounds)
        return to(fixed, f"correct {current} → {fixed}: outside min {bounds.min}..max {bounds.max}")
    if current == 0 and load > 0:  # work waits and nothing serves it: no cooldown applies
        first = max(1, min(up, scaling.max_step_up))
        return to(first, f"scale up 0 → {first}: {why}")
    if wanted == current:
        return to(current, f"hold {current}: {why}, {fits}")
    if state.last_change is not None and obs.now - state.last_change < scaling.cooldown_seconds:
        left = scaling.cooldown_seconds - (obs.now - state.last_change)
        return to(current, f"hold {current}: wants {wanted} ({why}), cooldown {left:.3g}s left")
    if wanted > current:
        new = min(current + scaling.max_step_up, wanted)
        capped = " (capped by maxStepUp)" if new < wanted else ""
        return to(new, f"scale up {current} → {new}: {why}{capped}")
    new = max(current - scaling.max_step_down, wanted)
    capped = " (capped by maxStepDown)" if new > wanted else ""
    return to(new, f"scale down {current} → {new}: {why}, {fits}{capped}")


def _clamp(count: int, bounds: ReplicaRange) -> int:
    return max(bounds.min, min(bounds.max, count))


def _load_text(obs: ScalingObservation) -> str:
    rate = f"{obs.arrival_rate:g}/s × {obs.latency_seconds:g}s" if obs.latency_seconds else "no latency yet"
    return f"backlog {obs.backlog}, {rate}"
