"""Rollout and trainer on the same GPUs (`spec.colocate`): the rules that pair one rollout replica with one
trainer rank on each GPU of one machine, and whether the pair's memory fits that GPU (docs/gpu-sizing.md's
formulas, as code)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .algorithm import resolve_algorithm
from .base import FieldRuleError, cel

if TYPE_CHECKING:
    from .spec import RLJob, RLJobSpec

COLOCATE_DESCRIPTION = (
    "Rollout and trainer share the GPUs of one machine (`rljob run`; a cluster gives each pool its own pods): "
    "each GPU holds one rollout replica (gpusPerReplica 1) and one trainer rank, so rollout.replicas must equal "
    "trainer.gpusPerNode on one trainer node. The rollout engine starts first and keeps its share "
    "(vllm, sglang: gpuMemoryUtilization of the GPU); the trainer has the rest. Weights move through gloo "
    "(NCCL refuses two ranks on one GPU). `rljob validate --deep` checks that both fit."
)
COLOCATE_ON_A_CLUSTER = (
    "shares the GPUs of one machine under `rljob run`; on a cluster each pool has its own pods (set colocate "
    "false, or run the job with `rljob run` on the GPU machine)"
)
# Kept free of the two pools' estimates: the CUDA contexts, activations, the allocators' fragmentation.
HEADROOM = 0.10
# What Ray books of a GPU for each of the pair; only the sum (1) matters: Ray packs one pair per GPU bundle.
ROLLOUT_GPU_SHARE, TRAINER_GPU_SHARE = 0.5, 0.5
GIB = 1 << 30
# Engines that take a set share of the GPU at their start (gpuMemoryUtilization); hf grows with its batch.
SHARE_ENGINES = ("vllm", "sglang")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
# bytes per unit, as people write them (GB, GiB) and as Kubernetes does (G, Gi)
_UNITS = {"": 1, "b": 1}
for _power, _prefix in enumerate("kmgt", start=1):
    _UNITS.update({_prefix: 1000**_power, f"{_prefix}b": 1000**_power})
    _UNITS.update({f"{_prefix}i": 1024**_power, f"{_prefix}ib": 1024**_power})


def check_colocate(spec: RLJobSpec) -> None:
    """The pairing rules of `spec.colocate` (a FieldRuleError naming the field that breaks one)."""
    if not spec.colocate:
        return
    rollout, trainer = spec.rollout, spec.trainer
    if rollout.gpus_per_replica != 1:
        raise FieldRuleError(
            "rollout.gpusPerReplica", f"{rollout.gpus_per_replica}; colocate puts one rollout replica on one GPU"
        )
    if trainer.gpus_per_node < 1 or trainer.nodes != 1:
        raise FieldRuleError(
            "trainer", "colocate needs one trainer node with GPUs (nodes 1, gpusPerNode ≥ 1): it runs on one machine"
        )
    if rollout.replicas != trainer.gpus_per_node:
        raise FieldRuleError(
            "rollout.replicas",
            f"{rollout.replicas} for {trainer.gpus_per_node} trainer GPUs; colocate pairs one replica with each GPU",
        )
    if spec.weight_sync.backend == "nccl":
        raise FieldRuleError("weightSync.backend", "nccl refuses two ranks on one GPU; colocate moves weights by gloo")


COLOCATE_CEL = (
    cel(
        "!self.colocate || (self.rollout.gpusPerReplica == 1 && self.trainer.nodes == 1 && "
        "self.trainer.gpusPerNode >= 1 && self.rollout.replicas == self.trainer.gpusPerNode)",
        "colocate pairs one rollout replica (gpusPerReplica 1) with each GPU of one trainer node",
    ),
    cel("!self.colocate || self.weightSync.backend != 'nccl'", "colocate moves weights by gloo, not nccl"),
)


def refuse_on_a_cluster(job: RLJob, source: str) -> None:
    """The operator's refusal of a colocated job (RLJobInvalid naming spec.colocate)."""
    from .load import FieldError, RLJobInvalid  # load imports spec, which imports this module

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
