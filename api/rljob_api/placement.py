"""Where a pool's pods run: node selection, tolerations, resources, volumes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import FieldRuleError, Model, cel, cel_rules

# A Kubernetes quantity: "500m", "16Gi", 4.
Quantity = str | int
# A whole number of bytes with an optional suffix, as a /dev/shm size: 512Mi, 8Gi, 1000000.
SHM_SIZE_PATTERN = r"^[1-9][0-9]*(Ki|Mi|Gi|Ti|k|M|G|T)?$"
# /dev/shm defaults (Placement.shmSize). Memory-backed: a page counts against the pod's memory only once
# written, so the size is a cap, not a reservation; too small a cap fails a write, too large one costs nothing
# unwritten. NCCL keeps its intra-node buffers between the ranks of a pod there (NVIDIA advises at least
# 1 GiB for a container). The vLLM adapter stages a pulled policy version there whole, as a safetensors
# file (engines/vllm.py, HANDOFF_DIR: 2 bytes a parameter), and vLLM's and SGLang's worker processes
# exchange inputs through shared-memory queues: 32 GiB per GPU holds the weights of a model that fills up
# to ~40% of 80 GB GPUs (e.g. 70B on 5+, 32B on 2, 14B on 1); 4 GiB at least (a small model on the CPU).
# Everything else (torch's inter-process tensors, Ray's small objects) fits well under 256 MiB.
SHM_PER_GPU_GIB = 1
SHM_ENGINE_PER_GPU_GIB = 32
SHM_ENGINE_MIN_GIB = 4
SHM_SMALL = "256Mi"


def default_shm_size(gpus: int, engine: str | None = None) -> str:
    """The /dev/shm size of a pod with `gpus` GPUs (and, for rollout, its engine) when the spec sets none."""
    if engine in ("vllm", "sglang"):
        return f"{max(SHM_ENGINE_PER_GPU_GIB * gpus, SHM_ENGINE_MIN_GIB)}Gi"
    return f"{SHM_PER_GPU_GIB * gpus}Gi" if gpus > 1 else SHM_SMALL


class Toleration(Model):
    """A Kubernetes toleration, so a pool's pods may run on tainted (e.g. GPU) nodes."""

    key: str | None = Field(
        None,
        description="Taint key the toleration matches; empty with operator Exists matches all.",
        max_length=253,
    )
    operator: Literal["Exists", "Equal"] = Field(
        "Equal", description="Exists matches any value; Equal matches `value`."
    )
    value: str | None = Field(None, description="Taint value to match with operator Equal.", max_length=253)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, description="For NoExecute: seconds the pod stays bound after the taint appears."
    )


class Resources(Model):
    """Extra container resources of a pool's pods (GPUs are set by the pool's GPU count)."""

    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resource requests, e.g. cpu: 4, memory: 32Gi."
    )
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits.")


# What a claim mounted by pods on more than one node needs (the operator checks the claim's access modes):
# every pool pod and the driver mount the job's claims, and Kubernetes attaches a ReadWriteOnce claim to
# one node only, a ReadWriteOncePod claim to one pod only.
_ACCESS_MODES = (
    "Every pool pod and the driver mount it, so pods on more than one node need access mode {mode} "
    "(ReadWriteOnce serves the pods of one node). When the spec spreads the pods (a pool of more than one "
    "replica or node, or pools selecting different nodes) and the claim lacks the mode, the operator says so "
    "in the VolumesReady condition and a Warning Event."
)


class VolumeSource(Model):
    """A PersistentVolumeClaim mounted into the pods that need it (model weights, data)."""

    claim_name: str = Field(
        description="Name of the PersistentVolumeClaim. " + _ACCESS_MODES.format(mode="ReadOnlyMany or ReadWriteMany"),
        min_length=1,
        max_length=253,
    )
    mount_path: str = Field("/mnt/rljob", description="Where the claim is mounted in the pods.", max_length=4096)
    read_only: bool = Field(True, description="Mount read-only.")


class CheckpointVolumeSource(VolumeSource):
    """The claim the checkpoints are written to (by trainer rank 0) and read from (by the driver, on resume)."""

    claim_name: str = Field(
        description="Name of the PersistentVolumeClaim. " + _ACCESS_MODES.format(mode="ReadWriteMany"),
        min_length=1,
        max_length=253,
    )
    read_only: bool = Field(False, description="Must be false: checkpoints are written here.")

    @model_validator(mode="after")
    def _writable(self) -> CheckpointVolumeSource:
        if self.read_only:
            raise FieldRuleError("readOnly", "checkpoints are written to this volume; set false (the default)")
        return self

    model_config = {
        "json_schema_extra": cel_rules(cel("!self.readOnly", "readOnly must be false: checkpoints are written here"))
    }


class LocalObjectReference(Model):
    """A Secret in the job's namespace, by name."""

    name: str = Field(description="Name of the Secret.", min_length=1, max_length=253)


class SecurityContext(Model):
    """How a pod's processes run. The defaults lock the pod down: a non-root user, no privilege escalation,
    every capability dropped, the runtime's default seccomp profile and a read-only root filesystem (the
    pods write only to /tmp, an emptyDir, and their volumes)."""

    run_as_user: int = Field(1000, description="UID of the containers' processes (the worker image's user).", ge=0)
    run_as_group: int = Field(1000, description="GID of the containers' processes.", ge=0)
    # A fresh claim's filesystem is root's: without fsGroup the pods (uid 1000) cannot write checkpoints to it.
    # Always set: `kubectl apply` drops a null, so the default would come back.
    fs_group: int = Field(
        1000,
        description=(
            "Group that owns the pod's volumes (the kubelet sets it on volumes that support it, as most claims "
            "do), so that the pods can write a fresh claim's filesystem."
        ),
        ge=0,
    )
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] = Field(
        "OnRootMismatch",
        description=(
            "When the kubelet sets fsGroup on a volume's files: OnRootMismatch only where the volume's root "
            "differs (a large checkpoint or model claim is not walked at every pod start)."
        ),
    )
    run_as_non_root: bool = Field(True, description="The kubelet refuses to start a container that would run as root.")
    read_only_root_filesystem: bool = Field(True, description="Mount the image's filesystem read-only.")
    allow_privilege_escalation: bool = Field(False, description="Let a process gain more privileges than its parent.")
    capabilities_add: list[str] = Field(
        default_factory=list,
        description="Linux capabilities added back (every one is dropped), e.g. IPC_LOCK for RDMA.",
        max_length=64,
    )
    seccomp_profile: Literal["RuntimeDefault", "Unconfined"] = Field(
        "RuntimeDefault", description="The seccomp profile of the pod."
    )

    @model_validator(mode="after")
    def _non_root(self) -> SecurityContext:
        if self.run_as_non_root and self.run_as_user == 0:
            raise FieldRuleError("runAsUser", "is 0 (root) but runAsNonRoot is true")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel("!self.runAsNonRoot || self.runAsUser != 0", "runAsUser 0 (root) needs runAsNonRoot false")
        )
    }

    def pod_fields(self) -> dict[str, Any]:
        """The pod's securityContext."""
        out: dict[str, Any] = {
            "runAsNonRoot": self.run_as_non_root,
            "runAsUser": self.run_as_user,
            "runAsGroup": self.run_as_group,
            "seccompProfile": {"type": self.seccomp_profile},
        }
        out.update(fsGroup=self.fs_group, fsGroupChangePolicy=self.fs_group_change_policy)
        return out

    def container_fields(self) -> dict[str, Any]:
        """A container's securityContext."""
        capabilities: dict[str, Any] = {"drop": ["ALL"]}
        if self.capabilities_add:
            capabilities["add"] = list(self.capabilities_add)
        return {
            "allowPrivilegeEscalation": self.allow_privilege_escalation,
            "readOnlyRootFilesystem": self.read_only_root_filesystem,
            "capabilities": capabilities,
        }


class Placement(Model):
    """Scheduling fields shared by every pool."""

    security_context: SecurityContext | None = Field(
        None, description="How the pool's pods run; unset: spec.securityContext."
    )

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels the pool's pods require (one GPU pool per label set).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Tolerations of the pool's pods.", max_length=32
    )
    resources: Resources = Field(default_factory=Resources, description="Extra resource requests and limits.")
    cpus: float = Field(1.0, description="CPU cores each replica needs (also its Ray CPU resource).", gt=0)
    shm_size: str | None = Field(
        None,
        description=(
            "Size of the pool's /dev/shm (a memory-backed emptyDir; the container runtime's own is 64 MiB), e.g. "
            "8Gi. Unset: for the rollout engines vllm and sglang 32Gi per GPU, at least 4Gi (a replica stages a "
            "pulled policy version there whole: 2 bytes a parameter); else 1Gi per GPU of a pod with several "
            "(NCCL's buffers between local ranks), or 256Mi. A cap, not a request: what is written there counts "
            "against the pod's memory limit (set memory in resources with room for it)."
        ),
        pattern=SHM_SIZE_PATTERN,
    )
    max_restarts: int = Field(
        3,
        description=(
            "How many times a replica of this pool (a trainer rank: the trainer group) that dies is replaced in one "
            "run; past that the run fails, naming the replica and the checkpoint to resume from."
        ),
        ge=0,
        le=1000,
    )
