"""Whether a colocated pair (`spec.colocate`: a rollout replica and a trainer rank on one GPU) fits that GPU's
memory: docs/gpu-sizing.md's formulas, as code; and the operator's refusal of a colocated job."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .algorithm import resolve_algorithm
from .base import FieldError, RLJobInvalid
from .colocate import COLOCATE_ON_A_CLUSTER
from .spec import RLJob, RLJobSpec

# Kept free of the two pools' estimates: the CUDA contexts, activations, the allocators' fragmentation.
HEADROOM = 0.10
GIB = 1 << 30
# Engines that take a set share of the GPU at their start (gpuMemoryUtilization); hf grows with its batch.
SHARE_ENGINES = ("vllm", "sglang")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
# bytes per unit, as people write them (GB, GiB) and as Kubernetes does (G, Gi)
_UNITS = {"": 1, "b": 1}
for _power, _prefix in enumerate("kmgt", start=1):
    _UNITS.update({_prefix: 1000**_power, f"{_prefix}b": 1000**_power})
    _UNITS.update({f"{_prefix}i": 1024**_power, f"{_prefix}ib": 1024**_power})


def refuse_on_a_cluster(job: RLJob, source: str) -> None:
    """The operator's refusal of what cannot run on a cluster yet (RLJobInvalid naming the field): a
    colocated job."""
    if job.spec.colocate:
        raise RLJobInvalid([FieldError("spec.colocate", COLOCATE_ON_A_CLUSTER)], source)


def parse_bytes(text: str) -> int:
    """'80GiB', '24 GB', '512MiB', '1e9' -> bytes (ValueError naming the text otherwise)."""
    found = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]?i?[bB]?)\s*", text)
    unit = found.group(2).lower() if found else ""
    if not found or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 24GB)")
    return int(float(found.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class PairMemory:
    """What a colocated pair needs of one GPU, in bytes, with what each figure counts."""

    trainer: int
    trainer_terms: str
    rollout: int
    rollout_terms: str
    engine_share: int  # of `rollout`, what a SHARE_ENGINES engine takes at its start (0 for hf)


def pair_memory(spec: RLJobSpec, parameters: int, gpu_bytes: int) -> PairMemory:
    """The trainer rank's and the rollout replica's bytes on one GPU of `gpu_bytes`, for a policy of
    `parameters` (docs/gpu-sizing.md; activations and the KV cache are in the headroom)."""
    p, width = parameters, _DTYPE_BYTES.get(spec.model.dtype, 2)
    ranks = spec.trainer.gpus_per_node * spec.trainer.nodes
    sharded = spec.trainer.strategy == "fsdp"
    terms = [("fp32 weights, gradients, AdamW", 16 * p // (ranks if sharded else 1))]
    if resolve_algorithm(spec.algorithm, spec.rollout.sampling.max_new_tokens).kl_coef > 0:
        terms.append(("reference", width * p))
    staleness = spec.algorithm.max_staleness
    if staleness and not sharded:
        terms.append((f"{staleness} past version(s) + scratch", (staleness + 1) * width * p))
    terms.append(("published weights (newest + spare)", 2 * width * p))
    trainer = sum(n for _, n in terms)
    staged = width * p  # a new version received whole beside the engine's own weights
    share = 0
    if spec.rollout.engine in SHARE_ENGINES:
        util = spec.rollout.gpu_memory_utilization
        share = int(util * gpu_bytes)
        rollout, rollout_terms = share + staged, f"gpuMemoryUtilization {util:g} of the GPU + a staged version"
    else:
        rollout, rollout_terms = 2 * width * p, "weights + a staged version, before its KV cache"
    return PairMemory(trainer, " + ".join(name for name, _ in terms), rollout, rollout_terms, share)


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.2f} MiB"


def colocate_refusal(spec: RLJobSpec, parameters: int, gpu_bytes: int) -> str | None:
    """One line saying why the colocated pair cannot fit a GPU of `gpu_bytes`, or None where it fits."""
    need = pair_memory(spec, parameters, gpu_bytes)
    usable = int(gpu_bytes * (1 - HEADROOM))
    if need.trainer + need.rollout <= usable:
        return None
    what = (
        f"spec.colocate: a {_size(gpu_bytes)} GPU ({1 - HEADROOM:.0%} usable) cannot hold the trainer rank's "
        f"{_size(need.trainer)} ({need.trainer_terms}) and the rollout replica's {_size(need.rollout)} "
        f"({need.rollout_terms}) for {parameters:,} parameters"
    )
    if spec.rollout.engine in SHARE_ENGINES:  # the share that leaves the trainer and the staged version room
        room = (usable - need.trainer - (need.rollout - need.engine_share)) / gpu_bytes
        if room >= 0.05:
            return f"{what}: set rollout.gpuMemoryUtilization to {room:.2f} or less, or give each pool its own GPU"
    return f"{what}: give each pool its own GPU, or train a smaller model"
