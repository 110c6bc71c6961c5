"""benchmarks/hf_engine/run.py, run small: the engine's log-probs cost about what plain `generate` holds,
where keeping every step's logits (the engine's old way) grows with tokens x vocabulary. The speed is
printed, not asserted: on a shared 2-core machine it moves with the load (see benchmarks/README.md's figures)."""

from __future__ import annotations

import pytest

from conftest import REPO, load_script

pytestmark = [pytest.mark.serial, pytest.mark.slow]


def test_engine_logprobs_hold_about_what_plain_generate_holds(capsys):
    bench = load_script(REPO / "benchmarks" / "hf_engine" / "run.py", "bench_hf_engine")
    results = bench.run_all(batch=8, new_tokens=128, vocab=32000, device="cpu", rounds=1, repeats=1)
    plain, engine, old = (results[v]["peak_bytes"] for v in ("plain", "engine", "all-logits"))
    speed = results["plain"]["seconds"] / results["engine"]["seconds"]
    print(f"peak MiB: plain {plain / 2**20:.0f}, engine {engine / 2**20:.0f}, all logits {old / 2**20:.0f}; "
          f"engine speed {speed:.2f} of plain")  # fmt: skip
    assert engine <= 1.3 * plain, results
    # the measure sees the difference: 8 x 128 x 32000 fp32 logits are 125 MiB
    assert old - plain > 100 * 2**20, results
