"""e2e/state.sh's process bookkeeping, run by bash as cluster.sh and node.sh run it: a component
that `launch_exe` has just started counts as running (`pid_of`), however slowly it reaches exec."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"


def _bash(state: Path, script: str) -> subprocess.CompletedProcess[str]:
    # from a file, as the scripts run: with `bash -c`, bash's own command line would hold the script
    prelude = f'set -euo pipefail; . "{E2E}/lib.sh"; . "{E2E}/state.sh"; mkdir -p "$LOGS" "$PIDS"\n'
    path = state.parent / "script.sh"
    path.write_text(prelude + script)
    env = {**os.environ, "RLJOB_E2E_STATE": str(state), "RLJOB_E2E_TIMEOUT": "20"}
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)


def test_a_component_counts_as_running_from_the_moment_launch_returns(tmp_path: Path) -> None:
    # The child opens its log before it execs the component. Make that open slow (a FIFO that
    # a reader opens 1 s later), as a loaded machine makes the fork-to-exec gap slow: before
    # launch_exe waited for the exec, pid_of saw bash's command line, and cluster.sh reported
    # "kuberay-operator exited" with an empty log (CI, stop 28).
    state = tmp_path / "state"
    script = """
mkfifo "$LOGS/demo.log"
( sleep 1; cat "$LOGS/demo.log" ) >/dev/null 2>&1 &
trap 'kill -- "-$(cat "$PIDS/demo.pid")" 2>/dev/null || true' EXIT
launch_exe demo /bin/sleep 30
pid_of demo || { echo "pid_of: demo not running"; exit 3; }
stop_all demo
"""
    t0 = time.monotonic()
    out = _bash(state, script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert time.monotonic() - t0 >= 1.0  # it did wait for the exec
    assert "demo (pid" in out.stderr and "stopped" in out.stderr


def test_a_component_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    state = tmp_path / "state"
    script = """
launch_exe demo /bin/sh -c 'echo "no config"; exit 1'
sleep 0.5
alive demo
"""
    out = _bash(state, script)
    assert out.returncode == 1
    assert "demo exited (exit status 1); see" in out.stderr and "no config" in out.stderr


def test_a_component_killed_with_an_empty_log_is_reported_with_its_signal(tmp_path: Path) -> None:
    """CI once found kube-controller-manager gone at once, its log empty: the error says how it ended."""
    state = tmp_path / "state"
    script = """
launch_exe demo /bin/sleep 30
kill -KILL "$(cat "${PIDS}/demo.pid")"
sleep 0.5
alive demo
"""
    out = _bash(state, script)
    assert out.returncode == 1
    assert "demo exited (exit status 137); see" in out.stderr, out.stderr
