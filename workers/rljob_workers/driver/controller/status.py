"""The controller's ControlService: a status snapshot for the operator, the CLI and dashboards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from google.protobuf import json_format

from rljob.v1 import control_service_pb2 as pb
from rljob.v1 import control_service_pb2_grpc as pb_grpc
from rljob_workers.driver.controller.eval_report import EvalReport
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.controller.report import StepReport


class Restarts(Protocol):
    """What the status shows of the driver's RestartHistory (run/supervision.py, a room above this one)."""

    run_id: str
    entries: list[pb.Restart]


class Progress(Protocol):
    """What the status shows of the run's deadlines (run/deadlines.py, a room above this one)."""

    reason: int

    def stalled(self, now: float) -> float: ...


@dataclass
class RunView:
    """What the status is made of: the controller, the last step, pool sizes, the phase."""

    controller: Controller
    total_steps: int
    pools: Callable[[], dict[str, tuple[int, int, list[str]]]]
    idle: Callable[[], dict[str, float]] = dict
    phase: int = pb.RUN_PHASE_STARTING
    message: str = ""
    last: StepReport | None = None
    stop_requested: asyncio.Event | None = None
    history: Restarts | None = None  # every replacement of this driver process
    deadlines: Progress | None = None  # the run's progress and active deadlines
    loop_blocked: Callable[[], str] = str  # the newest report of a replica whose event loop was blocked

    def snapshot(self) -> pb.JobStatus:
        c = self.controller
        last = self.last
        counts = c.counts
        status = pb.JobStatus(
            phase=self.phase,  # type: ignore[arg-type]
            step=c.step,
            total_steps=self.total_steps,
            policy_version=c.version,
            samples=pb.SampleCounts(**asdict(counts)),  # the same names on both sides
            checkpoint=c.last_checkpoint or "",
            message=self.message,
        )
        status.samples.waiting_for_reward, status.reward_wait_reason = c.waiting_for_reward
        if c.episodes is not None:
            status.samples.episodes_in_flight = c.episodes.in_flight
        if self.history is not None:
            status.run_id = self.history.run_id
            status.restarts.extend(self.history.entries)
        if last is not None:
            status.reward_mean = last.reward_mean
            status.reward_std = last.reward_std
            status.staleness_mean = last.staleness_mean
            status.staleness_max = last.staleness_max
            status.elapsed_seconds = last.elapsed_seconds
            status.samples_per_second = counts.trained / max(last.elapsed_seconds, 1e-9)
        if c.evaluation is not None and c.evaluation.last is not None:
            status.eval.CopyFrom(eval_result(c.evaluation.last))
        if self.deadlines is not None:
            status.seconds_since_step = self.deadlines.stalled(time.monotonic())
            status.failure_reason = self.deadlines.reason  # type: ignore[assignment]
        status.loop_blocked = self.loop_blocked()
        idle = self.idle()
        for name, (desired, ready, drained) in self.pools().items():
            pool = pb.PoolStatus(desired=desired, ready=ready, drained=drained, idle_fraction=idle.get(name, 0.0))
            getattr(status, name).CopyFrom(pool)
        return status


def eval_result(report: EvalReport) -> pb.EvalResult:
    """An eval round as the status carries it."""
    return pb.EvalResult(
        step=report.step,
        policy_version=report.policy_version,
        reward_mean=report.reward_mean,
        rewards=report.rewards,
        pass_at_k=report.pass_at_k,
    )


# What the kubelet keeps of a container's termination message.
MAX_TERMINATION_MESSAGE = 4096


def final_status_message(status: pb.JobStatus) -> str:
    """The run's last status as one line of JSON for the driver pod's termination message, within the
    kubelet's limit (the message is cut and the drained replicas' names left out when it would not fit)."""
    final = pb.JobStatus()
    final.CopyFrom(status)
    text = json_format.MessageToJson(final, indent=None)
    if len(text) > MAX_TERMINATION_MESSAGE:
        for pool in (final.rollout, final.trainer, final.reward, final.environment):
            del pool.drained[:]
        del final.restarts[: max(len(final.restarts) - 8, 0)]  # the newest ones tell the end
        final.message = final.message[:1000]
        text = json_format.MessageToJson(final, indent=None)
    return text


class ControlServicer(pb_grpc.ControlServiceServicer):
    """Serves RunView snapshots."""

    def __init__(self, view: RunView) -> None:
        self.view = view

    async def GetJobStatus(self, request, context):
        return pb.GetJobStatusResponse(status=self.view.snapshot())

    async def WatchJobStatus(self, request, context):
        interval = request.interval_seconds or 1.0
        while True:
            status = self.view.snapshot()
            yield pb.WatchJobStatusResponse(status=status)
            if status.phase in (pb.RUN_PHASE_SUCCEEDED, pb.RUN_PHASE_FAILED):
                return
            await asyncio.sleep(interval)

    async def Stop(self, request, context):
        running = self.view.phase in (pb.RUN_PHASE_STARTING, pb.RUN_PHASE_RUNNING)
        if running and self.view.stop_requested is not None:
            self.view.message = f"stop requested: {request.reason}"
            self.view.stop_requested.set()
        return pb.StopResponse(accepted=running)
