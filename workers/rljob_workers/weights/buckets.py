"""Flat weight buckets: plan them, pack parameters into them, unpack views out of them.

A bucket is one flat 1-D tensor of a single dtype that holds several parameters back to
back. Moving a few large buckets instead of hundreds of small tensors is what makes a
collective broadcast run at transport speed. Everything here is pure: plans are plain
frozen data computed from names, dtypes and shapes, so the trainer and every replica
derive or exchange the same plan and agree on every byte offset.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rljob.v1 import rollout_service_pb2 as pb


@dataclass(frozen=True)
class TensorSlot:
    """Where one parameter lives inside its bucket (offset and numel in elements)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True)
class BucketPlan:
    """One flat bucket: its dtype, its length in elements and the parameters it holds, in order."""

    dtype: torch.dtype
    numel: int
    tensors: tuple[TensorSlot, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16", the spelling the protos use."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The inverse of dtype_name; ValueError names an unknown dtype."""
    dtype = getattr(torch, name, None) if name and not name.startswith("_") else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def plan_buckets(specs: Iterable[tuple[str, torch.dtype, Sequence[int]]], bucket_bytes: int) -> list[BucketPlan]:
    """Group (name, dtype, shape) triples into buckets of one dtype and at most bucket_bytes each.

    Each dtype has one open bucket; a parameter that would overflow it closes it first, so
    interleaved dtypes (float32 norms between bfloat16 matrices) do not shatter into tiny
    buckets. A parameter larger than bucket_bytes gets a bucket of its own. Buckets are
    ordered by their first parameter and hold parameters in the order given, so one state
    dict always yields the same plan.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    closed: list[_Open] = []
    open_: dict[torch.dtype, _Open] = {}
    seen: set[str] = set()
    for index, (name, dtype, shape) in enumerate(specs):
        if name in seen:
            raise ValueError(f"parameter {name!r} appears twice")
        seen.add(name)
        dims = tuple(int(d) for d in shape)
        numel = math.prod(dims)
        if numel * dtype.itemsize > bucket_bytes:
            # Alone in its own bucket; the open bucket of its dtype stays open for what follows.
            closed.append(_Open(index, dtype, [TensorSlot(name, dtype, dims, 0, numel)], numel))
            continue
        bucket = open_.get(dtype)
        if bucket is not None and (bucket.numel + numel) * dtype.itemsize > bucket_bytes:
            closed.append(open_.pop(dtype))
        bucket = open_.setdefault(dtype, _Open(index, dtype))
        bucket.slots.append(TensorSlot(name, dtype, dims, bucket.numel, numel))
        bucket.numel += numel
    closed.extend(open_.values())
    return [bucket.plan() for bucket in sorted(closed, key=lambda bucket: bucket.first)]


@dataclass
class _Open:
    """A bucket being filled by plan_buckets; `first` is the index of its first parameter."""

    first: int
    dtype: torch.dtype
    slots: list[TensorSlot] = field(default_factory=list)
    numel: int = 0

    def plan(self) -> BucketPlan:
        return BucketPlan(self.dtype, self.numel, tuple(self.slots))


def plan_for(named_tensors: Iterable[tuple[str, Tensor]], bucket_bytes: int) -> list[BucketPlan]:
    """plan_buckets for tensors at hand (a state dict's items or named_parameters())."""
    return plan_buckets(((name, t.dtype, tuple(t.shape)) for name, t in named_tensors), bucket_bytes)


def pack(
    plan: BucketPlan, tensors: Mapping[str, Tensor], out: Tensor | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """Copy the plan's parameters into one flat tensor (`out`, or a new one on `device`); one copy per parameter."""
    flat = torch.empty(plan.numel, dtype=plan.dtype, device=device) if out is None else out
    if flat.dtype != plan.dtype or flat.shape != (plan.numel,):
        raise ValueError(f"bucket buffer is {flat.dtype}[{flat.numel()}], plan wants {plan.dtype}[{plan.numel}]")
    for slot in plan.tensors:
        source = tensors.get(slot.name)
        if source is None:
            raise KeyError(f"parameter {slot.name!r} of the plan is missing")
        if source.dtype != slot.dtype or tuple(source.shape) != slot.shape:
            got, want = f"{source.dtype}{list(source.shape)}", f"{slot.dtype}{list(slot.shape)}"
            raise ValueError(f"parameter {slot.name!r} is {got}, the plan says {want}")
        # Copying into a shaped view handles non-contiguous sources without a temporary.
        flat[slot.offset : slot.offset + slot.numel].view(slot.shape).copy_(source)
    return flat


def empty_buckets(plans: Iterable[BucketPlan], device: torch.device | str = "cpu") -> list[Tensor]:
    """Uninitialised flat buffers for the plans, to receive into."""
    return [torch.empty(plan.numel, dtype=plan.dtype, device=device) for plan in plans]


def unpack(plan: BucketPlan, flat: Tensor) -> dict[str, Tensor]:
    """Views of each parameter inside `flat`: no copy, they share its storage."""
    if flat.dtype != plan.dtype or flat.shape != (plan.numel,):
        raise ValueError(f"bucket is {flat.dtype}[{flat.numel()}], plan wants {plan.dtype}[{plan.numel}]")
    return {s.name: flat[s.offset : s.offset + s.numel].view(s.shape) for s in plan.tensors}


def to_proto(plan: BucketPlan) -> pb.Bucket:
    return pb.Bucket(
        dtype=dtype_name(plan.dtype),
        numel=plan.numel,
        tensors=[
            pb.TensorMeta(name=s.name, dtype=dtype_name(s.dtype), shape=s.shape, offset=s.offset, numel=s.numel)
            for s in plan.tensors
        ],
    )


def from_proto(message: pb.Bucket) -> BucketPlan:
    """A plan from the wire, checked so that a bad message fails here and not as a torn tensor."""
    dtype = dtype_from_name(message.dtype)
    slots = tuple(
        TensorSlot(m.name, dtype_from_name(m.dtype), tuple(m.shape), m.offset, m.numel) for m in message.tensors
    )
    end = 0
    for slot in slots:
        if slot.dtype != dtype:
            raise ValueError(f"tensor {slot.name!r} is {dtype_name(slot.dtype)} inside a {message.dtype} bucket")
        if slot.numel != math.prod(slot.shape) or slot.offset < end:
            raise ValueError(f"tensor {slot.name!r}: shape {list(slot.shape)} / offset {slot.offset} is inconsistent")
        end = slot.offset + slot.numel
    if end > message.numel:
        raise ValueError(f"bucket of {message.numel} elements is too small for its tensors ({end})")
    return BucketPlan(dtype, message.numel, slots)
