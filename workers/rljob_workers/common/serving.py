"""What every helper that serves a user's code for a job shares once its server is up (`serve_function`,
`serve_environment`, and the helpers to come): the start-up line with what its lock asks of callers, then
serving until SIGINT or SIGTERM, draining, and stopping."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

from rljob_workers.common.grpc_server import RunningServer
from rljob_workers.common.server_lock import LoadedLock


async def serve_until_signalled(
    running: RunningServer, line: str, lock: LoadedLock, drain: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Print `line` (its address last: scripts read it) and the lock's summary, serve until SIGINT or SIGTERM,
    then `drain` (work in flight is answered) and stop the server."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
            loop.add_signal_handler(signum, stop.set)
    print(f"{line}\n  {lock.summary}", flush=True)
    try:
        await stop.wait()
        await running.set_serving(False)
        if drain is not None:
            await drain()
    finally:
        await running.stop(grace=1.0)
