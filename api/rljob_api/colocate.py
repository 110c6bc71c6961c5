"""Rollout and trainer on the same GPUs (`spec.colocate`): the rules that pair one rollout replica with one
trainer rank on each GPU of one machine. Whether the pair's memory fits that GPU is `colocate_fit`'s."""

from __future__ import annotations

from .base import FieldRuleError, cel
from .pools import RolloutSpec, TrainerSpec

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
# What Ray books of a GPU for each of the pair; only the sum (1) matters: Ray packs one pair per GPU bundle.
ROLLOUT_GPU_SHARE, TRAINER_GPU_SHARE = 0.5, 0.5


def check_colocate(colocate: bool, rollout: RolloutSpec, trainer: TrainerSpec, weight_backend: str) -> None:
    """The pairing rules of `spec.colocate` (a FieldRuleError naming the field that breaks one)."""
    if not colocate:
        return
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
    if weight_backend == "nccl":
        raise FieldRuleError("weightSync.backend", "nccl refuses two ranks on one GPU; colocate moves weights by gloo")


COLOCATE_CEL = (
    cel(
        "!self.colocate || (self.rollout.gpusPerReplica == 1 && self.trainer.nodes == 1 && "
        "self.trainer.gpusPerNode >= 1 && self.rollout.replicas == self.trainer.gpusPerNode)",
        "colocate pairs one rollout replica (gpusPerReplica 1) with each GPU of one trainer node",
    ),
    cel("!self.colocate || self.weightSync.backend != 'nccl'", "colocate moves weights by gloo, not nccl"),
)
