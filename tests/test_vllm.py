"""vLLM's CPU build as the rollout engine, run for real in its own environment (envs/vllm.sh builds it;
`.ci/run` does, cached by the content hash of its pins).

The adapter's checks run in that environment (tests/vllm_probe.py, one engine for all of them): it samples
what the policy gives, new weights reach its worker process through the weight group and no KV of the old
version serves the new one, a pulled version loads in the worker, an update in flight pauses and resumes the
running samples, and a sync with nobody sending fails within its timeout. Skips name what is missing where
vLLM's environment is not built.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from tiny_models import char_llama

VLLM_ENV = REPO / "envs" / "vllm.sh"
PROBE = Path(__file__).with_name("vllm_probe.py")
# fp32 on both sides: what the engine's log-probs and a transformers forward of the same weights may differ by
LOGPROB_TOLERANCE = 1e-4


def vllm_python() -> str | None:
    """The interpreter of vLLM's environment, if envs/vllm.sh has built it."""
    if subprocess.run(["bash", str(VLLM_ENV), "check"], capture_output=True).returncode != 0:
        return None
    return subprocess.run(["bash", str(VLLM_ENV), "path"], capture_output=True, text=True, check=True).stdout.strip()


VLLM_PYTHON = vllm_python()
pytestmark = pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM's environment is not built: run envs/vllm.sh")


def rljob_path() -> str:
    """rljob's source folders, for an interpreter of another environment (as `rljob run` passes them)."""
    return os.pathsep.join(str(REPO / folder) for folder in ("api", "workers", "proto/gen"))


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What tests/vllm_probe.py measured, on a random tiny Llama with tied embeddings (vLLM reloads its output
    layer specially) that never ends a sample early (long samples for the update in flight)."""
    model = char_llama(tmp_path_factory.mktemp("vllm") / "model", heads=2, tied=True, eos_bias=-20.0)
    assert VLLM_PYTHON is not None
    env = {**os.environ, "PYTHONPATH": rljob_path()}
    done = subprocess.run(
        [VLLM_PYTHON, str(PROBE), str(model)], capture_output=True, text=True, timeout=900, env=env, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-5000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(found, indent=1))
    return found


def test_the_engine_samples_what_the_policy_gives(probe: dict[str, Any]) -> None:
    assert probe["weight_ranks"] == 1
    assert probe["gap_version_0"] <= LOGPROB_TOLERANCE, probe


def test_new_weights_reach_the_worker_through_the_group_and_no_old_kv_serves_them(probe: dict[str, Any]) -> None:
    """The bytes arrive in vLLM's worker process, counted there, not in this or the server's; the same prompts
    generated again (their KV cached under the old version) follow the new weights, not the old."""
    [worker] = probe["worker_counters"]
    assert worker["pid"] != probe["probe_pid"], "the weights were received by the server's process"
    assert worker["rank"] == 1 and worker["loads"] == 1
    assert worker["bytes_received"] == probe["bytes_sent"] == probe["bytes_received"], probe
    assert worker["buckets_received"] >= 2  # the plan's several buckets, each its own broadcast
    assert probe["gap_version_1"] <= LOGPROB_TOLERANCE, probe
    assert probe["gap_to_version_0"] > 0.1, "version 1 looks like version 0: the update changed nothing"
    assert probe["versions_version_1"] == [[1, 1]]


def test_a_version_pulled_by_the_server_loads_in_the_worker(probe: dict[str, Any]) -> None:
    assert probe["gap_version_2"] <= LOGPROB_TOLERANCE, probe


def test_an_update_in_flight_pauses_the_running_samples_and_they_span_both_versions(probe: dict[str, Any]) -> None:
    """Samples running when version 3 came carry the first and last versions they span; each token's log-prob is
    the one the version that sampled it gives (the old one up to some token, the new one from there)."""
    assert [2, 3] in probe["inflight_versions"], probe["inflight_versions"]
    assert max(probe["inflight_split_gaps"]) <= LOGPROB_TOLERANCE, probe["inflight_split_gaps"]
    assert probe["inflight_update_seconds"] < 10, probe


def test_a_sync_that_cannot_finish_fails_within_its_timeout(probe: dict[str, Any]) -> None:
    assert probe["timeout_error"], "a broadcast nobody sent was taken"
    assert 2.5 <= probe["timeout_seconds"] < 20, probe
