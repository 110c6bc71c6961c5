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

A member that dies mid-join or mid-broadcast is not noticed by gloo's other members: they wait
for it until the group's timeout (weightSync.timeoutSeconds, minutes), and neither `abort()` nor
`shutdown()` of a ProcessGroupGloo interrupts a collective in progress. So every member waits in
short slices and between slices reads the group's abort key from the store: whoever learns
that a member is gone (the controller, through the trainer) sets it with `abort`, and every
member's join or broadcast then fails at once with WeightGroupAborted.
"""

from __future__ import annotations

import contextlib
import threading
import time
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
ABORT_KEY = "aborted"
ARRIVED_KEY = "arrived"
POLL_SECONDS = 0.2  # how long a member waits between reads of the abort key
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


class WeightGroupAborted(RuntimeError):
    """The group was aborted (a member is gone): this join or broadcast will never complete."""


def scoped_store(store: dist.Store, group_id: str) -> dist.PrefixStore:
    return dist.PrefixStore(f"{KEY_PREFIX}/{group_id}/", store)


def abort(store: dist.Store, group_id: str, reason: str) -> None:
    """Fail every member's join or broadcast in group `group_id` now (see the module's docstring)."""
    _set_abort(scoped_store(store, group_id), reason)


def _set_abort(scoped: dist.Store, reason: str) -> None:
    if not scoped.check([ABORT_KEY]):  # the first reason is the one to report
        scoped.set(ABORT_KEY, reason)


def _check_aborted(store: dist.Store, group_id: str) -> None:
    if store.check([ABORT_KEY]):
        reason = store.get(ABORT_KEY).decode(errors="replace")
        raise WeightGroupAborted(f"weight group {group_id!r} was aborted: {reason}")


def _arrive(store: dist.Store, group_id: str, world_size: int, timeout: float) -> None:
    """Wait until all world_size members reached the group, or it is aborted. gloo's own rendezvous (in
    the backend's constructor) cannot be interrupted, so it starts only once every member is here."""
    deadline = time.monotonic() + timeout
    arrived = store.add(ARRIVED_KEY, 1)
    while arrived < world_size:
        _check_aborted(store, group_id)
        if time.monotonic() >= deadline:
            raise TimeoutError(f"weight group {group_id!r}: {arrived} of {world_size} members joined in {timeout:g} s")
        time.sleep(0.01)
        arrived = store.add(ARRIVED_KEY, 0)


class WeightGroup:
    """One membership of the trainer (rank 0) and rollout replicas, for broadcasting weight buckets."""

    def __init__(
        self,
        group_id: str,
        rank: int,
        world_size: int,
        backend: BackendName,
        impl: Impl,
        store: dist.Store | None = None,
    ) -> None:
        self.group_id = group_id
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self._impl: Impl | None = impl
        self._store = store  # the group's scoped store, where its abort key is; None: cannot be aborted
        self._unfinished: dist.Work | None = None  # an operation given up on when the group was aborted

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
        scoped = scoped_store(store, group_id)
        _arrive(scoped, group_id, world_size, timeout)
        return cls(group_id, rank, world_size, backend, _make_backend(backend, scoped, rank, world_size, wait), scoped)

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
        self.wait(self.broadcast_async(tensor, src))

    def barrier(self) -> None:
        self.wait(self._backend().barrier(dist.BarrierOptions()))

    def wait(self, work: dist.Work) -> None:
        """Wait for one of this group's operations; WeightGroupAborted as soon as the group is aborted."""
        if self.backend != "gloo" or self._store is None:
            # NCCL's wait() only orders the CUDA stream; its own watchdog ends a collective that hangs.
            work.wait()
            return
        while True:
            try:
                work.wait(timedelta(seconds=POLL_SECONDS))
                return
            except RuntimeError:  # the slice ran out, or the operation ended (failed, or just now)
                ended = work.is_completed()
                failed = _own_failure(work) if ended else None
                if ended and failed is None:
                    return
            try:
                _check_aborted(self._store, self.group_id)
            except WeightGroupAborted as aborted:
                # An aborted group is done: its backend goes now, so that only the release thread holds it (a
                # process that exits holding it waits out the group's timeout). The abort's reason is the
                # cause to report, also where the operation failed first (a member that aborted closes).
                self._unfinished = None if failed else work
                self.close()
                raise aborted from failed
            if failed is not None:
                raise failed

    def abort(self, reason: str) -> None:
        """Fail every member's operations in this group now (see the module's docstring)."""
        if self._store is not None:
            _set_abort(self._store, reason)

    def close(self) -> None:
        """Release the group's connections; idempotent. The store belongs to whoever made it."""
        impl, self._impl = self._impl, None
        if impl is None:
            return
        impl.shutdown()
        unfinished, self._unfinished = self._unfinished, None
        if unfinished is not None:
            # The backend's destructor joins its threads, and the one in the aborted collective runs until the
            # group's timeout: the last reference is dropped on a thread of its own once it ended, never here.
            held = [impl]
            del impl
            threading.Thread(
                target=_release_when_done,
                args=(unfinished, held),
                name=f"release-weight-group-{self.group_id}",
                daemon=True,
            ).start()

    def _backend(self) -> Impl:
        if self._impl is None:
            raise RuntimeError(f"weight group {self.group_id!r} is closed")
        return self._impl

    def __repr__(self) -> str:
        return f"WeightGroup({self.group_id!r}, rank={self.rank}, world_size={self.world_size}, {self.backend})"


def _own_failure(work: dist.Work) -> RuntimeError | None:
    """A completed operation's own error, None when it succeeded: a slice of `wait` can run out just as the
    operation ends, and gloo's "Operation timed out!" is then no verdict on it (taken as one, a trainer's broadcast
    would fail the run while its replica had taken the version)."""
    try:
        work.wait()
    except RuntimeError as error:
        return error
    return None


def _release_when_done(work: dist.Work, held: list[Impl]) -> None:
    with contextlib.suppress(RuntimeError):  # the group's timeout: the collective has ended
        work.wait()
    held.clear()


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
