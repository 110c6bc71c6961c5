"""The RLJob resource: apiVersion rljob.io/v1alpha1, kind RLJob, short name rlj."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .algorithm import AlgorithmSpec
from .base import IMMUTABLE, FieldRuleError, Model, cel, cel_rules
from .code import CodeSpec
from .colocate import COLOCATE_CEL, COLOCATE_DESCRIPTION, check_colocate
from .environment import EnvironmentSpec
from .evaluation import EvalSpec
from .placement import CheckpointVolumeSource, LocalObjectReference, SecurityContext, VolumeSource
from .pools import RolloutSpec, TrainerSpec
from .reward import RewardSpec
from .status import RLJobStatus
from .tracking import LoggingSpec

GROUP = "rljob.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SHORT_NAMES = ["rlj"]
DEFAULT_IMAGE = "ghcr.io/rljob/rljob-worker:0.1.0"


def immutable() -> dict[str, Any]:
    """CEL transition rule that refuses any change of the field after creation."""
    return cel_rules(cel("self == oldSelf", IMMUTABLE))


class ModelSpec(Model):
    """The policy to train: a local transformers model directory (or one on a mounted volume)."""

    path: str = Field(
        description="Directory of a transformers causal LM (config, weights, tokenizer); in the pods if volume is set.",
        min_length=1,
        max_length=4096,
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description=(
            "Compute dtype: the trainer's forward and backward and the weights the rollout engines load and "
            "receive (the trainer's master weights, optimizer state and checkpoints stay float32); auto is "
            "bfloat16 on GPU and float32 on CPU."
        ),
    )
    volume: VolumeSource | None = Field(None, description="Volume holding the model, mounted at volume.mountPath.")

    model_config = ConfigDict(json_schema_extra=immutable())


class DataSpec(Model):
    """Where prompts come from: a file or folder read with Hugging Face datasets, offline and memory-mapped."""

    path: str = Field(
        description=(
            "Prompts: a JSON-lines (.jsonl), JSON (.json), parquet (.parquet) or CSV (.csv) file, a folder "
            "datasets' save_to_disk wrote, or a dataset folder of such files (load_dataset(folder)). Read "
            "memory-mapped: the driver holds only the rows it draws."
        ),
        min_length=1,
        max_length=4096,
    )
    split: str = Field(
        "train",
        description="Split of a dataset with several (save_to_disk's DatasetDict, a folder's splits); a file is one.",
        min_length=1,
    )
    prompt_field: str = Field(
        "prompt",
        description="Field of each row holding the prompt text.",
        min_length=1,
        max_length=253,
    )
    fields: list[str] = Field(
        default_factory=list,
        description=(
            "Further fields passed to reward functions and environments (e.g. answer), with their JSON types "
            "(numbers, lists, objects); a dotted name reads a key of an object column (reward_model.ground_truth), "
            "and a function takes it by its last part (ground_truth)."
        ),
        max_length=64,
    )
    messages_field: str | None = Field(
        None,
        description=(
            "Field of each line holding a chat conversation, a list of {role, content} messages, instead of "
            "promptField's text; rendered with the model's chat template, which the model must have."
        ),
        min_length=1,
        max_length=253,
    )
    system_prompt: str | None = Field(
        None,
        description=(
            "System message put before every prompt that has none of its own (plain text or messages); "
            "needs the chat template."
        ),
        min_length=1,
        max_length=65536,
    )
    max_prompt_tokens: int | None = Field(
        None,
        description=(
            "Longest prompt, in tokens, checked as each row is drawn (never sent to an engine); unset: the "
            "model's context (max_position_embeddings) less rollout.sampling.maxNewTokens."
        ),
        ge=1,
    )
    prompt_too_long: Literal["drop", "fail"] = Field(
        "drop",
        description=(
            "drop: a longer prompt goes to failed.jsonl in the output, counted, and the run goes on (until "
            "algorithm.maxFailedPrompts); fail: the run fails naming it."
        ),
    )
    chat_template: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "auto: each prompt is rendered with the model's chat template (apply_chat_template with the "
            "generation prompt) when its tokenizer has one, plain text as a user message; without a template "
            "plain text goes to the model as it is. off: plain text as it is, always."
        ),
    )
    shuffle: bool = Field(True, description="Shuffle prompts each epoch (seeded by algorithm.seed).")
    volume: VolumeSource | None = Field(None, description="Volume holding the data.")
    eval: EvalSpec | None = Field(
        None, description="A held-out eval set, generated and scored during the run, never trained on."
    )

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> DataSpec:
        if self.messages_field is not None and self.prompt_field != "prompt":
            raise FieldRuleError("messagesField", f"set promptField ({self.prompt_field}) or messagesField, not both")
        if self.chat_template == "off" and self.messages_field is not None:
            raise FieldRuleError("messagesField", "messages are rendered with the chat template; chatTemplate is off")
        if self.chat_template == "off" and self.system_prompt is not None:
            raise FieldRuleError("systemPrompt", "goes into the chat template; chatTemplate is off")
        seen: dict[str, str] = {}
        for name in self.fields:
            short = name.rsplit(".", 1)[-1]
            if short in seen:
                raise FieldRuleError("fields", f"{seen[short]} and {name} both reach functions as {short}")
            seen[short] = name
        return self

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel("self == oldSelf", IMMUTABLE),
            cel(
                "!has(self.messagesField) || self.promptField == 'prompt'",
                "set promptField or messagesField, not both",
            ),
            cel(
                "!has(self.messagesField) || self.chatTemplate != 'off'",
                "messagesField needs the chat template; chatTemplate is off",
            ),
            cel(
                "!has(self.systemPrompt) || self.chatTemplate != 'off'",
                "systemPrompt needs the chat template; chatTemplate is off",
            ),
        )
    )


class WeightSyncSpec(Model):
    """How new policy versions reach the rollout pool (the checkpoint engine)."""

    backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto", description="Collective for the bulk broadcast; auto is nccl on GPU, gloo on CPU."
    )
    bucket_size_mb: int | None = Field(
        None,
        description="Size of one flat broadcast bucket, in MiB; unset: 8 on gloo (CPU), 256 on nccl (GPU).",
        ge=1,
        le=65536,
    )
    every_steps: int = Field(1, description="Publish a new version to rollout every N train steps.", ge=1)
    timeout_seconds: float = Field(600.0, description="Deadline of one weight transfer.", gt=0)

    model_config = ConfigDict(json_schema_extra=immutable())


class CheckpointSpec(Model):
    """Trainer checkpoints: model, optimizer, step, data position and policy version."""

    dir: str = Field(
        "checkpoints",
        description="Directory of checkpoints (a mounted volume on a cluster).",
        min_length=1,
        max_length=4096,
    )
    every_steps: int = Field(10, description="Checkpoint every N train steps (and at the end).", ge=1)
    keep: int = Field(2, description="Checkpoints kept; older ones are deleted.", ge=1)
    volume: CheckpointVolumeSource | None = Field(
        None, description="Volume holding the checkpoints (and the run's metrics), mounted writable."
    )

    model_config = ConfigDict(json_schema_extra=immutable())


class ObjectMeta(Model):
    """Kubernetes metadata; only name, namespace, labels and annotations are read."""

    name: str = Field(description="Job name.", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    namespace: str = Field("default", description="Namespace.", max_length=63)
    labels: dict[str, str] = Field(default_factory=dict, description="Labels, copied onto every child object.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")

    # The API server adds uid, resourceVersion, managedFields, ...: kept, not validated here.
    model_config = ConfigDict(extra="allow")


class SupervisionSpec(Model):
    """How the driver tells a hung replica from a busy one."""

    hung_after_seconds: float = Field(
        120.0,
        description=(
            "A replica (rollout, reward or environment) alive but answering none of the driver's pings for this "
            "long is treated as lost: killed, replaced, its work sent elsewhere (generous: a busy replica on a "
            "loaded machine answers late)."
        ),
        gt=0,
        le=86400,
    )


class RLJobSpec(Model):
    """Desired state of an RL post-training job."""

    model: ModelSpec = Field(description="The policy model.")
    data: DataSpec = Field(description="The prompts.")
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="RL algorithm and hyperparameters.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="The rollout pool.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="The trainer pool.")
    reward: RewardSpec = Field(default_factory=RewardSpec, description="The reward pool and functions.")
    environment: EnvironmentSpec | None = Field(
        None,
        description="Multi-turn episodes against an environment (tools, sandboxes, games) instead of one completion.",
    )
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec, description="The checkpoint engine.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpointing.")
    supervision: SupervisionSpec = Field(default_factory=SupervisionSpec, description="Finding hung replicas.")
    code: CodeSpec = Field(
        default_factory=CodeSpec,
        description="Your own Python (reward functions, environments) on the pools' path, without an image.",
    )
    progress_deadline_seconds: float = Field(
        1800.0,
        description=(
            "A run in which no train step completes for this long (from its start, or its last step) is stuck: "
            "Degraded (reason NoProgress) from half of it, then Failed (ProgressDeadlineExceeded), naming what "
            "it waited on, with a checkpoint of its last step."
        ),
        ge=10,
        le=604800,
    )
    active_deadline_seconds: int | None = Field(
        None,
        description=(
            "Longest the whole job may run, from the driver's start; then it stops with a checkpoint and is "
            "Failed (ActiveDeadlineExceeded). Unset: no limit. On a cluster the driver Job's own "
            "activeDeadlineSeconds is this plus the driver's grace period, a backstop across driver restarts."
        ),
        ge=1,
    )
    logging: LoggingSpec = Field(
        default_factory=LoggingSpec, description="Experiment trackers and sample logs of the run."
    )
    colocate: bool = Field(False, description=COLOCATE_DESCRIPTION)
    suspend: bool = Field(False, description="Tear the pools down, keeping the checkpoint; false resumes from it.")
    image: str = Field(
        DEFAULT_IMAGE,
        description="Worker image of every pool and the driver.",
        min_length=1,
        max_length=1024,
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="Image pull policy."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        description=(
            "Secrets (kubernetes.io/dockerconfigjson, in the job's namespace) the kubelet pulls the images with, "
            "as a pod's imagePullSecrets: on the Ray head, every pool's pods and the driver."
        ),
        max_length=32,
    )
    service_account_name: str | None = Field(
        None,
        description="Service account of the pods; the operator makes one if unset.",
        max_length=253,
    )
    security_context: SecurityContext = Field(
        default_factory=SecurityContext,
        description="How the pods run (the Ray head, the driver, and each pool without its own securityContext).",
    )

    @model_validator(mode="after")
    def _cross_pool_rules(self) -> RLJobSpec:
        lag = self.weight_sync.every_steps - 1
        if lag > self.algorithm.max_staleness:
            raise FieldRuleError(
                "weightSync.everySteps",
                f"{self.weight_sync.every_steps} lets rollout lag {lag} versions, more than "
                f"algorithm.maxStaleness {self.algorithm.max_staleness}; every sample would be stale",
            )
        uses_gpu = self.rollout.gpus_per_replica > 0 or self.trainer.gpus_per_node > 0
        if self.weight_sync.backend == "nccl" and not uses_gpu:
            raise FieldRuleError("weightSync.backend", "nccl needs GPUs in the rollout and trainer pools")
        buffer, budget = self.algorithm.overlong.buffer_tokens, self.rollout.sampling.max_new_tokens
        if buffer is not None and buffer > budget:
            raise FieldRuleError(
                "algorithm.overlong.bufferTokens", f"{buffer} is more than rollout.sampling.maxNewTokens {budget}"
            )
        check_colocate(self.colocate, self.rollout, self.trainer, self.weight_sync.backend)
        if not self.reward.functions and self.environment is None:
            raise FieldRuleError(
                "reward.functions", "at least one reward function, unless spec.environment gives the reward"
            )
        return self

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "self.weightSync.everySteps - 1 <= self.algorithm.maxStaleness",
                "weightSync.everySteps - 1 must not exceed algorithm.maxStaleness",
            ),
            cel(
                "!has(self.algorithm.overlong.bufferTokens) || "
                "self.algorithm.overlong.bufferTokens <= self.rollout.sampling.maxNewTokens",
                "algorithm.overlong.bufferTokens must not exceed rollout.sampling.maxNewTokens",
            ),
            cel("self.reward.functions == oldSelf.reward.functions", "reward.functions " + IMMUTABLE),
            cel(
                "has(self.environment) || size(self.reward.functions) > 0",
                "reward.functions: at least one reward function, unless spec.environment gives the reward",
            ),
            cel("self.colocate == oldSelf.colocate", "colocate " + IMMUTABLE),
            *COLOCATE_CEL,
        )
    )


class RLJob(Model):
    """An RL post-training job."""

    api_version: Literal["rljob.io/v1alpha1"] = Field("rljob.io/v1alpha1", description="API version.")
    kind: Literal["RLJob"] = Field("RLJob", description="Kind.")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: RLJobSpec = Field(description="Desired state.")
    status: RLJobStatus | None = Field(None, description="Observed state, written by the operator.")


def clear_text_tokens(job: RLJob) -> list[str]:
    """A warning for each remote endpoint list that `insecure: true` lets send its bearer token without TLS."""
    remotes = [(f"spec.reward.functions[{i}].remote", f.remote) for i, f in enumerate(job.spec.reward.functions)]
    if job.spec.environment is not None:
        remotes.append(("spec.environment.remote", job.spec.environment.remote))
    return [
        f"warning: {field}: insecure: true sends the bearer token in clear text to {', '.join(remote.endpoints)}"
        for field, remote in remotes
        if remote is not None and remote.sends_token_in_clear
    ]
