"""The suite's leftover check (tests/leftovers.py), on a suite written to leak: pytest run on it in a
fresh process fails, naming each thing left and the test that left it; the same suite that stops what it
starts passes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

HERE = Path(__file__).parent

LEAKY = """
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

STOP = threading.Event()
PIDS = Path(__file__).with_name("pids")


def test_a_thread_left_running():
    threading.Thread(target=STOP.wait, name="forgotten-worker", daemon=True).start()


def test_a_server_left_listening():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    test_a_server_left_listening.server = server  # kept open


def test_a_process_left_running():
    time.sleep(0.05)  # a tick of the kernel's process clock apart from the test before
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    PIDS.write_text(str(child.pid))


def test_that_stops_what_it_starts():
    thread = threading.Thread(target=time.sleep, args=(0.1,))
    thread.start()
    thread.join()
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("leftovers",)\n')
    (tmp_path / "test_suite.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["RLJOB_LEFTOVER_GRACE_SECONDS"] = "1"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        str(tmp_path),
    ]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_suite_that_leaks_fails_naming_each_leftover_and_its_test(tmp_path: Path) -> None:
    try:
        done = _run(tmp_path, LEAKY)
    finally:
        pids = tmp_path / "pids"
        if pids.exists():
            pid = int(pids.read_text())
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "4 passed, 1 error" in out, out
    assert "thread 'forgotten-worker' (Event.wait), first seen after test_suite.py::test_a_thread_left_running" in out
    assert (
        "first seen after test_suite.py::test_a_server_left_listening" in out and "listening socket 127.0.0.1:" in out
    )
    assert "import time; time.sleep(600)), started by test_suite.py::test_a_process_left_running" in out, out


def test_a_suite_that_stops_what_it_starts_passes(tmp_path: Path) -> None:
    clean = LEAKY.split("def test_a_thread_left_running")[0] + "def test_that" + LEAKY.split("def test_that")[1]
    done = _run(tmp_path, clean)
    assert done.returncode == 0, done.stdout + done.stderr
