"""The rollout and trainer pools."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import IMMUTABLE, FieldRuleError, Model, cel, cel_rules
from .placement import Placement

Engine = Literal["hf", "vllm", "sglang"]


class _Sampling(Model):
    """Sampling parameters shared by rollout and generative judges."""

    temperature: float = Field(
        1.0, description="Softmax temperature; 0 decodes greedily (topP and topK then do nothing).", ge=0
    )
    top_p: float = Field(1.0, description="Nucleus sampling mass; 1 disables it.", gt=0, le=1)
    top_k: int = Field(0, description="Top-k cutoff; 0 disables it.", ge=0)
    max_new_tokens: int = Field(256, description="Most tokens generated per completion.", ge=1, le=131072)
    stop: list[str] = Field(default_factory=list, description="Strings that end a completion.", max_length=16)


class SamplingSpec(_Sampling):
    """How rollout samples completions."""

    temperature: float = Field(
        1.0,
        description="Softmax temperature; must be positive, since a group of greedy samples carries no signal.",
        gt=0,
    )


class JudgeSamplingSpec(_Sampling):
    """How a generative judge samples its answer: greedily unless told otherwise, so a score is not luck."""

    temperature: float = Field(
        0.0, description="Softmax temperature; 0, the default, decodes greedily (the same answer every time).", ge=0
    )


class RolloutSpec(Placement):
    """The rollout pool: inference replicas that generate completions."""

    replicas: int = Field(1, description="Number of rollout replicas.", ge=1, le=1024)
    gpus_per_replica: int = Field(1, description="GPUs per replica; 0 runs on CPU (hf engine only).", ge=0, le=64)
    tensor_parallel_size: int = Field(
        1,
        description="Tensor-parallel degree inside a replica; must divide gpusPerReplica.",
        ge=1,
        le=64,
    )
    engine: Engine = Field("hf", description="Inference engine: hf (transformers, runs anywhere), vllm or sglang.")
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Sampling parameters.")
    max_concurrent_prompts: int = Field(64, description="Prompts in flight per replica.", ge=1, le=65536)
    gpu_memory_utilization: float = Field(0.85, description="Share of GPU memory vllm/sglang may take.", gt=0, le=1)

    @model_validator(mode="after")
    def _check_parallelism(self) -> RolloutSpec:
        if self.gpus_per_replica and self.gpus_per_replica % self.tensor_parallel_size:
            raise FieldRuleError(
                "tensorParallelSize",
                f"{self.tensor_parallel_size} does not divide gpusPerReplica {self.gpus_per_replica}",
            )
        if self.gpus_per_replica == 0 and self.engine != "hf":
            raise FieldRuleError("engine", f"{self.engine} needs GPUs; set gpusPerReplica ≥ 1 or use engine hf")
        if self.engine == "hf" and self.tensor_parallel_size != 1:
            raise FieldRuleError("tensorParallelSize", "the hf engine does not shard; use 1, or engine vllm/sglang")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel(
                "self.gpusPerReplica == 0 || self.gpusPerReplica % self.tensorParallelSize == 0",
                "tensorParallelSize must divide gpusPerReplica",
            ),
            cel(
                "self.gpusPerReplica > 0 || self.engine == 'hf'",
                "engines other than hf need gpusPerReplica ≥ 1",
            ),
            cel("self == oldSelf", IMMUTABLE),
        )
    }


class TrainerSpec(Placement):
    """The trainer pool: torch DDP or FSDP over nodes × GPUs."""

    nodes: int = Field(1, description="Trainer nodes (one Ray worker each).", ge=1, le=1024)
    gpus_per_node: int = Field(1, description="GPUs per trainer node; 0 trains on CPU in one process.", ge=0, le=64)
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="Data parallel (ddp) or fully sharded (fsdp) training.")
    micro_batch_size: int = Field(8, description="Sequences per forward/backward pass on one rank.", ge=1, le=65536)
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    freeze: list[str] = Field(
        default_factory=list,
        description="Parameters to keep as loaded, by shell-style patterns on their names (e.g. "
        "`model.embed_tokens.*`): they are not trained, and each weight sync sends only the others. "
        "A pattern that matches no parameter is an error.",
        max_length=64,
    )

    @property
    def world_size(self) -> int:
        """Trainer processes: one per GPU, or one per node on CPU."""
        return self.nodes * max(self.gpus_per_node, 1)

    model_config = {"json_schema_extra": cel_rules(cel("self == oldSelf", IMMUTABLE))}
