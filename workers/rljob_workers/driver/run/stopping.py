"""One way to stop a run: SIGINT (Ctrl-C) and SIGTERM (what Kubernetes sends a pod).

The first signal asks the run to stop: generation ends, the step in progress is finished (if it
is training) or dropped (if it is still gathering samples), a checkpoint is written and the
summary printed with the command that resumes. A second signal, or `--stop-timeout` seconds
without an end, stops at once. The exit code is 128 + the signal's number (130, 143), as a
shell reports a process the signal ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

from rljob_workers.driver.errors import StoppedBeforePoolsUp

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class SignalStop:
    """Turns the signals into a graceful stop, then into an immediate one."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.signal: signal.Signals | None = None
        self.hard = False  # stopped at once: nothing more is waited for
        self._task: asyncio.Task[object] | None = None
        self._request: Callable[[str], bool] = lambda name: False

    def install(self, request_stop: Callable[[str], bool]) -> None:
        """Handle the signals in this task's loop; `request_stop(name)` starts a graceful stop and
        says whether it could (False: nothing to save yet, so stop at once)."""
        self._task = asyncio.current_task()
        self._request = request_stop
        if not self._owned():
            return  # a run driven from another thread (a test, a benchmark): signals belong to the main one
        for sig in SIGNALS:
            asyncio.get_running_loop().add_signal_handler(sig, self._received, sig)

    def uninstall(self) -> None:
        if self._owned():
            for sig in SIGNALS:
                asyncio.get_running_loop().remove_signal_handler(sig)

    @staticmethod
    def _owned() -> bool:
        return threading.current_thread() is threading.main_thread()

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signal) if self.signal is not None else 0

    def _received(self, sig: int) -> None:
        if self.signal is not None:
            self._now(f"{signal.Signals(sig).name} again")
            return
        self.signal = signal.Signals(sig)
        name = self.signal.name
        if not self._request(name):
            self._now(f"{name} before the pools were up")
            return
        print(
            f"\n{name}: stopping; the step in progress is finished or dropped, then a checkpoint is written "
            f"(at most {self.timeout:g}s); {name} again stops at once",
            file=sys.stderr,
            flush=True,
        )
        asyncio.get_running_loop().call_later(self.timeout, self._now, f"--stop-timeout {self.timeout:g}s passed")

    def _now(self, why: str) -> None:
        if self.hard:
            return
        self.hard = True
        print(f"{why}: stopping at once", file=sys.stderr, flush=True)
        if self._task is not None:
            self._task.cancel()


@contextlib.contextmanager
def stop_before_the_pools_are_up() -> Iterator[None]:
    """SIGINT and SIGTERM raise StoppedBeforePoolsUp in this (the main) thread until a run session puts
    its own handlers in: otherwise SIGINT prints a traceback out of ray.init, SIGTERM ends the driver
    without a word, and either leaves Ray's agents running."""

    def stop(sig: int, frame: object) -> None:
        raise StoppedBeforePoolsUp(sig)

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
