"""One local run: start the pools on Ray, wire the controller to them, show progress, clean up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_api import RLJob
from rljob_api.workercfg import WorkerConfigs
from rljob_workers.common.auth import JobToken
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.driver import rollout_env, summary
from rljob_workers.driver.controller.elastic import ElasticRewardPool
from rljob_workers.driver.controller.evaluation import evaluation_for
from rljob_workers.driver.controller.idle import PoolIdle
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.controller.report import Counts, RunFailed, StepReport
from rljob_workers.driver.controller.rollout_clients import RolloutClients
from rljob_workers.driver.controller.status import ControlServicer, RunView, final_status_message
from rljob_workers.driver.controller.weight_sync import WeightSync
from rljob_workers.driver.display import Progress
from rljob_workers.driver.eval_log import EvalLog
from rljob_workers.driver.launcher import ActorPool, RayTrainer, pool_started, reward_pool, rollout_pool, worker_env
from rljob_workers.driver.metrics import RunMetrics, StepLog, plot_rewards
from rljob_workers.driver.ray_node import init_local_ray, init_ray, shutdown_ray
from rljob_workers.driver.reward_router import RewardRouter
from rljob_workers.driver.rundir import lock_run_folders, starting_point
from rljob_workers.driver.setup import first_line, job_token
from rljob_workers.driver.stopping import SignalStop
from rljob_workers.driver.supervisor import (
    PoolSupervisor,
    Restart,
    RestartHistory,
    TrainerWatch,
    failed_run_exit_code,
    supervise,
)
from rljob_workers.driver.trackers import Trackers

log = logging.getLogger("rljob")


class LocalRun:
    """Everything one `rljob run` starts, so that it can all be stopped again."""

    def __init__(
        self,
        job: RLJob,
        configs: WorkerConfigs,
        output: Path,
        *,
        resume: bool,
        display: bool,
        metrics_port: int,
        step_hook: Callable[[LocalRun, StepReport], None] | None = None,
        cluster: bool = False,
        job_file: Path | None = None,
        stop_timeout: float = 60.0,
        lock_folders: bool = True,
        token: JobToken | None = None,
        history: RestartHistory | None = None,
        rollout_python: str | None = None,
        trackers: Trackers | None = None,
    ) -> None:
        self.cluster = cluster
        self.job_file = job_file
        self.lock_folders = lock_folders  # False: the caller holds them (across trainer restarts)
        self.token = token  # None: made in main() (see job_token)
        self.pool_env: dict[str, str] = {}  # every pool process's environment, set with the token
        self.actor_env: dict[str, str] | None = None
        self.signals = SignalStop(stop_timeout)
        self.supervisors: list[PoolSupervisor] = []
        self.trainer_watch = TrainerWatch([])
        self.history = history or RestartHistory()
        # On a cluster the operator and dashboards reach the controller from other pods.
        self.serve_host = "0.0.0.0" if cluster else "127.0.0.1"
        self.job, self.configs, self.output = job, configs, output
        self.step_hook = step_hook
        self.trackers = trackers  # one tracker run across trainer restarts: the caller's, and closed by it
        self.reports: list[StepReport] = []
        self.resume, self.display = resume, display
        # On a cluster the spec's port, where the chart's scrapers look; locally a free one unless given.
        self.metrics_port = metrics_port or (configs.ports.metrics if cluster else 0)
        spec = job.spec
        self.cpus = {"rollout": spec.rollout.cpus, "reward": spec.reward.cpus, "trainer": spec.trainer.cpus}
        self.rollout: ActorPool = rollout_pool(configs, spec.rollout.cpus)
        self.rollout.interpreter = rollout_env.runtime_env(rollout_python)  # an engine's own environment
        self.reward: ActorPool = reward_pool(configs, spec.reward.cpus)
        self.clients = RolloutClients(configs.rollout.max_concurrent_prompts)
        self.router = RewardRouter(replica_timeout=configs.controller.reward_timeout_seconds)
        self.control: RunningServer | None = None
        self.view: RunView | None = None
        self.controller: Controller | None = None
        self.weight_sync: WeightSync | None = None
        self.elastic: ElasticRewardPool | None = None
        self.idle = PoolIdle(self._busy_seconds)
        self.metrics = RunMetrics(job.metadata.name)
        self.eval_log = EvalLog(output, self.metrics, trackers)  # spec.data.eval's rounds
        self.progress = Progress(job.metadata.name, live=display)
        self.plotting: asyncio.Future[Path] | None = None  # the reward curve, drawn during the shutdown

    # ---- start ---------------------------------------------------------------------------
    def _use_token(self, token: JobToken) -> None:
        """Every pool serves with `token`; every client of the run sends it."""
        self.token = token
        # On a cluster each actor carries its environment; locally the Ray node is started with it.
        self.pool_env = worker_env(token.path)
        self.actor_env = self.pool_env if self.cluster else None
        self.rollout.env = self.reward.env = self.actor_env
        self.clients.token = self.router.token = token.value

    async def _start_pools(self, resume_dir: Path | None) -> RayTrainer:
        c, model = self.configs, f"spec.model.path: {self.job.spec.model.path}"
        rollouts, rewards = c.controller.rollout_replicas, max(c.controller.reward_replicas.min, 1)
        resume = str(resume_dir) if resume_dir else None
        group = await self.rollout.share_gpus_with_trainer(c, self.cpus["trainer"])  # None unless spec.colocate
        # Every pool starts at once: a replica's start is mostly its process importing and loading.
        replicas = asyncio.gather(
            *(pool_started("rollout", model, self.rollout.add()) for _ in range(rollouts)),
            *(pool_started("reward", "spec.reward.functions", self.reward.add()) for _ in range(rewards)),
        )
        if group is not None:  # colocated: vLLM sizes its share by the memory free at its start, so it goes first
            await replicas
        trainer_started = RayTrainer.start(c, self.cpus["trainer"], resume, self.actor_env, group)
        started, trainer = await asyncio.gather(replicas, pool_started("trainer", model, trainer_started))
        for name, address in started[:rollouts]:
            self.clients.add(name, address)
        for name, address in started[rollouts:]:
            await self.router.add_replica(name, address)
        return trainer

    def _pool_sizes(self) -> dict[str, tuple[int, int, list[str]]]:
        c = self.configs
        reward: tuple[int, int, list[str]] = (len(self.reward.actors), len(self.reward.actors), [])
        if self.elastic is not None:
            reward = (self.elastic.desired, self.elastic.ready(), list(self.elastic.drained))
        return {
            "rollout": (c.controller.rollout_replicas, len(self.clients.live()), []),
            "trainer": (c.trainer.world_size, c.trainer.world_size, []),
            "reward": reward,
        }

    async def _serve_control(self, view: RunView) -> RunningServer:
        name = control_pb.DESCRIPTOR.services_by_name["ControlService"].full_name
        service = Service(control_grpc.add_ControlServiceServicer_to_server, ControlServicer(view), name)
        port = self.configs.ports.control if self.cluster else 0
        return await start_server([service], self.serve_host, port, token=self.token.value if self.token else None)

    # ---- run -----------------------------------------------------------------------------
    async def main(self) -> int:
        c = self.configs
        # Before anything is read or written.
        locks = lock_run_folders(self.output, Path(c.trainer.checkpoint.dir)) if self.lock_folders else []
        try:
            self._use_token(self.token or job_token(self.output, cluster=self.cluster))
            resume_dir, state, prompts = starting_point(c, self.output, self.resume)
            if self.cluster:
                init_ray(address="auto", logging_level=logging.WARNING)
            elif not ray.is_initialized():  # rljob run started it beside its checks (see local.py)
                init_local_ray(c, self.cpus["rollout"], self.cpus["reward"], self.cpus["trainer"], self.pool_env)
            return await self._run_until_stopped(prompts, state, resume_dir)
        finally:
            for lock in locks:
                lock.release()

    async def _run_until_stopped(self, prompts: Any, state: dict[str, Any], resume_dir: Path | None) -> int:
        self.signals.install(self._request_stop)
        try:
            return await self._run(prompts, state, resume_dir)
        except asyncio.CancelledError:
            if self.signals.signal is None:
                raise
            if self.view is not None:
                self._summary(self.signals.exit_code, self.view, self.reports)
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

    async def _run(self, prompts: Any, state: dict[str, Any], resume_dir: Path | None) -> int:
        c = self.configs
        started = time.monotonic()
        trainer = await self._start_pools(resume_dir)
        weight_sync, version = await self._sync_first_weights(trainer, int(state.get("policy_version", 0)))
        self.jsonl = StepLog(self.output, self.trackers)
        self.controller = controller = Controller(
            config=c.controller,
            prompts=prompts,
            rollout=self.clients,
            scorer=self.router,
            trainer=trainer,
            sync_weights=weight_sync.overlapped,
            on_step=self._on_step,
            evaluation=evaluation_for(c.controller, self.clients, self.router, self.eval_log.record),
            step=int(state.get("step", 0)),
            version=version,
            counts=Counts(**state.get("counts", {})),
        )
        self.history.trainer_back(controller.step)
        view = self.view = RunView(
            controller,
            c.controller.algorithm.total_steps,
            self._pool_sizes,
            stop_requested=controller.stop,
            idle=self.idle_fractions,
            history=self.history,
        )
        port = self.metrics.serve(self.metrics_port, self.serve_host)
        self.control = await self._serve_control(view)
        log.info(
            "pools up in %.1fs; ControlService on %s:%d, metrics on http://%s:%d/metrics, WeightService on %s",
            *(time.monotonic() - started, self.serve_host, self.control.port, self.serve_host, port),
            trainer.weight_address,
        )
        view.phase = control_pb.RUN_PHASE_RUNNING
        self.elastic = ElasticRewardPool(
            self.router,
            self.reward,
            c.controller.reward_replicas,
            c.controller.reward_scaling,
            arrivals=lambda: controller.counts.generated,
            drain_timeout=c.controller.reward_timeout_seconds,
        )
        self.elastic.desired = len(self.reward.actors)
        self.trainer_watch = TrainerWatch(trainer.actors)
        self.supervisors = self._supervisors(self.elastic.lock)
        rc = await self._drive(controller, view, self.elastic)
        self.progress.final(view.snapshot())
        self._summary(rc, view, self.reports)
        return rc

    def _supervisors(self, reward_lock: asyncio.Lock) -> list[PoolSupervisor]:
        """Who replaces a dead replica of each gRPC pool (see `supervisor`)."""
        restarts = self.configs.controller.max_restarts
        rollout = PoolSupervisor(
            self.rollout,
            restarts["rollout"],
            lost=lambda name: name in self.clients.replicas and not self.clients.replicas[name].alive,
            attach=self._attach_rollout,
            detach=lambda name, cause: self.clients.remove(name),
            on_restart=self._replaced,
        )
        reward = PoolSupervisor(
            self.reward,
            restarts["reward"],
            lost=lambda name: not self.router.has_replica(name),
            attach=self.router.add_replica,
            detach=self._detach_reward,
            on_restart=self._replaced,
            lock=reward_lock,
        )
        return [rollout, reward]

    async def _attach_rollout(self, name: str, address: str) -> None:
        """A new rollout replica pulls the current weights before the controller may pick it."""
        replica = self.clients.add(name, address)
        replica.alive = False
        assert self.weight_sync is not None
        await self.weight_sync.catch_up(replica, self.weight_sync.published)
        replica.alive = True
        if self.controller is not None:
            await self.controller.wake()  # prompts waiting for a replica may go now

    def _replaced(self, restart: Restart) -> None:
        self.history.replaced(restart, self.controller.step if self.controller else 0)

    async def _detach_reward(self, name: str, cause: str) -> None:
        self.router.drop_replica(name, cause)

    async def _sync_first_weights(self, trainer: RayTrainer, version: int) -> tuple[WeightSync, int]:
        """Publish the trainer's weights as `version` and bring every rollout replica to it."""
        c = self.configs
        backend = c.controller.weight_sync.backend
        if backend == "auto":
            backend = "nccl" if c.rollout.gpus > 0 and c.trainer.gpus_per_node > 0 and not c.colocate else "gloo"
        sync = self.weight_sync = WeightSync(trainer, self.clients, backend, c.controller.weight_sync.timeout_seconds)
        await sync.publish_initial(version)
        if version > 0:
            await asyncio.gather(*(sync.catch_up(r, version) for r in self.clients.live()))
        return sync, version

    def _on_step(self, report: StepReport) -> None:
        self.reports.append(report)
        if self.step_hook is not None:
            self.step_hook(self, report)
        self.metrics.update(report)
        # The pools' busy seconds and the driver's CPU so far: per step, where a step's time went.
        self.jsonl.write(report, busy_seconds=self._busy_seconds(), driver_cpu_seconds=time.process_time())
        if self.view is not None:
            self.view.last = report
            self.progress.update(self.view.snapshot(), step_done=True)

    async def _drive(self, controller: Controller, view: RunView, elastic: ElasticRewardPool) -> int:
        """Run the controller to its end beside the display tick and elastic scaling; the exit code."""
        with self.progress, self.jsonl:  # leaving it, the sample logs are written
            background = [
                asyncio.create_task(self._tick(view)),
                asyncio.create_task(elastic.run()),
                asyncio.create_task(supervise(self.supervisors, self.trainer_watch, controller.fail)),
            ]
            try:
                await controller.run()
                if self.signals.signal is not None:
                    view.message = f"stopped by {self.signals.signal.name} at step {controller.step}"
                    return self.signals.exit_code
                view.phase = control_pb.RUN_PHASE_SUCCEEDED
                return 0
            except (RunFailed, ray.exceptions.RayActorError) as exc:
                view.phase, view.message = control_pb.RUN_PHASE_FAILED, first_line(exc) or type(exc).__name__
                return await failed_run_exit_code(exc, self.trainer_watch)  # `rljob run` restarts a lost trainer
            finally:
                for task in background:
                    task.cancel()

    async def _tick(self, view: RunView) -> None:
        while True:
            self.idle.tick(time.monotonic())
            self.metrics.set_idle(self.idle_fractions())
            if self.elastic is not None:
                self.metrics.set_reward(self.elastic.backlog(), self.elastic.desired, self.elastic.ready())
            self.progress.update(view.snapshot(), step_done=False)
            await asyncio.sleep(0.2)

    def _busy_seconds(self) -> dict[str, float]:
        trainer = self.controller.trainer_busy.seconds() if self.controller is not None else 0.0
        return {"rollout": self.clients.busy.seconds(), "trainer": trainer, "reward": self.router.busy.seconds()}

    def idle_fractions(self) -> dict[str, float]:
        return self.idle.fractions(time.monotonic())

    def _summary(self, rc: int, view: RunView, reports: list[StepReport]) -> None:
        summary.write_termination_message(final_status_message(view.snapshot()))
        end = summary.RunEnd(
            rc,
            self.output,
            message=view.message,
            stopped_by=self.signals.signal.name if self.signals.signal is not None else None,
            checkpoint=self.controller.last_checkpoint if self.controller else None,
            job_file=self.job_file,
            scored=self.elastic.scored_by_replica() if self.elastic is not None else None,
            trained=bool(reports),
        )
        if summary.plots(end):  # drawn while Ray shuts down, which mostly waits on its processes (see _shutdown)
            title = f"rljob run: {self.job.metadata.name}"
            jsonl, png = self.output / summary.METRICS_JSONL, self.output / summary.REWARD_CURVE
            self.plotting = asyncio.get_running_loop().run_in_executor(None, plot_rewards, jsonl, png, title)
        print("\n".join(summary.summary_lines(end)), flush=True)

    async def _shutdown(self) -> None:
        try:
            if not self.signals.hard:
                await self._stop_gracefully()
        except asyncio.CancelledError:
            pass  # a second signal: stop at once
        finally:
            # Its port is free again for a restart in this process. In a thread: the HTTP server's
            # shutdown waits out its 0.5 s poll, as long as Ray's own shutdown.
            closed = asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
            shutdown_ray()  # ends every pool process Ray started, whatever state it is in
            await closed
            if self.plotting is not None:
                try:
                    await self.plotting
                except Exception as exc:  # the run's outcome stands: only its picture is missing
                    log.warning("reward curve not drawn: %s: %s", type(exc).__name__, exc)

    async def _stop_gracefully(self) -> None:
        with contextlib.suppress(Exception):
            if self.control is not None:
                await self.control.stop(None)
        with contextlib.suppress(Exception):
            await self.router.close()
        with contextlib.suppress(Exception):
            await self.clients.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(self.rollout.stop_all(), self.reward.stop_all()), 30)
