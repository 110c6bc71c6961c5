"""Two gloo ranks in spawned processes, as the trainer's Ray actors are: each joins the group, runs the
test's body, and ends the way Ray ends an actor (ray.kill): the process exits, with no interpreter teardown.

Why not a plain return: at interpreter teardown a rank's gloo threads may still hold work, and taking the
GIL then aborts the process ("terminate called without an active exception", exit -6). CI saw it once,
on a rank that had written its results and passed the final barrier; the product never tears a trainer
down that way, so the tests should not either.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import torch

# A short collective timeout: ranks whose collectives do not pair up fail instead of waiting 30 minutes.
COLLECTIVE_TIMEOUT = timedelta(seconds=60)


def join_group(rank: int, port: int) -> None:
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=COLLECTIVE_TIMEOUT
    )


def end_rank() -> NoReturn:
    """Both ranks have written what they return; the barrier says so before either goes."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_two_ranks(target: Callable[..., None], args: tuple[Any, ...], timeout_seconds: float) -> None:
    """`target(rank, port, *args)` on ranks 0 and 1; a rank still running after the timeout fails the
    test rather than blocking it, and so does one that ends other than through `end_rank`."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, port, *args)) for rank in (0, 1)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_seconds
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0.0))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} still running after {timeout_seconds}s"
    assert [p.exitcode for p in procs] == [0, 0]
