"""The user's sync functions run in daemon threads: a function that never returns cannot hold its replica's
process at exit (a reward replica whose rule slept for ever outlived `rljob run`, joined by the standard
library's pool at interpreter exit); results, errors and cancellation behave as ThreadPoolExecutor's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from rljob_workers.common import daemon_pool
from rljob_workers.common.daemon_pool import DaemonThreadPool

EXITS = """
import time
from concurrent.futures import ThreadPoolExecutor
from rljob_workers.common.daemon_pool import DaemonThreadPool

pool = {pool}
pool.submit(time.sleep, 3600)  # a rule that never returns
time.sleep(0.2)
pool.shutdown(wait=False, cancel_futures=True)  # what a replica's stop does
"""


@pytest.mark.parametrize(("pool", "exits"), [("DaemonThreadPool(2)", True), ("ThreadPoolExecutor(2)", False)])
def test_a_function_that_never_returns_does_not_hold_the_process_at_exit(pool: str, exits: bool) -> None:
    """The standard pool, beside it, is what held the replica: its process waits for the thread."""
    script = textwrap.dedent(EXITS.format(pool=pool))
    with subprocess.Popen([sys.executable, "-c", script]) as process:
        try:
            process.wait(timeout=15)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False
            process.kill()
    assert exited is exits


def test_results_errors_and_idle_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon_pool, "IDLE_SECONDS", 0.3)
    pool = DaemonThreadPool(2, thread_name_prefix="test-pool")
    assert [f.result(5) for f in [pool.submit(pow, 2, n) for n in range(8)]] == [2**n for n in range(8)]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(5)
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test-pool"))
    assert len([t for t in threading.enumerate() if t.name.startswith("test-pool")]) <= 2
    deadline = time.monotonic() + 5
    while any(t.name.startswith("test-pool") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("test-pool")], "idle threads stay"
    assert pool.submit(abs, -3).result(5) == 3  # a new thread for new work
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(abs, 1)
