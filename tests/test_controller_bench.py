"""benchmarks/controller: the driver's controller moving samples between null replicas over real gRPC."""

from __future__ import annotations

import asyncio

import pytest

from conftest import REPO, load_script

pytestmark = [pytest.mark.slow]


@pytest.mark.parametrize("per_message", [1, 0], ids=["one-per-message", "batched"])
def test_capacity_counts_every_sample_the_controller_moved(per_message: int) -> None:
    bench = load_script(REPO / "benchmarks" / "controller" / "run.py", "bench_controller")
    shape = {"steps": 4, "group_size": 4, "prompts_per_step": 8, "max_staleness": 1, "warmup": 2}
    result = asyncio.run(bench.measure(**shape, per_message=per_message))
    assert result.samples == 4 * 4 * 8, "each measured step trains its whole batch"
    assert result.seconds > 0 and result.controller_cpu_seconds > 0 and result.replicas_cpu_seconds > 0
    assert result.per_second == result.samples / result.seconds
