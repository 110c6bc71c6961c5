"""The shell every pool's Ray actor shares: where it is reached, one torch thread per CPU it asked for, and
a start with the garbage collector paused. Each pool's actor lives beside its server (rollout/actor.py,
reward/actor.py, trainer/actor.py): the actor runs in the pool's process, the driver only holds its handle.

Actors are thin: they host a gRPC server (rollout, reward) or a trainer rank, and run blocking torch work in
a thread so that their event loop keeps serving.
"""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any

import ray

from rljob_workers.common.loop_watch import LoopWatch


def node_host() -> str:
    """The address other pools reach this actor at (the Ray node's IP; 127.0.0.1 locally)."""
    return str(ray.util.get_node_ip_address())


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def limit_threads(cpus: float) -> None:
    """One torch thread per CPU the actor asked for: pools share the machine's cores.

    Torch is not imported for this: a rule-reward replica never needs it, and importing it costs seconds of
    CPU that the pools' start shares; a process that imports it later reads the variable."""
    threads = max(1, int(cpus))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A pool's start with Python's cyclic garbage collector off, then what it built frozen out of the
    collector's scans. Importing torch and transformers and loading a model make hundreds of thousands of
    long-lived objects and little garbage: the full scans the collector would make of them as they grow
    cost CPU in each such process's start for nothing, and so would every full scan after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


class ServerActor:
    """A pool replica that hosts one gRPC server in its Ray worker process."""

    def __init__(self, config_json: str, cpus: float, index: int) -> None:
        limit_threads(cpus)
        self.config_json = config_json
        self.index = index
        self.server: Any = None
        self.servicer: Any = None
        self.loop_watch = LoopWatch(self.blocking_suspects)

    async def start(self) -> str:
        """Start the replica's server (`serve`, the pool's own); its address. The loop watch starts first, so
        that a user function blocking the loop from the first request on is measured."""
        self.loop_watch.start()
        return await self.serve()

    async def serve(self) -> str:
        raise NotImplementedError

    def blocking_suspects(self) -> list[str]:
        """The user's async functions this replica runs on its event loop (see LoopWatch); none by default."""
        return []

    def loop_blocked(self) -> str:
        """The newest report of this replica's event loop blocked past LoopWatch's threshold, once ('' if none);
        the supervisor asks with its pings and puts it in the run's log and status."""
        return self.loop_watch.report()

    def pod_name(self) -> str:
        """The Kubernetes pod this replica runs in (the operator deletes a drained reward pod); '' locally."""
        return os.environ.get("POD_NAME", "")

    def pid(self) -> int:
        """This replica's process, for fault injection: a SIGKILL ends it at once, where ray.kill takes a while."""
        return os.getpid()
