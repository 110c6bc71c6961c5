"""The suite's leftover check: every test stops what it starts.

At the end of the session (after every fixture is torn down, session-scoped ones too) nothing may be
left that a test started: a Python thread, a process (a child of this one, or any process carrying this
session's mark in its environment, so that daemons which left their parent are found too), a socket
this process listens on, a network namespace or a mount. What is left fails the suite as an error at
the teardown of its last test, each leftover named with the test after which it was first seen.

Things wind down on their own for a moment after their owner stopped them (a daemon thread's last
loop, a process reaping its children), so the end waits up to GRACE_SECONDS for them to go first.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

# Inherited by every process a test starts (unless it is given a fresh environment): how a process that
# outlived its parent is still known as this session's. Each pytest process (an xdist worker too) marks
# its own, so one worker never counts another's processes.
MARK = "RLJOB_TEST_SESSION"
GRACE_SECONDS = float(os.environ.get("RLJOB_LEFTOVER_GRACE_SECONDS", "15"))
# A library's helper for the whole process, one at most, started on first use and ended with the process:
# nothing a test started, and nothing a test can stop.
PROCESS_WIDE = (
    "thread 'tqdm_monitor'",  # tqdm's monitor, from the first progress bar (transformers' loading bars)
    "multiprocessing.resource_tracker",  # the resource tracker, from the first spawned child (torch DDP)
)
NETNS = Path("/run/netns")
# e2e/node-host.sh's CGROUP_ROOT: a process there is a container of the real node, which carries no mark; one
# still there at the end outlived the node's stop.
NODE_CGROUP = "/rljob-e2e/"


def _boot_clock() -> float:
    """Seconds since boot: the clock of a process's start time in /proc/PID/stat."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _threads() -> set[str]:
    return {
        f"thread {t.name!r} ({getattr(getattr(t, '_target', None), '__qualname__', type(t).__qualname__)})"
        for t in threading.enumerate()
        if t is not threading.main_thread()
    }


def _listening() -> set[str]:
    try:
        connections = psutil.Process().net_connections(kind="inet")
    except psutil.Error:
        return set()
    return {f"listening socket {c.laddr.ip}:{c.laddr.port}" for c in connections if c.status == psutil.CONN_LISTEN}


def _network_namespaces() -> set[str]:
    return {f"network namespace {p.name}" for p in NETNS.iterdir()} if NETNS.is_dir() else set()


def _mounts() -> set[str]:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    # /run/netns itself is iproute2's: the first `ip netns add` on a machine makes it a shared mount point, kept for
    # every later namespace (`ip netns delete` leaves it); it holds nothing. The namespaces under it do count.
    return {f"mount {point}" for point in (line.split()[4] for line in lines) if point != str(NETNS)}


def _in_node_cgroup(pid: int) -> bool:
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    return any(line.split(":", 2)[-1].startswith(NODE_CGROUP) for line in lines)


def _node_processes() -> set[int]:
    return {p.pid for p in psutil.process_iter() if _in_node_cgroup(p.pid)}


def _describe(process: psutil.Process) -> str:
    try:
        command = " ".join(process.cmdline())[:160] or process.name()
    except psutil.Error:
        command = "?"
    return f"process {process.pid} ({command})"


@dataclass
class Leftovers:
    """What exists at the session's start, and when each thing a test started was first seen."""

    mark: str
    baseline: set[str] = field(default_factory=set)
    node_baseline: set[int] = field(default_factory=set)  # the real node's processes before the session
    first_seen: dict[str, str] = field(default_factory=dict)  # leftover -> the test after which it was seen
    # (start, end, test id) of each test, setup to teardown, on the clock of process start times
    windows: list[tuple[float, float, str]] = field(default_factory=list)

    @classmethod
    def begin(cls) -> Leftovers:
        mark = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.environ[MARK] = mark
        leftovers = cls(mark)
        leftovers.baseline = leftovers.resources()
        leftovers.node_baseline = _node_processes()
        return leftovers

    def resources(self) -> set[str]:
        """Threads, sockets, namespaces and mounts: cheap to read after every test. A pytest-xdist worker
        shares the machine with another, whose namespaces and mounts it would take for its own: those are
        left to a run alone (`make test` runs the tests that make them, the `serial` ones, that way)."""
        found = _threads() | _listening()
        if "PYTEST_XDIST_WORKER" not in os.environ:
            found |= _network_namespaces() | _mounts()
        return found

    def processes(self) -> dict[str, psutil.Process]:
        """This session's live processes: its descendants, every process that carries its mark, and (run alone)
        every process in the real node's cgroups."""
        me = psutil.Process()
        found = {p.pid: p for p in me.children(recursive=True)}
        for process in psutil.process_iter():
            if process.pid in found or process.pid == me.pid:
                continue
            try:
                if process.environ().get(MARK) == self.mark:
                    found[process.pid] = process
            except psutil.Error:  # gone, a zombie, or not ours to read
                continue
        if "PYTEST_XDIST_WORKER" not in os.environ:  # the real node's tests run alone (`make test`'s node phase)
            for pid in _node_processes() - self.node_baseline - set(found):
                with contextlib.suppress(psutil.Error):  # gone meanwhile
                    found[pid] = psutil.Process(pid)
        alive = {}
        for process in found.values():
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive[_describe(process)] = process
            except psutil.Error:
                continue
        return alive

    def after_test(self, test: str, begun: float) -> None:
        self.windows.append((begun, _boot_clock(), test))
        for thing in self.resources() - self.baseline:
            self.first_seen.setdefault(thing, test)

    def started_in(self, process: psutil.Process) -> str:
        """The test that ran when `process` started (on the kernel's clock of process start times)."""
        try:
            stat = Path(f"/proc/{process.pid}/stat").read_text()
            started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return "?"
        # The kernel counts in ticks (10 ms): a start in a tick that two short tests shared names both.
        tick = 1 / os.sysconf("SC_CLK_TCK")
        tests = [test for begun, end, test in self.windows if begun <= started + tick and started <= end]
        return " or ".join(tests) or "no test (it started outside every test)"

    def left(self) -> list[str]:
        """What is still there, waiting up to GRACE_SECONDS for it to go: one line each, with its test."""
        gc.collect()  # a server or channel no test holds any more, in a reference cycle, goes now
        deadline = time.monotonic() + GRACE_SECONDS
        things, processes = self._started_here()
        while (things or processes) and time.monotonic() < deadline:
            time.sleep(0.25)
            things, processes = self._started_here()
        lines = [f"{thing}, first seen after {self.first_seen.get(thing, 'the last test')}" for thing in sorted(things)]
        lines += [f"{name}, started by {self.started_in(process)}" for name, process in sorted(processes.items())]
        return lines

    def _started_here(self) -> tuple[set[str], dict[str, psutil.Process]]:
        """What the session started and has not stopped, but for the libraries' process-wide helpers."""
        things = {thing for thing in self.resources() - self.baseline if not thing.startswith(PROCESS_WIDE)}
        processes = {name: p for name, p in self.processes().items() if not any(w in name for w in PROCESS_WIDE)}
        return things, processes


_session: Leftovers | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session
    _session = Leftovers.begin()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    begun = _boot_clock()
    yield
    if _session is not None:
        _session.after_test(item.nodeid, begun)


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Set up before every other fixture of the session, so torn down after all of them."""
    yield
    if _session is None:
        return
    left = _session.left()
    if left:
        pytest.fail("the tests left these running (every test must stop what it starts):\n  " + "\n  ".join(left))
