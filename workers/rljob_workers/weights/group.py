"""A collective group for weight broadcasts that stays out of torch.distributed's global state.

The trainer may already run DDP/FSDP on torch's default process group, and
`init_process_group` / `new_group` only know that one world: every group must be a
subset of it, so rollout replicas could never join. Instead each member builds the
backend (ProcessGroupGloo / ProcessGroupNCCL) directly from a store: the public
constructors torch exports as `torch.distributed.ProcessGroupGloo(store, rank, size,
timeout)` and `torch.distributed.ProcessGroupNCCL(store, rank, size, options)`. That is
the same shape as vLLM's stateless process group, and it avoids
`distributed_c10d._new_process_group_helper`, a private helper whose signature changes
between releases and which registers the group in the global maps anyway. The backend
object's own collectives (`broadcast`, `barrier`) are stable pybind methods.

Rank 0 (the trainer) hosts a TCPStore; every key goes through a PrefixStore named after
the group id, so a group re-formed after a replica dies or joins (a new id, same store)
never reads a stale key of the old one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal, Protocol, cast

import torch
import torch.distributed as dist
from torch import Tensor

from rljob.v1 import rollout_service_pb2 as pb

BackendName = Literal["gloo", "nccl"]


class Impl(Protocol):
    """What we call on a c10d backend object (ProcessGroupGloo / ProcessGroupNCCL). torch's
    stubs declare these collectives only on ProcessGroup, though every Backend binds them."""

    def broadcast(self, tensors: list[Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...
    def barrier(self, opts: dist.BarrierOptions) -> dist.Work: ...
    def shutdown(self) -> None: ...


KEY_PREFIX = "rljob/weights"
_FROM_PROTO: dict[int, BackendName] = {pb.WEIGHT_BACKEND_GLOO: "gloo", pb.WEIGHT_BACKEND_NCCL: "nccl"}


def bucket_device(backend: BackendName, weights_device: str | torch.device) -> torch.device:
    """Where a group's buckets live: NCCL moves CUDA tensors (the weights' own GPU), gloo CPU ones
    (weights on a GPU are staged through host memory). NCCL for weights on the CPU is refused."""
    device = torch.device(weights_device)
    if backend == "gloo":
        return torch.device("cpu")
    check_pairing(backend, device)
    return device


def check_pairing(backend: BackendName, device: str | torch.device) -> None:
    """Refuse buckets on a device the backend cannot move (NCCL: CUDA only; gloo: here, the CPU only),
    naming both, before any member connects."""
    device = torch.device(device)
    wanted = "cuda" if backend == "nccl" else "cpu"
    if device.type != wanted:
        other = "gloo" if device.type == "cpu" else "nccl"
        raise ValueError(
            f"weight group backend {backend!r} carries {wanted} buckets, but these are on {device}: "
            f"use {other} for weights on {device.type}"
        )


def host_store(host: str, port: int = 0, timeout: float = 300.0) -> dist.TCPStore:
    """Rank 0's rendezvous store. Port 0 lets the OS pick a free port at bind time (no
    probe-then-bind race); read the chosen one back from `.port` to send to the replicas."""
    # wait_for_workers=False: the members connect later, when each handles JoinWeightGroup.
    return dist.TCPStore(host, port, None, True, timedelta(seconds=timeout), wait_for_workers=False)


class WeightGroup:
    """One membership of the trainer (rank 0) and rollout replicas, for broadcasting weight buckets."""

    def __init__(self, group_id: str, rank: int, world_size: int, backend: BackendName, impl: Impl) -> None:
        self.group_id = group_id
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self._impl: Impl | None = impl

    @classmethod
    def create(
        cls,
        group_id: str,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: BackendName = "gloo",
        timeout: float = 300.0,
        store: dist.Store | None = None,
        device: str | torch.device | None = None,
    ) -> WeightGroup:
        """Join group `group_id`; blocks until all world_size members have joined (gloo connects
        its full mesh here; NCCL connects on the first collective), so rank 0 calls it while the
        replicas handle JoinWeightGroup. Rank 0 passes the store it hosts (host_store) and keeps
        it for the groups that follow; without one it hosts a store on master_port itself. The
        other ranks connect to master_address:master_port. `device`: where this member's buckets are,
        refused at once if the backend cannot move them (see check_pairing)."""
        if device is not None:
            check_pairing(backend, device)
        if not group_id:
            raise ValueError("group_id must not be empty")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of world_size {world_size}")
        wait = timedelta(seconds=timeout)
        if store is None and rank == 0:
            store = host_store(master_address, master_port, timeout)
        elif store is None:
            store = dist.TCPStore(master_address, master_port, None, False, wait)
        scoped = dist.PrefixStore(f"{KEY_PREFIX}/{group_id}/", store)
        return cls(group_id, rank, world_size, backend, _make_backend(backend, scoped, rank, world_size, wait))

    @classmethod
    def from_request(
        cls, request: pb.JoinWeightGroupRequest, weights_device: str | torch.device | None = None
    ) -> WeightGroup:
        """The replica side of RolloutService.JoinWeightGroup; `weights_device`: where the replica's weights
        are (its buckets go where the backend moves them, see bucket_device)."""
        backend = _FROM_PROTO.get(request.backend)
        if backend is None:
            raise ValueError(f"JoinWeightGroupRequest.backend: unsupported value {request.backend}")
        device = None if weights_device is None else bucket_device(backend, weights_device)
        timeout = request.timeout_seconds if request.timeout_seconds > 0 else 300.0
        return cls.create(
            request.group_id,
            request.master_address,
            request.master_port,
            request.rank,
            request.world_size,
            backend,
            timeout,
            device=device,
        )

    def broadcast_async(self, tensor: Tensor, src: int = 0) -> dist.Work:
        """Start broadcasting `tensor` in place from rank `src`; wait() on the result.

        The tensor travels as raw bytes, so every dtype (bfloat16, bool, float8) crosses every
        backend, even where the backend has no reduction kernels for it."""
        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor; it is written in place")
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        return self._backend().broadcast([tensor.view(-1).view(torch.uint8)], opts)

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        self.broadcast_async(tensor, src).wait()

    def barrier(self) -> None:
        self._backend().barrier(dist.BarrierOptions()).wait()

    def close(self) -> None:
        """Release the group's connections; idempotent. The store belongs to whoever made it."""
        impl, self._impl = self._impl, None
        if impl is not None:
            impl.shutdown()

    def _backend(self) -> Impl:
        if self._impl is None:
            raise RuntimeError(f"weight group {self.group_id!r} is closed")
        return self._impl

    def __repr__(self) -> str:
        return f"WeightGroup({self.group_id!r}, rank={self.rank}, world_size={self.world_size}, {self.backend})"


def _make_backend(backend: BackendName, store: dist.Store, rank: int, size: int, timeout: timedelta) -> Impl:
    if backend == "gloo":
        return cast(Impl, dist.ProcessGroupGloo(store, rank, size, timeout))
    if backend == "nccl":
        # Uses the current CUDA device: the caller sets it (torch.cuda.set_device) before joining.
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs a CUDA device; use 'gloo' on CPUs")
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return cast(Impl, dist.ProcessGroupNCCL(store, rank, size, options))
    raise ValueError(f"unknown backend {backend!r}; expected 'gloo' or 'nccl'")
