"""The local Ray node `rljob run` starts: one node advertising every pool's resource, started without
the API server a dashboard-less node has no use for or the autoscaler monitor a one-node cluster has no
use for, without an idle wait for its raylet or the raylet's 1 s wait for its object store, made once
more when Ray's start runs out of its fixed time, and stopped without Ray's wait on a monitor."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import psutil
import ray

from rljob_api.workercfg import RAY_LOCAL_NODE_ENV, RAY_SYSTEM_CONFIG, Pool, WorkerConfigs, pool_resource
from rljob_workers.driver.errors import StoppedBeforePoolsUp

log = logging.getLogger(__name__)

# Ray's own start gives its raylet a fixed 30 s to register (and the raylet its agents 15 s,
# ray-project/ray#65983) and its GCS 30 s to write its port file. On a busy small machine that can run
# out; one more start is then made. (A raylet, GCS or dashboard that dies silently at its start is not
# this: gRPC's fork handlers abort a forked child unless common/grpc_env.py's settings are made.)
RAY_START_ATTEMPTS = 2
RAY_START_TIMEOUTS = ("timed out during startup", "Timed out waiting for file")
# Ray's start asks the GCS for its new raylet 0.1 s after launching it, then once a second
# (GlobalStateAccessor::GetNode sleeps 1 s between tries), while the raylet registers only once its
# agents are up: most of a second of every local start would be spent waiting for the next try.
# The driver asks far more often, within Ray's own 30 s for the raylet.
RAYLET_POLL_SECONDS = 0.02
RAYLET_WAIT_SECONDS = 30.0


def environment_replicas(configs: WorkerConfigs) -> int:
    """The environment actors a run starts (kind python): at least one; the elastic policy sizes the pool
    within spec.environment.replicas from then on."""
    environment = configs.controller.environment
    return max(environment.replicas.min, 1) if environment is not None else 0


def init_local_ray(configs: WorkerConfigs, pool_cpus: Mapping[Pool, float], env: dict[str, str]) -> None:
    """A local Ray cluster on 127.0.0.1 advertising enough of each pool's resource for the job (each of its
    replicas asking for `pool_cpus[pool]`), its processes started with `env` (see `worker_env`)."""
    # Ray's workers inherit the node's environment: with the pools' variables there, an actor needs no
    # runtime env of its own and takes one of the workers Ray starts ahead of time instead of waiting for a
    # fresh process.
    counts: dict[Pool, int] = {
        "rollout": configs.controller.rollout_replicas,
        "reward": configs.controller.reward_replicas.max,
        "trainer": configs.trainer.world_size,
    }
    environment = configs.controller.environment
    if configs.environment is not None and environment is not None:  # a spare for a replacement replica
        counts["environment"] = max(environment.replicas.max, environment_replicas(configs)) + 1
    # Every actor fits even on a small machine: cores are shared, Ray only books them.
    cpus = sum(counts[pool] * pool_cpus[pool] for pool in counts) + 1
    # One spare rollout slot for a replacement replica.
    start_local_ray(int(cpus + 0.999), {**counts, "rollout": counts["rollout"] + 1}, env)


def start_local_ray(cpus: int, resources: dict[Pool, int], env: dict[str, str] | None = None) -> None:
    """A local Ray node with `cpus` and each pool's resource, its processes started with RAY_LOCAL_NODE_ENV
    and `env`. A start
    that fails leaves none of its processes running: ray.init keeps no handle on those of a node that
    did not come up (its GCS and monitor), and they would run on until this process ends."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        earlier = {child.pid for child in _descendants()}
        try:
            # Ray's processes keep it; this one gets its own back. This environment's own settings win.
            node_env = {name: os.environ.get(name, value) for name, value in RAY_LOCAL_NODE_ENV.items()}
            with _environment({**node_env, **(env or {})}):
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
    """ray.shutdown(), without its 1 s wait on the autoscaler monitor of a node that has one (a Ray
    whose start_monitor is not where `_start_ray` replaces it). Ray stops the GCS before the monitor,
    whose SIGTERM handler then reports to the dead GCS until Ray kills it a second later. A local node
    has nothing to autoscale, so the monitor goes first, by SIGKILL (its handler would publish an
    "autoscaler failed" error to this driver). Ray has no public hook for it; a Ray without this
    private one just takes the second."""
    # Ray object refs caught in reference cycles (a failed task's exception holds the frames it passed through,
    # one of them the task itself) go now, while Ray is up: one freed after ray.shutdown() touches the shut core
    # worker, which ends this process at once (core_worker_process.cc), and a trainer restart needs it alive.
    gc.collect()
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
    # Ray has no public switch for any of them: its private names are replaced for the start only.
    with (
        _replaced(ray._private.node.Node, "start_api_server", lambda _: _no_api_server),
        _replaced(ray._private.node.Node, "start_monitor", lambda _: _no_monitor),
        _replaced(ray._private.services, "get_node", _prompt_raylet_lookup),
    ):
        init_ray(
            address="local",
            num_cpus=cpus,
            resources={pool_resource(pool): count for pool, count in resources.items()},
            include_dashboard=False,
            _system_config=dict(RAY_SYSTEM_CONFIG),  # Ray adds to the one it is given
            logging_level=logging.WARNING,
            configure_logging=True,
            log_to_driver=True,
        )


@contextlib.contextmanager
def _replaced(owner: Any, name: str, replacement: Callable[[Any], Any]) -> Iterator[None]:
    """`owner.name` is `replacement(original)` for the block. A Ray without that name is left as it is:
    its start is then only slower."""
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _no_api_server(node: Any, **options: Any) -> None:
    """Node.start_api_server's stand-in. With the dashboard off, Ray's API server runs only Ray's
    usage-stats reporter, yet Ray waits for it to come up before it launches the raylet. Ray already goes
    on without one that fails to start (the dashboard URL is then '')."""
    node._webui_url = ""


def _no_monitor(node: Any) -> None:
    """Node.start_monitor's stand-in. Ray's autoscaler monitor resizes a cluster by its launcher's
    config; one local node has none and nothing to resize, and its process's start would take CPU from
    the pools' own start."""


def _prompt_raylet_lookup(ray_get_node: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """Ray's node lookup, told of the raylet within RAYLET_POLL_SECONDS of it registering, not at
    Ray's next 1 s poll."""

    def get_node(gcs_address: str, node_id: str) -> Any:
        if not _raylet_registered(gcs_address, node_id):
            # What Ray's lookup raises for a node not there yet: Ray's loop then reports its own
            # timeout, once, where a second full wait in Ray's lookup would double it.
            raise RuntimeError(f"the raylet of node {node_id} did not register in {RAYLET_WAIT_SECONDS:g} s")
        return ray_get_node(gcs_address, node_id)

    return get_node


def _raylet_registered(gcs_address: str, node_id: str) -> bool:
    """Wait until the GCS lists `node_id` alive (True), at most RAYLET_WAIT_SECONDS (False). A lookup
    that fails (Ray's private names moved) ends the wait with True: Ray's own lookup follows."""
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
                return False
            time.sleep(RAYLET_POLL_SECONDS)
    except Exception as exc:  # only a speed-up: Ray's own lookup is still right
        log.debug("waiting for the raylet without Ray's polling failed: %s", exc)
    return True
