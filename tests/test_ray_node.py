"""The local Ray node `rljob run` starts, on a real Ray: made once more when Ray's start runs out of its
fixed time, with nothing of a failed start left running; the pools' environment; started without an API
server or autoscaler monitor, or an idle wait for its raylet, or a raylet's 1 s wait for its object
store; stopped without Ray's wait on an autoscaler monitor."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest
import ray

from rljob_api.workercfg import Pool, WorkerConfigs, ray_system_config_env
from rljob_workers.driver.placement import ray_node

pytestmark = [pytest.mark.ray, pytest.mark.serial]


RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


ONE_CPU_EACH: dict[Pool, float] = {"rollout": 1, "reward": 1, "trainer": 1}


def _configs() -> WorkerConfigs:
    from rljob_api import derive_worker_configs, load_rljob

    from conftest import REPO

    return derive_worker_configs(load_rljob(REPO / "examples" / "arithmetic.yaml"))


def test_a_ray_start_that_times_out_is_made_once_more(monkeypatch, caplog):
    """Ray's start failing on its own fixed startup timeout cannot be brought about on demand (it came in
    CI, on a busy machine), so Ray's start is stood in for here: the first times out as Ray does."""
    calls: list[str] = []

    def start(cpus: int, resources: dict[str, int]) -> None:
        calls.append("start")
        if len(calls) == 1:
            raise Exception(RAY_TIMEOUT)

    monkeypatch.setattr(ray_node, "_start_ray", start)
    monkeypatch.setattr(ray_node.ray, "shutdown", lambda: calls.append("shutdown"))
    ray_node.init_local_ray(_configs(), ONE_CPU_EACH, {})
    assert calls == ["start", "shutdown", "start"]
    assert "Ray's node did not come up (The current node timed out during startup); starting Ray again" in caplog.text


def test_other_ray_start_errors_and_a_second_timeout_are_raised(monkeypatch):
    def refuse(cpus: int, resources: dict[str, int]) -> None:
        raise ValueError("num_cpus must be positive")

    monkeypatch.setattr(ray_node, "_start_ray", refuse)
    with pytest.raises(ValueError, match="num_cpus"):
        ray_node.init_local_ray(_configs(), ONE_CPU_EACH, {})

    def time_out(cpus: int, resources: dict[str, int]) -> None:
        raise Exception(RAY_TIMEOUT)

    monkeypatch.setattr(ray_node, "_start_ray", time_out)
    monkeypatch.setattr(ray_node.ray, "shutdown", lambda: None)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_node.init_local_ray(_configs(), ONE_CPU_EACH, {})


@ray.remote
def _environment_variable(name: str) -> str | None:

    return os.environ.get(name)


def test_the_pools_environment_reaches_ray_workers_and_leaves_the_driver_as_it_was(monkeypatch):
    """The local node starts with the pools' variables, so actors need no runtime env of their own;
    the driver's own environment is left as it was (a test or a restart in this process sees no token
    file it was not given)."""

    monkeypatch.delenv("RLJOB_LAUNCHER_TEST", raising=False)
    monkeypatch.setenv("RLJOB_LAUNCHER_KEPT", "driver")
    ray_node.init_local_ray(_configs(), ONE_CPU_EACH, {"RLJOB_LAUNCHER_TEST": "pools", "RLJOB_LAUNCHER_KEPT": "pools"})
    try:
        seen = ray.get([_environment_variable.remote(n) for n in ("RLJOB_LAUNCHER_TEST", "RLJOB_LAUNCHER_KEPT")])
    finally:
        ray.shutdown()
    assert seen == ["pools", "pools"]
    assert "RLJOB_LAUNCHER_TEST" not in os.environ and os.environ["RLJOB_LAUNCHER_KEPT"] == "driver"


def _rays_own_start() -> None:
    """A local node as plain ray.init starts it (API server, monitor and all): the baseline."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)


def _timed_shutdown(stop) -> tuple[float, int | None]:
    """Start a local node with Ray's own start, monitor and all (the local node `rljob run` starts has
    none, see below), stop it with `stop`; (seconds it took, the autoscaler monitor's exit status)."""
    _rays_own_start()
    node: Any = ray._private.worker._global_node
    monitor = node.all_processes["monitor"][0].process
    t0 = time.monotonic()
    stop()
    return time.monotonic() - t0, monitor.poll()


def _collect_then_shutdown() -> None:
    gc.collect()
    ray.shutdown()


def test_stopping_the_local_node_does_not_wait_on_the_autoscaler_monitor():
    """ray.shutdown stops the GCS before the monitor, whose SIGTERM handler then reports to the dead GCS
    until Ray kills it 1 s later. shutdown_ray kills the monitor first (a local node has nothing to
    autoscale), for a Ray whose monitor the local start could not leave out. Baseline beside the
    candidate, on the same machine. The baseline collects garbage first as shutdown_ray does (its reason is
    there): in a process as full as a pytest worker late in CI the collection alone took about 0.6 s."""
    plain, plain_status = _timed_shutdown(_collect_then_shutdown)
    fast, fast_status = _timed_shutdown(ray_node.shutdown_ray)
    print(f"local node's stop: gc + ray.shutdown {plain:.2f} s, shutdown_ray {fast:.2f} s ({plain / fast:.1f}x)")
    assert plain_status is not None and fast_status is not None  # both stopped it
    assert fast < plain - 0.5  # the 1 s wait is gone
    assert not ray.is_initialized()


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _running(pids: set[int]) -> set[int]:
    running = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.add(pid)
    return running


def _time_out_after_the_head_starts(monkeypatch, times: int) -> list[set[int]]:
    """Ray's node start fails `times` times where CI saw it fail: the GCS, monitor and dashboard up, the
    raylet never registered (its session had no raylet log at all). Ray's 30 s wait
    cannot be brought about on demand, so its exception is raised there; the processes are real.
    Returns, per failed start, the processes it left."""
    real = ray._private.node.Node.start_ray_processes
    before = _children()
    left: list[set[int]] = []

    def start_ray_processes(node: Any) -> None:
        if len(left) < times:
            left.append(_children() - before)
            raise Exception(RAY_TIMEOUT)
        real(node)

    monkeypatch.setattr(ray._private.node.Node, "start_ray_processes", start_ray_processes)
    return left


def test_a_start_that_times_out_leaves_none_of_its_processes_before_the_next(monkeypatch):
    """ray.init keeps no handle on the processes of a node that did not come up: they ran on beside the
    next start (in CI, the failed start's monitor still logged 20 minutes later)."""
    left = _time_out_after_the_head_starts(monkeypatch, times=1)
    ray_node.start_local_ray(2, {"reward": 2})
    try:
        assert len(left) == 1 and left[0], "the failed start started no process"
        assert not _running(left[0]), f"the failed start's processes still run: {_running(left[0])}"
        assert ray.get(_environment_variable.remote("PATH"))  # the second start's node works
    finally:
        ray_node.shutdown_ray()


def test_a_start_that_times_out_twice_is_raised_with_nothing_left_running(monkeypatch):
    before = _children()
    left = _time_out_after_the_head_starts(monkeypatch, times=2)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_node.start_local_ray(2, {"reward": 2})
    assert len(left) == 2 and all(left)
    assert not _running(_children() - before)
    assert not ray.is_initialized()


def test_a_start_whose_gcs_never_writes_its_port_is_made_once_more(monkeypatch, caplog):
    """CI saw a start whose GCS never ran (its session had no log at all): Ray's own 30 s wait for the
    GCS's port file ran out. Here the first start's GCS is not started and Ray's own wait, shortened,
    raises what it raised there; the second start is Ray's, whole."""
    real = ray._private.node.Node.start_gcs_server
    calls: list[str] = []

    def start_gcs_server(node: Any) -> None:
        calls.append("gcs")
        if len(calls) == 1:
            wait: Any = ray._raylet.wait_for_persisted_port  # type: ignore[attr-defined]  # compiled, no stub
            wait(node._session_dir, node._node_id, "gcs_server_port", timeout_ms=100)
        real(node)

    monkeypatch.setattr(ray._private.node.Node, "start_gcs_server", start_gcs_server)
    ray_node.start_local_ray(2, {"reward": 2})
    try:
        assert calls == ["gcs", "gcs"]
        assert "Ray's node did not come up (Timed out waiting for file" in caplog.text
        assert ray.get(_environment_variable.remote("PATH"))
    finally:
        ray_node.shutdown_ray()


def _seconds_from_registration_to_connect(start: Callable[[], None], monkeypatch) -> float:
    """Start a local node with `start`; seconds from its raylet registering with the GCS (the node's
    start time there) to ray.init connecting this driver to it: what ray.init waits after its node is up."""
    connecting: list[float] = []
    connect = ray._private.worker.connect

    def timed_connect(*args: Any, **kwargs: Any) -> Any:
        connecting.append(time.time())
        return connect(*args, **kwargs)

    monkeypatch.setattr(ray._private.worker, "connect", timed_connect)
    start()
    try:
        raylet: Any = ray._raylet  # compiled; its stub names no GCS client
        local_node: Any = ray._private.worker._global_node
        gcs = raylet.GcsClient(address=local_node.gcs_address)
        (node,) = gcs.get_all_node_info(timeout=10).values()
    finally:
        ray_node.shutdown_ray()
    return connecting[0] - node.start_time_ms / 1000


def test_the_local_start_goes_on_as_soon_as_its_raylet_registers(monkeypatch):
    """Ray asks the GCS for its new raylet 0.1 s after launching it and then once a second, while the
    raylet registers only once its agents are up (0.8 to 1.2 s in here): up to a second of every local
    start spent idle. start_local_ray goes on within a few polls. Ray's own start beside it, printed."""

    def plain() -> None:
        _rays_own_start()

    baseline = _seconds_from_registration_to_connect(plain, monkeypatch)
    prompt = [
        _seconds_from_registration_to_connect(lambda: ray_node.start_local_ray(2, {"reward": 2}), monkeypatch)
        for _ in range(2)
    ]
    print(f"raylet registered → driver connects: ray.init {baseline:.3f} s, start_local_ray {prompt} s")
    assert max(prompt) < 0.2, f"start_local_ray waited {prompt} s after its raylet registered"


def test_a_start_whose_quick_raylet_lookup_fails_comes_up_through_rays_own(monkeypatch, caplog):
    """The quick lookup uses Ray's private GCS client; a Ray that moved it still starts, at its own pace."""

    def moved(**kwargs: Any) -> None:
        raise AttributeError("module 'ray._raylet' has no attribute 'GcsClient'")

    monkeypatch.setattr(ray._raylet, "GcsClient", moved)
    caplog.set_level(logging.DEBUG, logger=ray_node.__name__)
    ray_node.start_local_ray(2, {"reward": 2})
    try:
        assert ray.get(_environment_variable.remote("PATH"))
    finally:
        ray_node.shutdown_ray()
    assert "waiting for the raylet without Ray's polling failed: module 'ray._raylet'" in caplog.text


def _started_ray_processes(start: Callable[[], object]) -> tuple[float, set[str]]:
    """Start a local node with `start`: (seconds to its first task's result, what its processes are:
    a Ray script's path under ray/, or a program's or process title's name)."""
    t0 = time.monotonic()
    start()
    try:
        ray.get(_environment_variable.remote("PATH"))
        seconds = time.monotonic() - t0
        kinds = set()
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                args = child.cmdline()
                scripts = [arg.split("/ray/", 1)[1] for arg in args if arg.endswith(".py") and "/ray/" in arg]
                kinds.add(scripts[0] if scripts else args[0].rsplit("/", 1)[-1])
    finally:
        ray_node.shutdown_ray()
    return seconds, kinds


def test_the_local_node_starts_without_the_api_server_or_the_autoscaler_monitor():
    """With the dashboard off, Ray's API server runs only Ray's usage-stats reporter, yet Ray waits for
    it to come up before it launches the raylet; the autoscaler monitor has nothing to resize on one
    local node. The local node starts without either; the GCS, the raylet, its agents and the log
    monitor are there. Ray's own start beside it, printed."""
    plain, plain_kinds = _started_ray_processes(_rays_own_start)
    lean, lean_kinds = _started_ray_processes(lambda: ray_node.start_local_ray(2, {"reward": 2}))
    print(f"local node up to its first task's result: ray.init {plain:.2f} s, start_local_ray {lean:.2f} s")
    print(f"its processes: {sorted(lean_kinds)}")
    for left_out in ("dashboard/dashboard.py", "autoscaler/_private/monitor.py"):
        assert left_out in plain_kinds
        assert left_out not in lean_kinds
    node = {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "_private/log_monitor.py"}
    assert node <= lean_kinds


def test_a_raylet_slower_than_the_quick_waits_is_still_found_by_rays_own_loop(monkeypatch):
    """When the quick lookup's wait runs out it answers as Ray's lookup does for a node not there yet
    (RuntimeError), so Ray's loop asks again, and past Ray's own 30 s reports its timeout once (a
    second full wait in Ray's lookup would have doubled it). Here every wait runs out at once."""
    monkeypatch.setattr(ray_node, "RAYLET_WAIT_SECONDS", 0.0)
    retried: list[str] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retried.append(record.getMessage())

    node_log, kept = logging.getLogger("ray._private.node"), Kept()  # where Ray's loop logs each retry
    monkeypatch.setattr(node_log, "level", logging.INFO)
    node_log.addHandler(kept)
    try:
        ray_node.start_local_ray(2, {"reward": 2})
        try:
            assert ray.get(_environment_variable.remote("PATH"))
        finally:
            ray_node.shutdown_ray()
    finally:
        node_log.removeHandler(kept)
    assert any("did not register in 0 s" in message for message in retried), retried


def test_a_local_start_leaves_the_system_config_that_pods_are_rendered_with_as_it_was():
    """Ray's start adds its object-spilling settings, this session's folder among them, to the _system_config
    it is given. Given the module's own, every later render in the process (an operator's, a test's) put them
    in each Ray pod's environment: the golden renders differed after a local run in the same pytest worker."""
    before = ray_system_config_env()
    ray_node.start_local_ray(2, {"reward": 2})
    try:
        assert ray_system_config_env() == before
    finally:
        ray_node.shutdown_ray()
