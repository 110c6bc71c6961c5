"""spec.colocate: rollout and trainer on the same GPUs of one machine. The pairing rules (pydantic and their
CEL twins), the memory each of the pair needs of a GPU (docs/gpu-sizing.md's formulas, worked by hand below),
the refusals at the process boundary (`rljob validate --deep --gpu-memory`, `rljob run` without a GPU, the
operator's), and the placement on real Ray: each GPU holds one rollout replica and one trainer rank, and a
replacement replica takes its predecessor's GPU.

No GPU here: Ray is told of two (`num_gpus=2`), which it books as it would real ones; nothing runs CUDA. The
colocated example learning on a real GPU is the GPU machine's check (docs/gpu-sizing.md)."""

from __future__ import annotations

import copy
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api import RLJobInvalid, parse_rljob
from rljob_api.colocate_fit import GIB, colocate_refusal, pair_memory, parse_bytes
from rljob_api.crd import openapi_schema

from conftest import REPO

RLJOB = str(Path(sys.executable).parent / "rljob")


@pytest.fixture
def colocated(example_doc: dict) -> dict:
    """The shipped example on one GPU: one rollout replica and one trainer rank on it."""
    doc = copy.deepcopy(example_doc)
    doc["spec"]["colocate"] = True
    doc["spec"]["rollout"]["gpusPerReplica"] = 1
    doc["spec"]["trainer"]["gpusPerNode"] = 1
    return doc


def test_the_example_on_one_gpu_is_a_valid_colocated_job(colocated: dict) -> None:
    assert parse_rljob(colocated).spec.colocate


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"rollout": {"gpusPerReplica": 0}}, "spec.rollout.gpusPerReplica: 0; colocate puts one rollout replica"),
        ({"trainer": {"gpusPerNode": 0}}, "spec.trainer: colocate needs one trainer node with GPUs"),
        ({"trainer": {"nodes": 2}}, "spec.trainer: colocate needs one trainer node with GPUs"),
        ({"trainer": {"gpusPerNode": 2}}, "spec.rollout.replicas: 1 for 2 trainer GPUs; colocate pairs one replica"),
        ({"weightSync": {"backend": "nccl"}}, "spec.weightSync.backend: nccl refuses two ranks on one GPU"),
    ],
)
def test_a_pair_that_cannot_share_a_gpu_is_refused_naming_the_field(
    colocated: dict, change: dict[str, dict[str, Any]], expected: str
) -> None:
    for section, values in change.items():
        colocated["spec"][section].update(values)
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(colocated)
    assert str(info.value.errors[0]).startswith(expected), info.value.errors


def test_each_rule_has_its_cel_twin() -> None:
    messages = [rule["message"] for rule in openapi_schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("colocate pairs one rollout replica" in m for m in messages)
    assert any("colocate moves weights by gloo" in m for m in messages)
    assert any(m.startswith("colocate ") and "immutable" in m for m in messages), messages


# ---- the memory of the pair, by hand ------------------------------------------------------------------------------

P = 1_000_000_000  # parameters


def test_the_examples_pair_memory_by_hand(colocated: dict) -> None:
    """The example: float32 (4 bytes), ddp on one rank, klCoef 0 (no reference), maxStaleness 1, engine hf.
    trainer = 16P (fp32 weights, grads, AdamW) + (1 + 1) x 4P (a past version + scratch) + 2 x 4P (published)
            = 16e9 + 8e9 + 8e9 = 32e9; rollout (hf) = 2 x 4P (weights + a staged version) = 8e9."""
    need = pair_memory(parse_rljob(colocated).spec, P, 80 * GIB)
    assert (need.trainer, need.rollout) == (32_000_000_000, 8_000_000_000)
    assert need.trainer_terms == (
        "fp32 weights, gradients, AdamW + 1 past version(s) + scratch + published weights (newest + spare)"
    )


def test_an_hf_pair_fits_80_gib_and_not_40(colocated: dict) -> None:
    """40e9 bytes in all: 0.9 x 80 GiB = 77.3e9 holds it; 0.9 x 40 GiB = 38.7e9 does not."""
    spec = parse_rljob(colocated).spec
    assert colocate_refusal(spec, P, 80 * GIB) is None
    refusal = colocate_refusal(spec, P, 40 * GIB)
    assert refusal == (
        "spec.colocate: a 40.00 GiB GPU (90% usable) cannot hold the trainer rank's 29.80 GiB (fp32 weights, "
        "gradients, AdamW + 1 past version(s) + scratch + published weights (newest + spare)) and the rollout "
        "replica's 7.45 GiB (weights + a staged version, before its KV cache) for 1,000,000,000 parameters: "
        "give each pool its own GPU, or train a smaller model"
    )


def test_a_vllm_pair_is_told_the_share_that_fits_and_that_share_fits(colocated: dict) -> None:
    """bfloat16 (2 bytes), klCoef 0.001 (a reference), maxStaleness 0, vllm at 0.85 of an 80 GiB GPU (85.90e9):
    trainer = 16P + 2P (reference) + 2 x 2P (published) = 22e9; rollout = 0.85 x 85.90e9 + 2P (staged) = 75.01e9;
    97.0e9 > 0.9 x 85.90e9 = 77.31e9. The share that fits: (77.31e9 - 22e9 - 2e9) / 85.90e9 = 0.62."""
    spec = colocated["spec"]
    spec["model"]["dtype"] = "bfloat16"
    spec["algorithm"].update(klCoef=0.001, maxStaleness=0)
    spec["rollout"]["engine"] = "vllm"
    spec["weightSync"]["backend"] = "gloo"
    need = pair_memory(parse_rljob(colocated).spec, P, 80 * GIB)
    assert need.trainer == 22_000_000_000
    assert need.rollout == int(0.85 * 80 * GIB) + 2_000_000_000
    refusal = colocate_refusal(parse_rljob(colocated).spec, P, 80 * GIB)
    assert refusal is not None and refusal.endswith(
        "set rollout.gpuMemoryUtilization to 0.62 or less, or give each pool its own GPU"
    ), refusal
    spec["rollout"]["gpuMemoryUtilization"] = 0.62
    assert colocate_refusal(parse_rljob(colocated).spec, P, 80 * GIB) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 << 30), ("24 GB", 24 * 10**9), ("512MiB", 512 << 20), ("1e9", 10**9), ("2Gi", 2 << 30)],
)
def test_sizes_read_as_people_write_them(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


# ---- the refusals at the process boundary --------------------------------------------------------------------------


def _write_job(doc: dict, tmp_path: Path, model: Path) -> Path:
    from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

    doc["spec"]["model"]["path"] = str(model)
    doc["spec"]["data"]["path"] = str(write_jsonl(tmp_path / "train.jsonl", make_problems(64, seed=1)))
    doc["spec"]["data"]["eval"]["path"] = str(write_jsonl(tmp_path / "eval.jsonl", make_problems(8, seed=2)))
    doc["spec"]["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def _rljob(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [RLJOB, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )
    return done, time.monotonic() - started


@pytest.mark.slow  # four runs of `rljob validate --deep`, each importing torch and transformers
def test_validate_deep_checks_the_pair_against_the_gpu_it_is_given(
    colocated: dict, tmp_path: Path, example_model: Path
) -> None:
    """The tiny model's pair needs about 1 MiB: a 1 MiB GPU is refused in one line naming spec.colocate, 16 MiB
    holds it, and without a GPU here or --gpu-memory the check says it was not made."""
    job = _write_job(colocated, tmp_path, example_model)
    small, seconds = _rljob("validate", "--deep", "--gpu-memory", "1MiB", str(job))
    print(f"validate --deep --gpu-memory 1MiB: {seconds:.1f} s: {small.stderr.strip()}")
    assert small.returncode == 1 and "Traceback" not in small.stderr, small.stderr
    assert small.stderr.strip().splitlines() == [small.stderr.strip()]
    assert small.stderr.startswith("spec.colocate: a 1.00 MiB GPU (90% usable) cannot hold the trainer rank's 4.11 MiB")
    fits, _ = _rljob("validate", "--deep", "--gpu-memory", "16MiB", str(job))
    assert fits.returncode == 0 and "valid RLJob 'arithmetic'" in fits.stdout, fits.stderr
    assert "not checked" not in fits.stdout
    unchecked, _ = _rljob("validate", "--deep", str(job))
    assert unchecked.returncode == 0, unchecked.stderr
    assert "spec.colocate: its memory was not checked: no GPU here (--gpu-memory SIZE checks it)" in unchecked.stdout
    bad, _ = _rljob("validate", "--deep", "--gpu-memory", "lots", str(job))
    assert bad.returncode == 2 and "--gpu-memory: 'lots' is not a size" in bad.stderr, bad.stderr


def test_run_without_a_gpu_refuses_a_colocated_job_in_one_line_before_ray(
    colocated: dict, tmp_path: Path, example_model: Path
) -> None:
    job = _write_job(colocated, tmp_path, example_model)
    ray_dir = tmp_path / "ray"  # where Ray would put its session, had it started
    done, seconds = _rljob(
        "run", str(job), "--no-display", "--output", str(tmp_path / "out"), env={"RAY_TMPDIR": str(ray_dir)}
    )
    print(f"rljob run, colocated, no GPU: {seconds:.1f} s: {done.stderr.strip()}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("spec.colocate: no GPU is visible here")
    assert not ray_dir.exists(), "Ray started"


def test_the_operator_refuses_a_colocated_job_naming_the_field(colocated: dict) -> None:
    """On a cluster each pool has its own pods: the operator's parse (what its InvalidSpec event and Failed
    status say) refuses the field."""
    from rljob_operator.reconcile.context import invalid_message, parse_job

    with pytest.raises(RLJobInvalid) as info:
        parse_job({**colocated, "metadata": {"name": "arithmetic", "namespace": "default"}})
    assert invalid_message(info.value).startswith("spec.colocate: shares the GPUs of one machine under `rljob run`")
    colocated["spec"]["colocate"] = False
    assert not parse_job({**colocated, "metadata": {"name": "arithmetic", "namespace": "default"}}).spec.colocate


# ---- the placement on real Ray --------------------------------------------------------------------------------------

# Two GPUs as Ray books them, a colocated job of two replicas and two ranks; each actor reports its GPU. A rollout
# replica killed and replaced: the replacement's GPU. Printed as JSON.
PLACEMENT = textwrap.dedent(
    """
    import asyncio, json, sys
    import ray
    import yaml
    from rljob_api import derive_worker_configs, parse_rljob
    from rljob_workers.driver.placement.launcher import ActorPool, trainer_rank_options
    from rljob_workers.driver.placement.ray_node import shutdown_ray

    @ray.remote
    class Probe:
        def __init__(self, config_json, cpus, index):
            pass

        def start(self):
            return ",".join(str(g) for g in ray.get_gpu_ids())

    async def main():
        configs = derive_worker_configs(parse_rljob(yaml.safe_load(sys.stdin.read())))
        rollout = ActorPool("rollout", Probe, "{}", 0.25, 1)
        group = await rollout.share_gpus_with_trainer(configs, 0.25)
        replicas = dict([await rollout.add(), await rollout.add()])
        ranks = []
        for r in range(2):
            rank = Probe.options(**trainer_rank_options(configs, 0.25, None, group, r)).remote("{}", 0.25, r)
            ranks.append(await rank.start.remote())
        rollout.kill("rollout-0")
        name, gpu = await rollout.add()
        return {"replicas": replicas, "ranks": ranks, "replacement": [name, gpu]}

    ray.init(num_cpus=4, num_gpus=2, resources={"rljob.io/rollout": 3, "rljob.io/trainer": 2}, include_dashboard=False)
    try:
        print(json.dumps(asyncio.run(main())))
    finally:
        shutdown_ray()
    """
)


@pytest.mark.ray
def test_each_gpu_holds_one_replica_and_one_rank_and_a_replacement_takes_its_predecessors(colocated: dict) -> None:
    colocated["spec"]["rollout"]["replicas"] = 2
    colocated["spec"]["trainer"]["gpusPerNode"] = 2
    done = subprocess.run(
        [sys.executable, "-c", PLACEMENT],
        input=yaml.safe_dump(colocated),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    placed = json.loads(done.stdout.strip().splitlines()[-1])
    print(placed)
    replicas, ranks = placed["replicas"], placed["ranks"]
    assert sorted(replicas.values()) == ["0", "1"] and sorted(ranks) == ["0", "1"], placed
    # rank r shares bundle r's GPU with the replica that took bundle r (replicas take the bundles in order)
    assert [replicas["rollout-0"], replicas["rollout-1"]] == ranks, placed
    assert placed["replacement"] == ["rollout-2", replicas["rollout-0"]], placed


# ---- on a GPU: the shipped example learns with both pools on one GPU ------------------------------------------------


def _learn(doc: dict, work: Path, model: Path) -> tuple[list[dict[str, Any]], float]:
    """`rljob run` of `doc` to its end: metrics.jsonl's steps and the median seconds per step."""
    from rljob_workers.driver.telemetry.metrics import read_metrics

    job = _write_job(doc, work, model)
    done, _ = _rljob("run", str(job), "--no-display", "--output", str(work / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    records = read_metrics(work / "out" / "metrics.jsonl")
    gaps = sorted(b["elapsed_seconds"] - a["elapsed_seconds"] for a, b in itertools.pairwise(records))
    return records, gaps[len(gaps) // 2]


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.serial
def test_the_one_gpu_example_learns_beside_the_split_run(tmp_path: Path, example_model: Path) -> None:
    """examples/arithmetic-one-gpu.yaml on a CUDA device: the `make run` bar (reward <= 0.2 at step 1, the last
    five steps' mean >= 0.8), its s/step printed beside the same job with the rollout on the CPU (what one GPU
    allowed without colocate), in the same run."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: torch sees none here (the GPU machine's check)")
    doc = yaml.safe_load((REPO / "examples" / "arithmetic-one-gpu.yaml").read_text())
    doc["spec"]["data"]["eval"]["everySteps"] = 1000  # eval at step 0 and the end only: step times stay comparable
    records, colocated = _learn(copy.deepcopy(doc), tmp_path / "colocated", example_model)
    split_doc = copy.deepcopy(doc)
    split_doc["spec"]["colocate"] = False
    split_doc["spec"]["rollout"]["gpusPerReplica"] = 0
    _, split = _learn(split_doc, tmp_path / "split", example_model)
    last = [r["reward_mean"] for r in records[-5:]]
    print(f"one GPU, colocated: {colocated:.3f} s/step; trainer on the GPU, rollout on the CPU: {split:.3f} s/step")
    assert records[0]["reward_mean"] <= 0.2 and sum(last) / 5 >= 0.8, (records[0]["reward_mean"], last)
