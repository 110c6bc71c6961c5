"""The idle meter: the fraction of the recent window in which a pool had nothing to do."""

import pytest

from rljob_workers.driver.pools.busy import BusyClock
from rljob_workers.driver.telemetry.idle import IdleMeter, PoolIdle


def test_a_pool_busy_between_the_ticks_is_counted_busy():
    """Busy a tenth of every second, never at a tick: 90% idle (observing whether it was busy at each tick,
    as the meter did before, gave 100%)."""
    now = [0.0]
    clock = BusyClock(clock=lambda: now[0])
    meter = IdleMeter(window=60.0)
    for second in range(10):
        now[0] = float(second)
        meter.record(now[0], clock.seconds())
        now[0] = second + 0.45
        with clock.busy():
            now[0] = second + 0.55
    now[0] = 10.0
    assert meter.fraction(10.0, clock.seconds()) == pytest.approx(0.9)


def test_idle_fraction_over_a_sliding_window():
    meter = IdleMeter(window=10.0)
    assert meter.fraction(0.0, 0.0) == 0.0  # nothing read yet
    for t in range(11):
        meter.record(float(t), busy_seconds=float(t))  # busy from 0 to 10
    assert meter.fraction(10.0, 10.0) == 0.0
    for t in range(11, 16):
        meter.record(float(t), busy_seconds=10.0)  # idle from 10 on
    assert meter.fraction(15.0, 10.0) == pytest.approx(0.5)  # the window is 5 to 15
    for t in range(16, 21):
        meter.record(float(t), busy_seconds=10.0)
    assert meter.fraction(20.0, 10.0) == 1.0  # the window has slid past the busy stretch


def test_a_new_clock_starts_the_meter_over():
    meter = IdleMeter(window=60.0)
    meter.record(0.0, 0.0)
    meter.record(10.0, 10.0)  # busy throughout
    meter.record(11.0, 0.0)  # a new clock (the controller made again) reads from zero
    assert meter.fraction(21.0, 0.0) == 1.0  # idle since it started over, not "busy 10 s of 21"


def test_pool_idle_reads_every_pool_at_each_tick():
    busy = {"rollout": 0.0, "trainer": 0.0}
    pools = PoolIdle(lambda: dict(busy), window=60.0)
    assert pools.fractions(0.0) == {}
    pools.tick(0.0)
    busy["rollout"] = 2.0  # the rollout pool worked 2 s of the next 4; the trainer none
    assert pools.fractions(4.0) == {"rollout": pytest.approx(0.5), "trainer": 1.0}


def test_busy_clock_counts_overlapping_work_once():
    now = [0.0]
    clock = BusyClock(clock=lambda: now[0])
    clock.begin()  # t=0: first piece of work
    now[0] = 1.0
    clock.begin()  # t=1: a second one overlaps
    now[0] = 2.0
    clock.end()
    assert clock.is_busy and clock.seconds() == 2.0  # the open stretch counts
    now[0] = 3.0
    clock.end()  # t=3: idle
    now[0] = 10.0
    assert not clock.is_busy and clock.seconds() == 3.0
    with clock.busy():
        now[0] = 11.5
    assert clock.seconds() == 4.5
    with pytest.raises(RuntimeError, match="without a matching begin"):
        clock.end()
