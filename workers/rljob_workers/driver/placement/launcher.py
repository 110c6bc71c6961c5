"""Start a job's pools as Ray actors and hand the controller its handles. One code path: locally
a one-node cluster advertises every pool's resource (see ray_node); on KubeRay the worker groups
advertise them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rljob.v1 import rollout_service_pb2
from rljob_api.colocate import ROLLOUT_GPU_SHARE, TRAINER_GPU_SHARE
from rljob_api.workercfg import Pool, WorkerConfigs, pool_resource
from rljob_workers.common.auth import TOKEN_FILE_ENV
from rljob_workers.driver.controller.report import RunFailed
from rljob_workers.driver.errors import SetupError, first_line
from rljob_workers.engines.vllm_logging import vllm_log_env
from rljob_workers.environment.actor import EnvironmentActor
from rljob_workers.reward.actor import RewardActor
from rljob_workers.rollout.actor import RolloutActor
from rljob_workers.trainer.actor import TrainerActor
from rljob_workers.trainer.samples import TrainSample, combine_rank_metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a replica may take to stop cleanly before it is killed: a replica wedged in a collective
# or an engine must not hold up the run's end or a scale-down.
STOP_GRACE_SECONDS = 30.0
# Workers never reach a model hub, and transformers' progress bars would flood the driver's log.
WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TQDM_DISABLE": "1",
}


def worker_env(token_file: str) -> dict[str, str]:
    """What every pool process needs in its environment; `token_file` is where it reads the job's token
    (see common/auth.py)."""
    return {**WORKER_ENV, TOKEN_FILE_ENV: token_file}


def local_worker_env(configs: WorkerConfigs, output: Path, token_file: str) -> dict[str, str]:
    """`worker_env` of a run on one machine writing to `output`: vLLM's own log goes to the run's log file
    there, not the terminal (engines.vllm_logging)."""
    return {**worker_env(token_file), **vllm_log_env(configs, output)}


async def pool_started(pool: Pool, loads: str, start: Awaitable[T]) -> T:
    """`start`'s result. A replica whose start raised (a model type only the pool's transformers can
    refuse, say: see setup.check_model) is one SetupError line naming the pool and what it loads, not
    Ray's traceback of the actor."""
    try:
        return await start
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if exc.cause is not None else exc
        why = f"{type(cause).__name__}: {first_line(cause)}"
        raise SetupError(f"the {pool} pool did not start ({loads}): {why}") from None


def _options(
    pool: Pool,
    cpus: float,
    gpus: float,
    env: dict[str, str] | None,
    interpreter: dict[str, Any] | None = None,
    bundle: tuple[PlacementGroup, int] | None = None,
) -> dict[str, Any]:
    """An actor of `pool`, given `env` as its runtime env (None: the Ray node already has it), run by another
    interpreter where `interpreter` says so (runtimes.runtime_env), in a colocated GPU's `bundle`."""
    options: dict[str, Any] = {
        "resources": {pool_resource(pool): 1},
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_restarts": 0,
    }
    if bundle is not None:
        group, index = bundle
        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
    runtime: dict[str, Any] = {"env_vars": dict(env)} if env is not None else {}
    if interpreter is not None:
        runtime = {**runtime, **interpreter, "env_vars": {**runtime.get("env_vars", {}), **interpreter["env_vars"]}}
    if runtime:
        options["runtime_env"] = runtime
    return options


def trainer_rank_options(
    configs: WorkerConfigs, cpus: float, env: dict[str, str] | None, group: PlacementGroup | None, rank: int
) -> dict[str, Any]:
    """Trainer rank `rank`'s actor options: a GPU of its own, or its share of the colocated `group`'s GPU `rank`."""
    if group is not None:
        return _options("trainer", cpus, TRAINER_GPU_SHARE, env, bundle=(group, rank))
    return _options("trainer", cpus, 1 if configs.trainer.gpus_per_node > 0 else 0, env)


@dataclass
class RayTrainer:
    """The trainer pool: one actor per rank; the controller talks to it as one trainer."""

    actors: list[Any]
    checkpoint_root: str
    keep: int
    weight_address: str = ""
    plans: bytes = b""

    @classmethod
    async def start(
        cls,
        configs: WorkerConfigs,
        cpus: float,
        resume_dir: str | None,
        env: dict[str, str] | None,
        group: PlacementGroup | None = None,
    ) -> RayTrainer:
        """The trainer's ranks, rank r on the colocated `group`'s GPU r where there is one."""
        world, config_json = configs.trainer.world_size, configs.trainer.model_dump_json()
        actors = [
            TrainerActor.options(**trainer_rank_options(configs, cpus, env, group, rank)).remote(  # type: ignore[attr-defined]
                config_json, rank, world, cpus
            )
            for rank in range(world)
        ]
        address = await actors[0].dist_address.remote() if world > 1 else None
        await asyncio.gather(*(a.setup.remote(address, resume_dir) for a in actors))
        trainer = cls(actors, configs.trainer.checkpoint.dir, configs.trainer.checkpoint.keep)
        trainer.weight_address = await actors[0].start_weight_service.remote()
        return trainer

    async def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        world = len(self.actors)
        # the tokens trained on (an episode's observations are not)
        tokens = sum(len(s.token_ids) if s.loss_mask is None else sum(s.loss_mask) for s in samples)
        shards = [samples[rank::world] for rank in range(world)]
        results = await asyncio.gather(
            *(a.train_step.remote(s, len(samples), tokens) for a, s in zip(self.actors, shards, strict=True))
        )
        return combine_rank_metrics(results)

    async def publish(self, version: int, broadcast: bool = False) -> None:
        await asyncio.gather(*(a.publish.remote(version, broadcast) for a in self.actors))
        if not self.plans:
            self.plans = await self.actors[0].bucket_plans.remote()

    def broadcast_source(self, group_id: str) -> rollout_service_pb2.BroadcastSource:
        source = rollout_service_pb2.BroadcastSource.FromString(self.plans)
        source.group_id = group_id
        return source

    async def open_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]:
        host, port = await self.actors[0].open_weight_group.remote(group_id, world_size, backend, timeout)
        return host, port

    async def join_group(self) -> None:
        await self.actors[0].join_weight_group.remote()

    async def abort_group(self, group_id: str, reason: str) -> None:
        await self.actors[0].abort_weight_group.remote(group_id, reason)

    async def broadcast(self) -> int:
        version: int = await self.actors[0].broadcast.remote()
        return version

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        from rljob_workers.trainer.checkpoint import CheckpointWriteError

        try:
            paths = await asyncio.gather(
                *(
                    a.save_checkpoint.remote(self.checkpoint_root, step, controller_state, self.keep)
                    for a in self.actors
                )
            )
        except CheckpointWriteError as exc:  # a full disk: the run stops on it, the previous checkpoint whole
            raise RunFailed(first_line(getattr(exc, "cause", exc))) from None  # Ray's wrapper holds it as `cause`
        return str(paths[0])


class ReplicaStartTimeout(RunFailed):
    """A replica added to a running pool did not start in time; the message names the replica and the field."""


@dataclass
class ActorPool:
    """Replicas of one gRPC pool (rollout or reward) by name, with their addresses."""

    pool: Pool
    actor_class: Any
    config_json: str
    cpus: float
    gpus: float
    env: dict[str, str] | None = None  # the replicas' runtime env (see `_options`), set before the first add
    interpreter: dict[str, Any] | None = None  # another interpreter runs them (runtimes.runtime_env)
    group: PlacementGroup | None = None  # colocated rollout: a replica per GPU bundle (see colocated_group)
    actors: dict[str, Any] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    bundles: dict[str, int] = field(default_factory=dict)  # colocated: each replica's GPU bundle
    # Past it a replica that has not started (no node for it yet, its pod's image not pulled) is given up:
    # ReplicaStartTimeout. None: wait (the first replicas of a run, whose start the set-up checks bound).
    start_timeout: float | None = None
    _next: int = 0

    async def add(self) -> tuple[str, str]:
        index = self._next
        name = f"{self.pool}-{index}"
        self._next += 1
        bundle, gpus = None, self.gpus
        if self.group is not None:  # the GPU no live replica holds: a replacement takes its predecessor's
            free = sorted(set(range(self.group.bundle_count)) - set(self.bundles.values()))
            bundle, gpus, self.bundles[name] = (self.group, free[0]), ROLLOUT_GPU_SHARE, free[0]
        options = _options(self.pool, self.cpus, gpus, self.env, self.interpreter, bundle)
        actor = self.actor_class.options(**options).remote(self.config_json, self.cpus, index)
        try:
            address = await asyncio.wait_for(actor.start.remote(), self.start_timeout)
        except TimeoutError:
            ray.kill(actor)
            self.bundles.pop(name, None)
            field_name = f"spec.{self.pool}.startTimeoutSeconds"
            raise ReplicaStartTimeout(f"{name} did not start within {field_name} {self.start_timeout:g}") from None
        self.actors[name], self.addresses[name] = actor, address
        return name, address

    async def share_gpus_with_trainer(self, configs: WorkerConfigs, trainer_cpus: float) -> PlacementGroup | None:
        """spec.colocate: this (rollout) pool's replicas go on the trainer's GPUs, one on each (`colocated_group`)."""
        self.group = await colocated_group(configs, self.cpus, trainer_cpus)
        return self.group

    async def stop(self, name: str) -> str:
        """Stop a replica; returns what names it to the operator (its pod on a cluster, else the replica)."""
        actor = self.actors.pop(name)
        self.addresses.pop(name, None)
        self.bundles.pop(name, None)
        try:
            pod = await actor.pod_name.remote()
            await asyncio.wait_for(actor.stop.remote(), STOP_GRACE_SECONDS)
        except asyncio.TimeoutError:
            log.warning("%s did not stop within %gs; killed", name, STOP_GRACE_SECONDS)
        finally:
            ray.kill(actor)
        return str(pod or name)

    def kill(self, name: str) -> None:
        """Kill a replica without warning (fault injection and tests)."""
        ray.kill(self.actors.pop(name))
        self.addresses.pop(name, None)
        self.bundles.pop(name, None)

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(n) for n in list(self.actors)), return_exceptions=True)


def rollout_pool(configs: WorkerConfigs, cpus: float) -> ActorPool:
    return ActorPool("rollout", RolloutActor, configs.rollout.model_dump_json(), cpus, configs.rollout.gpus)


def environment_pool(configs: WorkerConfigs, cpus: float) -> ActorPool:
    config, gpus = "{}", 0
    if configs.environment is not None:
        config, gpus = configs.environment.model_dump_json(), configs.environment.gpus
    return ActorPool("environment", EnvironmentActor, config, cpus, gpus)


def reward_pool(configs: WorkerConfigs, cpus: float) -> ActorPool:
    return ActorPool("reward", RewardActor, configs.reward.model_dump_json(), cpus, configs.reward.gpus)


async def colocated_group(configs: WorkerConfigs, rollout_cpus: float, trainer_cpus: float) -> PlacementGroup | None:
    """spec.colocate's GPUs, one bundle each for a rollout replica and a trainer rank (None when not colocated):
    Ray books a share of a GPU to each, and the bundle keeps the pair on the same GPU."""
    if not configs.colocate:
        return None
    pair = {"GPU": 1, "CPU": rollout_cpus + trainer_cpus, pool_resource("rollout"): 1, pool_resource("trainer"): 1}
    group = placement_group([dict(pair) for _ in range(configs.trainer.world_size)], strategy="STRICT_PACK")
    await group.ready()
    return group
