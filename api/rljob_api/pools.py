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
    top_p: float = Field(
        1.0,
        description=(
            "Nucleus sampling mass; 1 disables it. Rollout on engine vllm refuses any other value (vLLM reports "
            "log-probs after the cut, which the trainer cannot recompute); engine hf serves any."
        ),
        gt=0,
        le=1,
    )
    top_k: int = Field(
        0,
        description=(
            "Top-k cutoff; 0 disables it. Rollout on engine vllm refuses any other value (vLLM reports log-probs "
            "after the cut, which the trainer cannot recompute); engine hf serves any."
        ),
        ge=0,
    )
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


WeightUpdate = Literal["drain", "inflight"]
# The rollout image of each engine that does not run in the worker image: its own torch and transformers
# (vLLM's pins differ from the trainer's), the same Python, Ray and rljob (docker/rollout-vllm.Dockerfile).
DEFAULT_ENGINE_IMAGES: dict[Engine, str] = {
    "vllm": "ghcr.io/rljob/rljob-rollout-vllm:0.1.0",
    "sglang": "ghcr.io/rljob/rljob-rollout-sglang:0.1.0",
}
# vLLM reports the sampled token's log-prob after its top-p/top-k cut (processed log-probs), not the
# log-softmax of the whole distribution the trainer recomputes: with a cut the two disagree.
_CUT_NEEDS_HF = "vllm reports log-probs after the top-p/top-k cut, which the trainer cannot recompute; use engine hf"


class RolloutSpec(Placement):
    """The rollout pool: inference replicas that generate completions."""

    replicas: int = Field(1, description="Number of rollout replicas.", ge=1, le=1024)
    retries: int = Field(
        2,
        description=(
            "Times a prompt whose generation the engine failed (out of memory on one long sample, say) is tried "
            "again on another replica before it goes to failed.jsonl and is skipped."
        ),
        ge=0,
        le=16,
    )
    request_timeout_seconds: float = Field(
        900.0,
        description=(
            "Deadline of one Generate call (a prompt group, or one turn of each episode it carries): a replica "
            "that has not finished it by then is treated as hung, replaced, and the prompts go elsewhere "
            "(generous: a loaded 2-core machine generates a group in tens of seconds)."
        ),
        gt=0,
        le=86400,
    )
    gpus_per_replica: int = Field(
        1,
        description=(
            "GPUs per replica: tensorParallelSize × pipelineParallelSize × dataParallelSize, every one of them "
            "used; 0 runs on the CPU (engines hf and vllm)."
        ),
        ge=0,
        le=64,
    )
    tensor_parallel_size: int = Field(
        1, description="Tensor-parallel degree of each engine (vllm, sglang).", ge=1, le=64
    )
    pipeline_parallel_size: int = Field(1, description="Pipeline-parallel degree of each engine (vllm).", ge=1, le=64)
    data_parallel_size: int = Field(
        1, description="Engines in one replica, each on its own GPUs (vllm's data parallelism).", ge=1, le=64
    )
    engine: Engine = Field("hf", description="Inference engine: hf (transformers, runs anywhere), vllm or sglang.")
    image: str | None = Field(
        None,
        description=(
            "Image of the rollout pods; unset: the engine's own (vllm: "
            f"{DEFAULT_ENGINE_IMAGES['vllm']}, sglang: {DEFAULT_ENGINE_IMAGES['sglang']}), hf: spec.image."
        ),
        min_length=1,
        max_length=1024,
    )
    weight_update: WeightUpdate = Field(
        "drain",
        description=(
            "How a replica takes a new policy version. drain: at a safe point, once no sample is half done, so "
            "each sample comes from one version. inflight (vllm, sglang): at once, generation paused in place "
            "and resumed on the new weights; a sample then spans the versions it was generated with, and the "
            "staleness bound counts its oldest."
        ),
    )
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Sampling parameters.")
    max_concurrent_prompts: int = Field(64, description="Prompts in flight per replica.", ge=1, le=65536)
    gpu_memory_utilization: float = Field(0.85, description="Share of GPU memory vllm/sglang may take.", gt=0, le=1)

    def image_or(self, worker_image: str) -> str:
        """The rollout pods' image: `image`, else the engine's own, else the job's worker image."""
        return self.image or DEFAULT_ENGINE_IMAGES.get(self.engine) or worker_image

    @property
    def engine_gpus(self) -> int:
        """GPUs the replica's engines use: tensor × pipeline × data parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @model_validator(mode="after")
    def _check_parallelism(self) -> RolloutSpec:
        sharded = self.engine_gpus > 1
        if self.engine == "hf" and sharded:
            field = next(f for f, n in self._degrees().items() if n > 1)
            raise FieldRuleError(field, "the hf engine runs one unsharded model; use 1, or engine vllm/sglang")
        if self.engine == "sglang" and self.pipeline_parallel_size > 1:
            raise FieldRuleError("pipelineParallelSize", "the sglang adapter runs tensor parallelism only; use 1")
        if self.gpus_per_replica == 0:
            if self.engine == "sglang":
                raise FieldRuleError("engine", "sglang has no CPU build; set gpusPerReplica ≥ 1, or use vllm or hf")
            if sharded:
                field = next(f for f, n in self._degrees().items() if n > 1)
                raise FieldRuleError(field, "parallel engines need GPUs; set gpusPerReplica, or use 1 on the CPU")
        elif self.gpus_per_replica != max(self.engine_gpus, 1):
            used = self.engine_gpus
            what = f"would leave {self.gpus_per_replica - used} idle" if used < self.gpus_per_replica else "are too few"
            raise FieldRuleError(
                "gpusPerReplica",
                f"{self.gpus_per_replica} GPUs for engines that use {used} (tensorParallelSize "
                f"{self.tensor_parallel_size} × pipelineParallelSize {self.pipeline_parallel_size} × "
                f"dataParallelSize {self.data_parallel_size}): {what}",
            )
        return self

    def _degrees(self) -> dict[str, int]:
        return {
            "tensorParallelSize": self.tensor_parallel_size,
            "pipelineParallelSize": self.pipeline_parallel_size,
            "dataParallelSize": self.data_parallel_size,
        }

    @model_validator(mode="after")
    def _check_engine_settings(self) -> RolloutSpec:
        if self.engine == "vllm" and self.sampling.top_p < 1:
            raise FieldRuleError("sampling.topP", _CUT_NEEDS_HF)
        if self.engine == "vllm" and self.sampling.top_k > 0:
            raise FieldRuleError("sampling.topK", _CUT_NEEDS_HF)
        if self.engine == "hf" and self.weight_update == "inflight":
            raise FieldRuleError("weightUpdate", "the hf engine switches versions between batches; use drain")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel(
                "self.gpusPerReplica == 0 || self.gpusPerReplica == "
                "self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize",
                "gpusPerReplica must be tensorParallelSize × pipelineParallelSize × dataParallelSize (or 0)",
            ),
            cel(
                "self.gpusPerReplica > 0 || "
                "self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize == 1",
                "parallel engines need GPUs",
            ),
            cel("self.gpusPerReplica > 0 || self.engine != 'sglang'", "sglang has no CPU build: gpusPerReplica ≥ 1"),
            cel(
                "self.engine != 'hf' || "
                "self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize == 1",
                "the hf engine runs one unsharded model",
            ),
            cel(
                "self.engine != 'vllm' || (self.sampling.topP == 1.0 && self.sampling.topK == 0)",
                "vllm needs sampling.topP 1 and topK 0 (its log-probs are taken after the cut)",
            ),
            cel("self.engine != 'hf' || self.weightUpdate == 'drain'", "the hf engine takes weights by drain only"),
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
