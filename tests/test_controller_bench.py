"""benchmarks/controller: the driver's controller moving samples between null replicas over real gRPC."""

from __future__ import annotations

import asyncio

from conftest import REPO, load_script


def test_capacity_counts_every_sample_the_controller_moved() -> None:
    bench = load_script(REPO / "benchmarks" / "controller" / "run.py", "bench_controller")
    result = asyncio.run(bench.measure(steps=4, group_size=4, prompts_per_step=8, max_staleness=1, warmup=2))
    assert result.samples == 4 * 4 * 8, "each measured step trains its whole batch"
    assert result.seconds > 0 and result.controller_cpu_seconds > 0
    assert result.per_second == result.samples / result.seconds
