"""What a run reports while it runs: Prometheus metrics, a line of metrics.jsonl and the step's sample log per
train step, the held-out eval's rounds, the live table, and the pools' idle fractions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from rljob.v1 import control_service_pb2 as control_pb
from rljob_workers.driver.controller.report import StepReport
from rljob_workers.driver.telemetry.display import Progress
from rljob_workers.driver.telemetry.eval_log import EvalLog
from rljob_workers.driver.telemetry.idle import PoolIdle
from rljob_workers.driver.telemetry.metrics import RunMetrics, StepLog
from rljob_workers.driver.telemetry.trackers import Trackers

TICK_SECONDS = 0.2  # how often the live table and the idle and reward gauges are refreshed


class RunTelemetry:
    """The run's reports. `busy_seconds` reads every pool's busy seconds so far (for the idle fractions and
    each step's line); `trackers` is the caller's (one tracker run across trainer restarts)."""

    def __init__(
        self,
        job_name: str,
        output: Path,
        *,
        display: bool,
        busy_seconds: Callable[[], dict[str, float]],
        trackers: Trackers | None = None,
    ) -> None:
        self.output, self.trackers, self.busy_seconds = output, trackers, busy_seconds
        self.metrics = RunMetrics(job_name)
        self.eval_log = EvalLog(output, self.metrics, trackers)  # spec.data.eval's rounds
        self.progress = Progress(job_name, live=display)
        self.idle = PoolIdle(busy_seconds)
        self.steps: StepLog | None = None  # open while the controller runs (`running`)

    def idle_fractions(self) -> dict[str, float]:
        return self.idle.fractions(time.monotonic())

    def running(self) -> StepLog:
        """The step log, opened for the controller's run: leaving it as a context writes the sample logs."""
        self.steps = StepLog(self.output, self.trackers)
        return self.steps

    def step_done(self, report: StepReport, status: control_pb.JobStatus | None) -> None:
        """A train step's report: its gauges, its line (with the pools' busy seconds and the driver's CPU so
        far: where a step's time went) and the live table."""
        self.metrics.update(report)
        assert self.steps is not None
        self.steps.write(report, busy_seconds=self.busy_seconds(), driver_cpu_seconds=time.process_time())
        if status is not None:
            self.progress.update(status, step_done=True)

    async def tick(
        self,
        snapshot: Callable[[], control_pb.JobStatus],
        elastic: Callable[[], dict[str, tuple[int, int, int]]],
    ) -> None:
        """Refresh the idle fractions, the elastic pools' gauges (`elastic`: each one's backlog, desired and
        ready replicas) and the live table, until cancelled."""
        while True:
            self.idle.tick(time.monotonic())
            self.metrics.set_idle(self.idle_fractions())
            for pool, sizes in elastic().items():
                self.metrics.set_elastic(pool, *sizes)
            self.progress.update(snapshot(), step_done=False)
            await asyncio.sleep(TICK_SECONDS)
