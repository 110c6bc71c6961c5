"""The suite's leftover check (tests/leftovers.py), on a suite written to leak: pytest run on it in a
fresh process fails, naming each thing left and the test that left it; the same suite that stops what it
starts passes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

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


NETNS_SUITE = """
import os
import subprocess


def test_a_namespace_made_and_deleted():
    name = f"rljob-leftover-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "delete", name], check=True)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"), reason="needs root, ip and unshare"
)
def test_the_first_network_namespace_of_a_machine_leaves_nothing_counted(tmp_path: Path) -> None:
    """On a fresh machine the first `ip netns add` makes /run/netns a mount point, which stays: iproute2's, not
    the test's (CI on a fresh machine failed on it). Shown in a mount namespace of its own where /run/netns is
    not mounted yet, as on that machine."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ("leftovers",)\n')
    (tmp_path / "test_suite.py").write_text(NETNS_SUITE)
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env["RLJOB_LEFTOVER_GRACE_SECONDS"] = "1"
    pytest_run = f"{sys.executable} -m pytest -q -p no:cacheprovider --rootdir {tmp_path} {tmp_path}"
    fresh = f"umount -l /run/netns 2>/dev/null; ! grep -q ' /run/netns ' /proc/self/mountinfo && {pytest_run}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", fresh],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
