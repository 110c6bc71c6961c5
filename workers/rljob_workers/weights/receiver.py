"""Rollout side of the checkpoint engine: receive a version by broadcast or pull it as a chunk stream.

Both return tensors keyed by parameter name; the caller loads them into its engine at a
safe point. Nothing here touches the weights being served.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

import numpy as np
import torch
from torch import Tensor

from rljob.v1 import weight_service_pb2 as wpb
from rljob.v1 import weight_service_pb2_grpc as wgrpc
from rljob_workers.common.grpc_server import channel
from rljob_workers.weights.buckets import BucketPlan, dtype_from_name, empty_buckets, unpack
from rljob_workers.weights.group import WeightGroup


class WeightStreamError(RuntimeError):
    """A FetchWeights stream was short or inconsistent; the version must not be loaded."""


def receive_broadcast(
    group: WeightGroup,
    plans: Sequence[BucketPlan],
    device: torch.device | str = "cpu",
    out: Sequence[Tensor] | None = None,
) -> dict[str, Tensor]:
    """Receive one version broadcast by rank 0, bucket by bucket (publisher.publish(group=) or .broadcast).

    The tensors returned are views into the buckets: unpacking copies nothing. Buckets are
    new unless `out` (from empty_buckets) is given; a replica that copies each version into
    its engine can pass the same `out` every time and skip faulting in fresh pages, which on
    a CPU costs about as much as the transfer itself. The previous result is then overwritten.
    """
    buckets = empty_buckets(plans, device) if out is None else list(out)
    if len(buckets) != len(plans):
        raise ValueError(f"{len(buckets)} buffers for {len(plans)} buckets")
    tensors: dict[str, Tensor] = {}
    for plan, flat in zip(plans, buckets, strict=True):
        tensors.update(unpack(plan, flat))  # checks every buffer against its plan before anything arrives
    # All receives are posted at once: the next bucket's is ready when the current one ends, and
    # new buckets fault their pages in while earlier ones stream (benchmarks/weight_sync).
    pending = [group.broadcast_async(flat, src=0) for flat in buckets]
    for work in pending:
        group.wait(work)
    return tensors


async def pull_weights(
    address: str,
    min_version: int = 0,
    device: torch.device | str = "cpu",
    max_chunk_bytes: int = 0,
    timeout: float | None = None,
    token: str | None = None,
) -> tuple[int, dict[str, Tensor]]:
    """Fetch the newest version ≥ min_version from the WeightService at address (host:port).

    A missing version is the server's FAILED_PRECONDITION (grpc.aio.AioRpcError); a stream
    that is short or contradicts itself raises WeightStreamError."""
    assembly = _Assembly(address, min_version)
    request = wpb.FetchWeightsRequest(min_version=min_version, max_chunk_bytes=max_chunk_bytes)
    async with channel(address, token) as ch:
        async for chunk in wgrpc.WeightServiceStub(ch).FetchWeights(request, timeout=timeout):
            assembly.add(chunk)
    version, tensors = assembly.finish()
    return version, {name: tensor.to(device) for name, tensor in tensors.items()}


@dataclass
class _Partial:
    """One tensor being filled from its chunks, in order."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    raw: Tensor  # uint8, total_bytes long
    filled: int = 0

    @property
    def complete(self) -> bool:
        return self.filled == self.raw.numel()


class _Assembly:
    """Checks every chunk against what the stream said before: one version, one tensor_count,
    chunks of a tensor contiguous and in order, sizes matching dtype and shape."""

    def __init__(self, address: str, min_version: int) -> None:
        self.where = f"FetchWeights from {address}"
        self.min_version = min_version
        self.version: int | None = None
        self.count = 0
        self.parts: dict[str, _Partial] = {}
        self.current: str | None = None

    def add(self, chunk: wpb.FetchWeightsResponse) -> None:
        self._check_header(chunk)
        part = self.parts.get(chunk.name)
        if part is None:
            part = self._start(chunk)
        elif chunk.name != self.current:
            self._fail(f"tensor {chunk.name!r} resumed after another tensor began")
        if chunk.offset != part.filled or chunk.offset + len(chunk.data) > part.raw.numel():
            self._fail(
                f"tensor {chunk.name!r}: chunk at byte {chunk.offset} (+{len(chunk.data)}), expected {part.filled}"
            )
        part.raw.numpy()[chunk.offset : chunk.offset + len(chunk.data)] = np.frombuffer(chunk.data, np.uint8)
        part.filled += len(chunk.data)

    def finish(self) -> tuple[int, dict[str, Tensor]]:
        if self.version is None:
            self._fail("the stream ended before its first chunk")
        incomplete = [f"{n} ({p.filled}/{p.raw.numel()} bytes)" for n, p in self.parts.items() if not p.complete]
        if incomplete or len(self.parts) != self.count:
            self._fail(f"short stream: {len(self.parts)} of {self.count} tensors, incomplete: {incomplete or 'none'}")
        return self.version, {name: p.raw.view(p.dtype).view(p.shape) for name, p in self.parts.items()}

    def _check_header(self, chunk: wpb.FetchWeightsResponse) -> None:
        if self.version is None:
            if chunk.version < self.min_version or chunk.tensor_count <= 0:
                self._fail(f"stream of version {chunk.version} with {chunk.tensor_count} tensors")
            self.version, self.count = chunk.version, chunk.tensor_count
        elif (chunk.version, chunk.tensor_count) != (self.version, self.count):
            self._fail(
                f"chunk of {chunk.name!r} says version {chunk.version} / {chunk.tensor_count} tensors, "
                f"the stream began with {self.version} / {self.count}"
            )

    def _start(self, chunk: wpb.FetchWeightsResponse) -> _Partial:
        if self.current is not None and not self.parts[self.current].complete:
            self._fail(f"tensor {self.current!r} ended early, before {chunk.name!r} began")
        try:
            dtype = dtype_from_name(chunk.dtype)
        except ValueError as exc:
            self._fail(f"tensor {chunk.name!r}: {exc}")
        shape = tuple(chunk.shape)
        if chunk.total_bytes != math.prod(shape) * dtype.itemsize:
            self._fail(f"tensor {chunk.name!r}: {chunk.total_bytes} bytes cannot be {chunk.dtype}{list(shape)}")
        if len(self.parts) >= self.count:
            self._fail(f"tensor {chunk.name!r} is one more than the announced {self.count}")
        part = _Partial(dtype, shape, torch.empty(chunk.total_bytes, dtype=torch.uint8))
        self.parts[chunk.name] = part
        self.current = chunk.name
        return part

    def _fail(self, message: str) -> NoReturn:
        raise WeightStreamError(f"{self.where}: {message}")
