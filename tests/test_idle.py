"""The idle meter: the fraction of recent observations in which a pool had nothing to do."""

from rljob_workers.controller.idle import IdleMeter


def test_idle_fraction_over_a_sliding_window():
    meter = IdleMeter(window=10.0)
    assert meter.fraction() == 0.0
    for t in range(10):
        meter.record(float(t), busy=t % 4 != 0)  # idle at t = 0, 4, 8
    assert meter.fraction() == 3 / 10
    for t in range(10, 21):
        meter.record(float(t), busy=True)  # the window slides past the idle stretch
    assert meter.fraction() == 0.0
