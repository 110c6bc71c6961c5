"""The idle meter: the fraction of recent observations in which a pool had nothing to do."""

import pytest

from rljob_workers.driver.controller.idle import BusyClock, IdleMeter


def test_idle_fraction_over_a_sliding_window():
    meter = IdleMeter(window=10.0)
    assert meter.fraction() == 0.0
    for t in range(10):
        meter.record(float(t), busy=t % 4 != 0)  # idle at t = 0, 4, 8
    assert meter.fraction() == 3 / 10
    for t in range(10, 21):
        meter.record(float(t), busy=True)  # the window slides past the idle stretch
    assert meter.fraction() == 0.0


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
