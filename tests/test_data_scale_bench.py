"""benchmarks/data_scale/run.py as it runs (#54): the same `rljob run` on 1,000 and on 1,000,000 rows; the
million-row driver grows by less than 200 MB and starts training in less than twice the time (both printed).
Serial: the start-up times are measured on an otherwise quiet machine."""

from __future__ import annotations

import pytest

from conftest import REPO, load_script

pytestmark = [pytest.mark.serial, pytest.mark.ray, pytest.mark.timeout(900)]


def test_a_million_rows_start_like_a_thousand() -> None:
    bench = load_script(REPO / "benchmarks" / "data_scale" / "run.py", "bench_data_scale")
    small, large = bench.main([])
    assert (small.rows, large.rows) == (1_000, 1_000_000)
    assert large.peak_mb - small.peak_mb < 200, (small, large)
    assert large.first_step_seconds < 2 * small.first_step_seconds, (small, large)
