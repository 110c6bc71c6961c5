"""One run session: start the pools on Ray, wire the controller to them, report, stop cleanly. The same
session runs under `rljob run` on one machine (a local Ray node) and in a KubeRay driver pod (the cluster's
Ray); `command.run_with_restarts` starts a new one, resumed, when the trainer group dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import ray

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.driver.controller.episode import Play
from rljob_workers.driver.controller.episodes import EpisodeRunner
from rljob_workers.driver.controller.evaluation import evaluation_for
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.controller.observations import ObservationEncoder
from rljob_workers.driver.controller.report import Counts, RunFailed, StepReport
from rljob_workers.driver.controller.set_aside import FAILED_JSONL, SetAside, prompt_limit
from rljob_workers.driver.controller.status import ControlServicer, RunView, final_status_message
from rljob_workers.driver.errors import first_line
from rljob_workers.driver.placement.launcher import local_worker_env
from rljob_workers.driver.placement.ray_node import init_local_ray, init_ray, shutdown_ray
from rljob_workers.driver.pools.elastic import ElasticPool
from rljob_workers.driver.run import deadlines, summary
from rljob_workers.driver.run.plan import RunPlan
from rljob_workers.driver.run.pools import JobPools
from rljob_workers.driver.run.rundir import dataset_cache, job_token, lock_run_folders, run_prompts, starting_point
from rljob_workers.driver.run.stopping import SignalStop
from rljob_workers.driver.run.supervision import (
    PoolSupervisor,
    Restart,
    RestartHistory,
    TrainerWatch,
    failed_run_exit_code,
    supervise,
)
from rljob_workers.driver.telemetry.curve import plot_rewards
from rljob_workers.driver.telemetry.files import METRICS_JSONL, REWARD_CURVE
from rljob_workers.driver.telemetry.live import RunTelemetry
from rljob_workers.driver.telemetry.trackers import Trackers

log = logging.getLogger("rljob")


class RunSession:
    """Everything one run of the plan starts, so that it can all be stopped again. `step_hook` is told of each
    train step (tests and benchmarks watch the run through it)."""

    def __init__(
        self,
        plan: RunPlan,
        *,
        history: RestartHistory | None = None,
        trackers: Trackers | None = None,
        step_hook: Callable[[RunSession, StepReport], None] | None = None,
    ) -> None:
        self.plan = plan
        self.lock_folders = True  # False: the caller holds them (across trainer restarts)
        self.history = history or RestartHistory()
        self.step_hook = step_hook
        self.signals = SignalStop(plan.stop_timeout)
        self.pools = JobPools(plan)
        self.telemetry = RunTelemetry(
            plan.job.metadata.name,
            plan.output,
            display=plan.display,
            busy_seconds=self._busy_seconds,
            trackers=trackers,
        )
        self.supervisors: list[PoolSupervisor] = []
        self.elastic: list[ElasticPool] = []  # the pools the elastic policy sizes
        self.trainer_watch = TrainerWatch([])
        self.reports: list[StepReport] = []
        self.control: RunningServer | None = None
        self.view: RunView | None = None
        self.controller: Controller | None = None
        self.plotting: asyncio.Future[Path] | None = None  # the reward curve, drawn during the shutdown
        config = plan.configs.controller
        self.deadlines = deadlines.Deadlines(config.progress_deadline_seconds, config.active_deadline_seconds)

    def trainer_lost_cause(self) -> str:
        """Why the trainer group was lost, for the restart's record."""
        return self.trainer_watch.dead or (self.view.message if self.view else "") or "the trainer group failed"

    # ---- run -----------------------------------------------------------------------------
    async def main(self) -> int:
        plan = self.plan
        # Before anything is read or written.
        locks = lock_run_folders(plan.output, plan.checkpoints) if self.lock_folders else []
        try:
            token = plan.token or job_token(plan.output, cluster=plan.cluster)
            self.pools.use_token(token)
            tools = plan.environment.tools if plan.environment is not None else ()
            resume_dir, state, prompts = starting_point(plan.configs, plan.output, plan.resume, tools)
            if plan.cluster:
                init_ray(address="auto", logging_level=logging.WARNING)
            elif not ray.is_initialized():  # `rljob run` starts it beside its checks (command.py)
                init_local_ray(plan.configs, plan.pool_cpus, local_worker_env(plan.configs, plan.output, token.path))
            return await self._run_until_stopped(prompts, state, resume_dir, token.value)
        finally:
            for lock in locks:
                lock.release()

    async def _run_until_stopped(self, prompts: Any, state: dict[str, Any], resume_dir: Path | None, token: str) -> int:
        self.signals.install(self._request_stop)
        try:
            return await self._run(prompts, state, resume_dir, token)
        except asyncio.CancelledError:
            if self.signals.signal is None:
                raise
            if self.view is not None:
                self._summary(self.signals.exit_code, self.view)
            return self.signals.exit_code
        finally:
            try:
                await self._shutdown()
            finally:  # signals stay ours until the end: a second one during the shutdown cuts it short
                self.signals.uninstall()

    def _request_stop(self, reason: str) -> bool:
        """A graceful stop (see `stopping`); False while there is nothing to save yet."""
        if self.controller is None or self.view is None:
            return False
        self.view.phase, self.view.message = control_pb.RUN_PHASE_STOPPING, f"stopping on {reason}"
        self.controller.stop.set()
        return True

    async def _run(self, prompts: Any, state: dict[str, Any], resume_dir: Path | None, token: str) -> int:
        started = time.monotonic()
        self.deadlines.started = self.deadlines.last_progress = started  # the run's clocks start with its pools
        trainer = await self.pools.start(resume_dir)
        weight_sync = await self.pools.sync_first_weights(int(state.get("policy_version", 0)))
        counts = Counts(**state.get("counts", {}))
        episodes = await self._episodes(counts)
        if episodes is not None and self.plan.environment is None and episodes.play.info.tools:
            # A kind image environment's Info comes from its first replica: its prompts offer the tools it names.
            prompts = run_prompts(self.plan.configs, self.plan.output, state, episodes.play.info.tools)
        controller = self.controller = self._controller(prompts, state, weight_sync.overlapped, counts, episodes)
        self.history.trainer_back(controller.step)
        view = self.view = RunView(
            controller,
            self.plan.configs.controller.algorithm.total_steps,
            self.pools.sizes,
            stop_requested=controller.stop,
            idle=self.telemetry.idle_fractions,
            history=self.history,
            deadlines=self.deadlines,
            loop_blocked=self._loop_blocked,
        )
        host = self.plan.serve_host
        port = self.telemetry.metrics.serve(self.plan.metrics_port, host)
        self.control = await self._serve_control(view, token)
        log.info(
            "pools up in %.1fs; ControlService on %s:%d, metrics on http://%s:%d/metrics, WeightService on %s",
            *(time.monotonic() - started, host, self.control.port, host, port, trainer.weight_address),
        )
        view.phase = control_pb.RUN_PHASE_RUNNING
        self.elastic = self.pools.start_elastic(arrivals=lambda: controller.counts.generated)
        self.trainer_watch = TrainerWatch(trainer.actors)
        self.supervisors = self.pools.supervisors(self._replaced, controller.wake)
        rc = await self._drive(controller, view)
        self.telemetry.progress.final(view.snapshot())
        self._summary(rc, view)
        return rc

    def _controller(
        self, prompts: Any, state: dict[str, Any], sync_weights: Any, counts: Counts, episodes: EpisodeRunner | None
    ) -> Controller:
        config, pools = self.plan.configs.controller, self.pools
        assert pools.trainer is not None
        return Controller(
            config=config,
            prompts=prompts,
            rollout=pools.clients,
            scorer=pools.router,
            trainer=pools.trainer,
            sync_weights=sync_weights,
            on_step=self._on_step,
            evaluation=evaluation_for(
                config,
                pools.clients,
                pools.router,
                self.telemetry.eval_log.record,
                episodes,
                cache_dir=dataset_cache(self.plan.output),
            ),
            step=int(state.get("step", 0)),
            version=int(state.get("policy_version", 0)),
            counts=counts,
            episodes=episodes,
            set_aside=SetAside(config.algorithm.max_failed_prompts, self.plan.output / FAILED_JSONL),
            prompt_limit=prompt_limit(config.model_path, config.data.max_prompt_tokens, config.sampling.max_new_tokens),
        )

    async def _episodes(self, counts: Counts) -> EpisodeRunner | None:
        """spec.environment's episodes, played against the environment pool (None without one)."""
        config, environments = self.plan.configs.controller, self.pools.environments
        if config.environment is None or environments is None:
            return None
        info = self.plan.environment or await environments.info()
        encoder = ObservationEncoder(config.model_path)
        return EpisodeRunner(Play(config, self.pools.clients, environments, encoder, info), counts)

    async def _serve_control(self, view: RunView, token: str) -> RunningServer:
        name = control_pb.DESCRIPTOR.services_by_name["ControlService"].full_name
        service = Service(control_grpc.add_ControlServiceServicer_to_server, ControlServicer(view), name)
        port = self.plan.configs.ports.control if self.plan.cluster else 0
        return await start_server([service], self.plan.serve_host, port, token=token)

    def _replaced(self, restart: Restart) -> None:
        self.history.replaced(restart, self.controller.step if self.controller else 0)

    def _on_step(self, report: StepReport) -> None:
        self.deadlines.progressed(time.monotonic())
        self.reports.append(report)
        if self.step_hook is not None:
            self.step_hook(self, report)
        if self.view is not None:
            self.view.last = report
        self.telemetry.step_done(report, self.view.snapshot() if self.view is not None else None)

    async def _drive(self, controller: Controller, view: RunView) -> int:
        """Run the controller to its end beside the display tick, elastic scaling and supervision; the exit
        code."""
        with self.telemetry.progress, self.telemetry.running():  # leaving it, the sample logs are written
            run = asyncio.create_task(controller.run(), name="controller")
            background = [
                asyncio.create_task(self.telemetry.tick(view.snapshot, self._elastic_sizes)),
                *(asyncio.create_task(elastic.run()) for elastic in self.elastic),
                asyncio.create_task(supervise(self.supervisors, self.trainer_watch, controller.fail)),
                asyncio.create_task(
                    deadlines.watch(
                        self.deadlines, self._waiting_on, self._past_deadline, _cancelling(run), self.plan.stop_timeout
                    )
                ),
            ]
            try:
                await _controller_run(run, self.deadlines)
                if self.deadlines.reason:  # the active deadline's graceful stop
                    view.phase = control_pb.RUN_PHASE_FAILED
                    return 1
                if self.signals.signal is not None:
                    view.message = f"stopped by {self.signals.signal.name} at step {controller.step}"
                    return self.signals.exit_code
                view.phase = control_pb.RUN_PHASE_SUCCEEDED
                return 0
            except (RunFailed, ray.exceptions.RayActorError) as exc:
                view.phase, view.message = control_pb.RUN_PHASE_FAILED, first_line(exc) or type(exc).__name__
                return await failed_run_exit_code(exc, self.trainer_watch)  # `rljob run` restarts a lost trainer
            finally:
                for task in [*background, run]:
                    task.cancel()

    def _past_deadline(self, reason: int, message: str) -> None:
        """A deadline passed: the active one stops the run as SIGTERM would (a checkpoint of the step); no
        progress fails it at once (a step that cannot finish has nothing to save)."""
        assert self.controller is not None and self.view is not None
        self.view.message = message
        if reason == control_pb.FAILURE_REASON_ACTIVE_DEADLINE:
            self.view.phase = control_pb.RUN_PHASE_STOPPING
            self.controller.stop.set()
        else:
            self.controller.fail(message)

    def _waiting_on(self) -> str:
        """What the run waits on now, for a deadline's message."""
        pools, parts = self.pools, []
        generating = {r.name: r.in_flight for r in pools.clients.replicas.values() if r.in_flight}
        if generating:
            parts.append("prompts generating on " + ", ".join(f"{n} ({k})" for n, k in sorted(generating.items())))
        router = pools.router.stats()
        scoring = {n: r.outstanding for n, r in router.replicas.items() if r.outstanding}
        if scoring:
            parts.append("samples scored on " + ", ".join(f"{n} ({k})" for n, k in sorted(scoring.items())))
        if router.waiting:
            parts.append(f"{router.waiting} sample(s) waiting for a reward replica")
        if self.controller is not None and self.controller.episodes is not None:
            parts.append(f"{self.controller.episodes.in_flight} episode(s) in flight")
        return "; ".join(parts) or "the trainer"

    def _loop_blocked(self) -> str:
        """The newest report of a replica whose event loop was blocked in the last minute, from the supervisors'
        pings ('' once a minute has passed without one)."""
        when, report = max((s.blocked for s in self.supervisors), key=lambda b: b[0], default=(0.0, ""))
        return report if time.monotonic() - when < 60.0 else ""

    def _elastic_sizes(self) -> dict[str, tuple[int, int, int]]:
        return {elastic.name: (elastic.backlog(), elastic.desired, elastic.ready()) for elastic in self.elastic}

    def _busy_seconds(self) -> dict[str, float]:
        trainer = self.controller.trainer_busy.seconds() if self.controller is not None else 0.0
        pools = self.pools
        return {"rollout": pools.clients.busy.seconds(), "trainer": trainer, "reward": pools.router.busy.seconds()}

    def _summary(self, rc: int, view: RunView) -> None:
        summary.write_termination_message(final_status_message(view.snapshot()))
        plan, elastic, environment = self.plan, self.pools.elastic, self.pools.elastic_environment
        end = summary.RunEnd(
            rc,
            plan.output,
            message=view.message,
            stopped_by=self.signals.signal.name if self.signals.signal is not None else None,
            checkpoint=self.controller.last_checkpoint if self.controller else None,
            job_file=plan.job_file,
            scored=elastic.scored_by_replica() if elastic is not None else None,
            played=environment.scored_by_replica() if environment is not None else None,
            trained=bool(self.reports),
        )
        if summary.plots(end):  # drawn while Ray shuts down, which mostly waits on its processes (see _shutdown)
            title = f"rljob run: {plan.job.metadata.name}"
            jsonl, png = plan.output / METRICS_JSONL, plan.output / REWARD_CURVE
            self.plotting = asyncio.get_running_loop().run_in_executor(None, plot_rewards, jsonl, png, title)
        print("\n".join(summary.summary_lines(end)), flush=True)

    async def _shutdown(self) -> None:
        try:
            if not self.signals.hard:
                with contextlib.suppress(Exception):
                    if self.control is not None:
                        await self.control.stop(None)
                await self.pools.stop()
        except asyncio.CancelledError:
            pass  # a second signal: stop at once
        finally:
            # Its port is free again for a restart in this process. In a thread: the HTTP server's
            # shutdown waits out its poll interval, as Ray's own shutdown waits on its processes.
            closed = asyncio.get_running_loop().run_in_executor(None, self.telemetry.metrics.close)
            shutdown_ray()  # ends every pool process Ray started, whatever state it is in
            await closed
            if self.plotting is not None:
                try:
                    await self.plotting
                except Exception as exc:  # the run's outcome stands: only its picture is missing
                    log.warning("reward curve not drawn: %s: %s", type(exc).__name__, exc)


def _cancelling(task: asyncio.Task[None]) -> Callable[[], Awaitable[None]]:
    async def cancel() -> None:
        task.cancel()

    return cancel


async def _controller_run(run: asyncio.Task[None], passed: deadlines.Deadlines) -> None:
    """Await the controller; a run the deadline watch had to cancel (a call that never returned) failed."""
    try:
        await run
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if passed.reason and run.cancelled() and not (current is not None and current.cancelling()):
            raise RunFailed("the run did not stop after its deadline passed; cancelled") from None
        raise
