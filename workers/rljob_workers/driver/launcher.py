"""Start a job's pools as Ray actors and hand the controller its handles. One code path: locally
`ray.init()` makes a one-node cluster that advertises every pool's resource; on KubeRay the
worker groups advertise them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import psutil
import ray

from rljob.v1 import rollout_service_pb2
from rljob_api.workercfg import Pool, WorkerConfigs, pool_resource
from rljob_workers.common.auth import TOKEN_FILE_ENV
from rljob_workers.driver.actors import RewardActor, RolloutActor, TrainerActor
from rljob_workers.driver.setup import SetupError, first_line
from rljob_workers.driver.stopping import StoppedBeforePoolsUp
from rljob_workers.trainer.samples import TrainSample, combine_rank_metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long a replica may take to stop cleanly before it is killed: a replica wedged in a collective
# or an engine must not hold up the run's end or a scale-down.
STOP_GRACE_SECONDS = 30.0
# Ray's own start gives its raylet a fixed 30 s to register (and the raylet its agents 15 s,
# ray-project/ray#65983) and its GCS 30 s to write its port file. On a busy small machine that can run
# out; one more start is then made. (A raylet or GCS that never wrote a line, and a dashboard that
# "failed to start, return code -6", all seen in CI, were gRPC's fork handlers aborting the forked
# child: see common/grpc_env.py.)
RAY_START_ATTEMPTS = 2
RAY_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")
# Ray's start asks the GCS for its new raylet 0.1 s after launching it, then once a second
# (GlobalStateAccessor::GetNode sleeps 1 s between tries), while the raylet registers only once its
# agents are up, 0.8 to 1.2 s in on a 2-core machine: up to a second of every local start spent idle.
# The driver asks far more often; Ray's own lookup, and its own timeout, come after.
RAYLET_POLL_SECONDS = 0.02
RAYLET_WAIT_SECONDS = 30.0


def init_local_ray(
    configs: WorkerConfigs, rollout_cpus: float, reward_cpus: float, trainer_cpus: float, env: dict[str, str]
) -> None:
    """A local Ray cluster on 127.0.0.1 advertising enough of each pool's resource for the job, its
    processes started with `env` (see `worker_env`)."""
    # Ray's workers inherit the node's environment: with the pools' variables there, an actor needs no
    # runtime env of its own and takes one of the workers Ray starts ahead of time, instead of waiting
    # for a fresh process (about 0.7 s of each pool's start on a 2-core machine).
    reward_max = configs.controller.reward_replicas.max
    trainers = configs.trainer.world_size
    rollouts = configs.controller.rollout_replicas
    # Every actor fits even on a small machine: cores are shared, Ray only books them.
    cpus = rollouts * rollout_cpus + reward_max * reward_cpus + trainers * trainer_cpus + 1
    # One spare rollout slot for a replacement replica.
    start_local_ray(int(cpus + 0.999), {"rollout": rollouts + 1, "reward": reward_max, "trainer": trainers}, env)


def start_local_ray(cpus: int, resources: dict[Pool, int], env: dict[str, str] | None = None) -> None:
    """A local Ray node with `cpus` and each pool's resource, its processes started with `env`. A start
    that fails leaves none of its processes running: ray.init keeps no handle on those of a node that
    did not come up (its GCS, monitor and dashboard), and they would run on until this process ends."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        earlier = {child.pid for child in _descendants()}
        try:
            with _environment(env or {}):  # Ray's processes keep it; this one gets its own back
                _start_ray(cpus, resources)
            return
        except BaseException as exc:  # a signal's too (see local.StoppedBeforePoolsUp): nothing is left
            _kill_children_since(earlier)
            timed_out = isinstance(exc, Exception) and any(timeout in str(exc) for timeout in RAY_START_TIMEOUTS)
            if not timed_out or attempt == RAY_START_ATTEMPTS:
                raise
            log.warning("Ray's node did not come up (%s); starting Ray again", str(exc).split(". ")[0])
            shutdown_ray()


def _descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def _kill_children_since(earlier: set[int]) -> None:
    """SIGKILL this process's descendants not in `earlier`, and reap them. Only a failed start gets
    here; a process another thread started meanwhile would go too (rljob run's model check starts none)."""
    started = [child for child in _descendants() if child.pid not in earlier]
    for child in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(started, timeout=10)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`env` added to this process's environment for the block, then the old values back."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def shutdown_ray() -> None:
    """ray.shutdown(), without its 1 s wait on the autoscaler monitor. Ray stops the GCS before the
    monitor, whose SIGTERM handler then reports to the dead GCS until Ray kills it a second later:
    1 s of every local run's end. A local node has nothing to autoscale, so the monitor goes first,
    by SIGKILL (its handler would publish an "autoscaler failed" error to this driver). Ray has no
    public hook for it; a Ray without this private one just takes the second."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is not None:  # a driver connected to a cluster's Ray owns no processes: this kills nothing
        with contextlib.suppress(Exception):
            node.kill_monitor(check_alive=False)
    ray.shutdown()


def init_ray(**options: Any) -> None:
    """ray.init(**options), the driver's SIGTERM handler kept. ray.init first puts in its own, which
    exits with code 15 and no word; a SIGTERM during the start that it catches becomes
    StoppedBeforePoolsUp, as the driver's handler would have made it."""
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(**options)
    except SystemExit as exc:
        if exc.code == signal.SIGTERM and sigterm is not None:
            raise StoppedBeforePoolsUp(signal.SIGTERM) from None
        raise
    finally:
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


def _start_ray(cpus: int, resources: dict[Pool, int]) -> None:
    with _prompt_raylet_lookup():
        init_ray(
            address="local",
            num_cpus=cpus,
            resources={pool_resource(pool): count for pool, count in resources.items()},
            include_dashboard=False,
            logging_level=logging.WARNING,
            configure_logging=True,
            log_to_driver=True,
        )


@contextlib.contextmanager
def _prompt_raylet_lookup() -> Iterator[None]:
    """Ray's start, told of its raylet within RAYLET_POLL_SECONDS of it registering. Ray has no public
    hook for it: its private node lookup is wrapped for the block; a Ray without it keeps its 1 s polls."""
    services = ray._private.services
    ray_get_node = getattr(services, "get_node", None)
    if ray_get_node is None:
        yield
        return

    def get_node(gcs_address: str, node_id: str) -> Any:
        _wait_for_raylet(gcs_address, node_id)
        return ray_get_node(gcs_address, node_id)

    services.get_node = get_node
    try:
        yield
    finally:
        services.get_node = ray_get_node


def _wait_for_raylet(gcs_address: str, node_id: str) -> None:
    """Return once the GCS lists `node_id` alive, or after RAYLET_WAIT_SECONDS. A lookup that fails
    (Ray's private names moved) ends the wait: Ray's own lookup follows and reports what it finds."""
    deadline = time.monotonic() + RAYLET_WAIT_SECONDS
    try:
        from ray.core.generated import gcs_pb2, gcs_service_pb2

        # Compiled and generated modules whose stubs name none of these.
        raylet, nodes, requests = cast(Any, ray._raylet), cast(Any, gcs_pb2), cast(Any, gcs_service_pb2)
        gcs = raylet.GcsClient(address=gcs_address)
        selector = requests.GetAllNodeInfoRequest.NodeSelector(node_id=ray.NodeID.from_hex(node_id).binary())
        alive = nodes.GcsNodeInfo.GcsNodeState.ALIVE
        while not gcs.get_all_node_info(timeout=5, node_selectors=[selector], state_filter=alive):
            if time.monotonic() > deadline:
                return
            time.sleep(RAYLET_POLL_SECONDS)
    except Exception as exc:  # only a speed-up: Ray's own lookup is still right
        log.debug("waiting for the raylet without Ray's polling failed: %s", exc)


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


def _options(pool: Pool, cpus: float, gpus: int, env: dict[str, str] | None) -> dict[str, Any]:
    """An actor of `pool`, given `env` as its runtime env (None: the Ray node already has it)."""
    options: dict[str, Any] = {
        "resources": {pool_resource(pool): 1},
        "num_cpus": cpus,
        "num_gpus": gpus,
        "max_restarts": 0,
    }
    if env is not None:
        options["runtime_env"] = {"env_vars": env}
    return options


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
        cls, configs: WorkerConfigs, cpus: float, resume_dir: str | None, env: dict[str, str] | None
    ) -> RayTrainer:
        world = configs.trainer.world_size
        gpus = 1 if configs.trainer.gpus_per_node > 0 else 0
        config_json = configs.trainer.model_dump_json()
        options = _options("trainer", cpus, gpus, env)
        actors = [
            TrainerActor.options(**options).remote(config_json, rank, world, cpus)  # type: ignore[attr-defined]
            for rank in range(world)
        ]
        address = await actors[0].dist_address.remote() if world > 1 else None
        await asyncio.gather(*(a.setup.remote(address, resume_dir) for a in actors))
        trainer = cls(actors, configs.trainer.checkpoint.dir, configs.trainer.checkpoint.keep)
        trainer.weight_address = await actors[0].start_weight_service.remote()
        return trainer

    async def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        world = len(self.actors)
        tokens = sum(len(s.token_ids) for s in samples)
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

    async def broadcast(self) -> int:
        version: int = await self.actors[0].broadcast.remote()
        return version

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        paths = await asyncio.gather(
            *(a.save_checkpoint.remote(self.checkpoint_root, step, controller_state, self.keep) for a in self.actors)
        )
        return str(paths[0])


@dataclass
class ActorPool:
    """Replicas of one gRPC pool (rollout or reward) by name, with their addresses."""

    pool: Pool
    actor_class: Any
    config_json: str
    cpus: float
    gpus: int
    env: dict[str, str] | None = None  # the replicas' runtime env (see `_options`), set before the first add
    actors: dict[str, Any] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    _next: int = 0

    async def add(self) -> tuple[str, str]:
        index = self._next
        name = f"{self.pool}-{index}"
        self._next += 1
        options = _options(self.pool, self.cpus, self.gpus, self.env)
        actor = self.actor_class.options(**options).remote(self.config_json, self.cpus, index)
        address = await actor.start.remote()
        self.actors[name], self.addresses[name] = actor, address
        return name, address

    async def stop(self, name: str) -> str:
        """Stop a replica; returns what names it to the operator (its pod on a cluster, else the replica)."""
        actor = self.actors.pop(name)
        self.addresses.pop(name, None)
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

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(n) for n in list(self.actors)), return_exceptions=True)


def rollout_pool(configs: WorkerConfigs, cpus: float) -> ActorPool:
    return ActorPool("rollout", RolloutActor, configs.rollout.model_dump_json(), cpus, configs.rollout.gpus)


def reward_pool(configs: WorkerConfigs, cpus: float) -> ActorPool:
    return ActorPool("reward", RewardActor, configs.reward.model_dump_json(), cpus, configs.reward.gpus)
