"""Where a pool's pods run: node selection, tolerations, resources, volumes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Model

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


class Placement(Model):
    """Scheduling fields shared by every pool."""

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
