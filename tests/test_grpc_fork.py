"""Ray starts each of its daemons with `Popen(preexec_fn=...)`, a plain fork: gRPC core's fork handlers
then run in the child, restart gRPC's threads there, and those abort the child before it execs when
its pollers' descriptors close. A daemon forked while this process is busy with gRPC died unseen: CI
saw Ray nodes whose raylet or GCS never wrote a line. Here children are forked the way Ray forks them,
beside a live stream and calls, from a process set up as the `rljob` command sets itself up, and every one
must reach its program. (The same forks from pytest's own process, set up by conftest, showed the same at
ten times the cost: forking a process that holds torch takes a tenth of a second a fork.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc  # the subprocess test imports this module only after the command's set-up
import pytest

pytestmark = [pytest.mark.slow]

FORKS = 500  # 1-5% of forks died before the fix: none of 500 dying by chance is under 1e-4


def _serve_busily(stop: threading.Event) -> tuple[grpc.Server, list[threading.Thread]]:
    """A gRPC server in this process, two clients calling it in a loop and two streams flowing, until `stop`."""

    def echo_stream(requests: Iterator[bytes], _context: object) -> Iterator[bytes]:
        yield from requests

    server = grpc.server(futures.ThreadPoolExecutor(4))
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(lambda request, _context: request),
        "Stream": grpc.stream_stream_rpc_method_handler(echo_stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    flowing = threading.Barrier(5)  # the four threads' first answers, and this one

    def call() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            echo = channel.unary_unary("/echo/Echo", request_serializer=None, response_deserializer=None)
            echo(b"x")
            flowing.wait()
            while not stop.is_set():
                echo(b"x" * 100)

    def stream() -> None:
        def requests() -> Iterator[bytes]:
            while not stop.is_set():
                yield b"y" * 1000

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream_echo = channel.stream_stream("/echo/Stream", request_serializer=None, response_deserializer=None)
            answers = iter(stream_echo(requests()))
            next(answers)
            flowing.wait()
            for _ in answers:
                pass

    threads = [threading.Thread(target=target, daemon=True) for target in (call, call, stream, stream)]
    for thread in threads:
        thread.start()
    flowing.wait(timeout=30)
    return server, threads


def exit_codes_of_forked_children(forks: int = FORKS) -> Counter[int]:
    """`/bin/true` started `forks` times as Ray starts a daemon while gRPC is busy here: its exit codes."""
    stop = threading.Event()
    server, threads = _serve_busily(stop)
    codes: Counter[int] = Counter()
    try:
        for _ in range(forks):
            child = subprocess.Popen(["/bin/true"], preexec_fn=lambda: None, stdout=subprocess.DEVNULL)
            codes[child.wait(timeout=60)] += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        server.stop(None)
    return codes


def test_the_rljob_command_makes_its_process_safe_to_fork_before_grpc_loads():
    """`rljob run` starts Ray's daemons from the driver; the command's set-up must come before grpc's
    first import, which reads the setting once."""
    script = (
        "from rljob_workers.driver import cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "import test_grpc_fork\n"
        "print(dict(test_grpc_fork.exit_codes_of_forked_children()))\n"
    )
    tests = Path(__file__).resolve().parent
    env = {name: value for name, value in os.environ.items() if name != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tests, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == str({0: FORKS}), done.stdout[-2000:] + done.stderr[-2000:]
