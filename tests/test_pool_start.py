"""A pool's start (torch, transformers and a model in one process) with the garbage collector paused:
its full scans of the objects those imports make took 0.8 CPU-seconds of each such process's start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# In a fresh process: load the shipped example's model as a rollout replica does, inside
# `collector_paused` or not, then report the full collections made and the collector's state after.
LOAD = """
import gc, json, sys, time
from rljob_workers.common.actor import collector_paused
full = []
gc.callbacks.append(lambda phase, info: full.append(1) if phase == "stop" and info["generation"] == 2 else None)
def load():
    from transformers import AutoModelForCausalLM
    AutoModelForCausalLM.from_pretrained(sys.argv[2])
cpu = time.process_time()
if sys.argv[1] == "paused":
    with collector_paused():
        load()
else:
    load()
print(json.dumps({"full_collections": len(full), "cpu": time.process_time() - cpu,
                  "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def _load(mode: str, model: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", LOAD, mode, str(model)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_pool_loads_its_model_without_the_collectors_full_scans_and_freezes_what_it_built(assets):
    plain, paused = _load("plain", assets / "model"), _load("paused", assets / "model")
    print(
        f"model load: {plain['full_collections']} full collections, {plain['cpu']:.2f} CPU-s; "
        f"paused: {paused['full_collections']}, {paused['cpu']:.2f} CPU-s"
    )
    assert plain["full_collections"] >= 2  # what the pause saves
    assert paused["full_collections"] == 0
    assert paused["enabled"] and paused["frozen"] > 100_000  # on again, with what it built left out of its scans
