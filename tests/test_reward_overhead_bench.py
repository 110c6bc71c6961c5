"""benchmarks/reward_overhead: a short real run against a reward replica in a child process."""

from __future__ import annotations

import asyncio

from conftest import REPO, load_script


def test_overhead_measures_both_sides_of_a_real_replica() -> None:
    bench = load_script(REPO / "benchmarks" / "reward_overhead" / "run.py", "bench_reward_overhead")
    result = asyncio.run(bench.measure(samples=400, concurrency=32, sleep_seconds=0.005, warmup=50))
    assert result.samples == 400
    # 400 samples at 32 in flight and 5 ms each: at least 12 rounds of the rule's wait.
    assert result.seconds >= 12 * 0.005
    assert result.replica_us_per_sample > 0 and result.router_us_per_sample > 0
