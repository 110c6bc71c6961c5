"""CPU cost per sample of the reward plane's transport: one reward replica and the router.

A reward replica (`serve_function` over an async rule that only sleeps, so its own work is
nil) runs in a child process; this process drives it through `RewardRouter`, the controller's
client, with `--concurrency` samples in flight. Reported: CPU microseconds per sample in the
replica and in the router's process, and samples per second. On a small machine this CPU is
taken from training and generation, so it is what the reward plane costs a job beyond the
reward functions themselves.

    python benchmarks/reward_overhead/run.py [--samples 20000] [--concurrency 128] [--sleep-ms 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rljob.v1 import sample_pb2
from rljob_workers.driver.pools.reward.router import RewardRouter


@dataclass(frozen=True)
class Overhead:
    samples: int
    seconds: float
    replica_us_per_sample: float
    router_us_per_sample: float


def _process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _serve(port: int, sleep_seconds: float) -> None:
    """The child: a reward replica whose rule only waits (its own CPU is nil)."""
    from rljob_workers.reward.server import serve_function

    async def judge(prompt: str, completion: str, answer: str) -> float:
        await asyncio.sleep(sleep_seconds)
        return float(completion.strip() == answer)

    serve_function(judge, name="overhead", port=port, host="127.0.0.1", max_in_flight=1 << 16)


def _sample(i: int) -> sample_pb2.RewardSample:
    sample = sample_pb2.RewardSample(
        sample_id=f"p{i // 8}/{i % 8}",
        prompt_id=f"p{i // 8}",
        prompt="12+30=",
        completion="42",
        token_ids=[5, 6, 7, 2],
        policy_version=3,
    )
    sample.fields["answer"] = "42"
    return sample


async def measure(samples: int, concurrency: int, sleep_seconds: float, warmup: int = 500) -> Overhead:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--sleep-ms", str(1000 * sleep_seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    router = RewardRouter()
    try:
        assert child.stdout is not None
        child.stdout.readline()  # "reward 'overhead' serving on ..."
        await router.add_replica("r0", f"127.0.0.1:{port}", max_in_flight=concurrency)
        slots = asyncio.Semaphore(concurrency)

        async def score(i: int) -> None:
            async with slots:
                result = await router.score(_sample(i))
            if result.HasField("error"):
                raise RuntimeError(f"sample {result.sample_id}: {result.error.message}")

        await asyncio.gather(*(score(i) for i in range(warmup)))
        replica0, router0, started = _process_cpu_seconds(child.pid), _own_cpu_seconds(), time.monotonic()
        await asyncio.gather(*(score(i) for i in range(warmup, warmup + samples)))
        replica1, router1, ended = _process_cpu_seconds(child.pid), _own_cpu_seconds(), time.monotonic()
    finally:
        await router.close()
        child.terminate()
        child.wait()
    return Overhead(
        samples=samples,
        seconds=ended - started,
        replica_us_per_sample=1e6 * (replica1 - replica0) / samples,
        router_us_per_sample=1e6 * (router1 - router0) / samples,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=128, help="samples in flight")
    parser.add_argument("--sleep-ms", type=float, default=50.0, help="the rule's wait per sample")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # internal: be the replica
    args = parser.parse_args(argv)
    if args.serve is not None:
        _serve(args.serve, args.sleep_ms / 1000)
        return 0
    result = asyncio.run(measure(args.samples, args.concurrency, args.sleep_ms / 1000))
    print(
        f"{result.samples} samples, {args.concurrency} in flight, in {result.seconds:.2f} s "
        f"({result.samples / result.seconds:.0f}/s): replica {result.replica_us_per_sample:.0f} µs CPU per sample, "
        f"router {result.router_us_per_sample:.0f} µs CPU per sample"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
