"""Where a pool's pods run: node selection, tolerations, resources, volumes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .base import FieldRuleError, Model, cel, cel_rules

# A Kubernetes quantity: "500m", "16Gi", 4.
Quantity = str | int


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


class VolumeSource(Model):
    """A PersistentVolumeClaim mounted into the pods that need it (model weights, data, checkpoints)."""

    claim_name: str = Field(description="Name of the PersistentVolumeClaim.", min_length=1, max_length=253)
    mount_path: str = Field("/mnt/rljob", description="Where the claim is mounted in the pods.", max_length=4096)
    read_only: bool = Field(True, description="Mount read-only.")


class SecurityContext(Model):
    """How a pod's processes run. The defaults lock the pod down: a non-root user, no privilege escalation,
    every capability dropped, the runtime's default seccomp profile and a read-only root filesystem (the
    pods write only to /tmp, an emptyDir, and their volumes)."""

    run_as_user: int = Field(1000, description="UID of the containers' processes (the worker image's user).", ge=0)
    run_as_group: int = Field(1000, description="GID of the containers' processes.", ge=0)
    fs_group: int | None = Field(None, description="Group that owns the pod's volumes, when they support it.", ge=0)
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
        if self.fs_group is not None:
            out["fsGroup"] = self.fs_group
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
    max_restarts: int = Field(
        3,
        description=(
            "How many times a replica of this pool (a trainer rank: the trainer group) that dies is replaced in one "
            "run; past that the run fails, naming the replica and the checkpoint to resume from."
        ),
        ge=0,
        le=1000,
    )
