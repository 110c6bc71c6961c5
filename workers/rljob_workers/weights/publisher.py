"""Trainer side of the checkpoint engine: versioned snapshots in flat buckets, broadcast and served.

`publish` packs the current parameters into the plan's flat buckets; those buckets are the
version's snapshot, served as they are by both transports: `broadcast` sends each bucket
over a WeightGroup, and WeightServicer streams the tensors as chunks to a replica that
pulls. The plan is fixed by the first publish; a later one with other parameters fails.

Snapshots are immutable once published. A new version is packed into buffers nobody
reads and then swapped in, so a FetchWeights stream that started on version v keeps
sending v however many versions are published meanwhile. The buffers are recycled, not
reallocated every step (fresh pages cost about as much as the pack copy itself on CPU):
the superseded snapshot becomes the spare for the next publish, but only if no stream
still holds it; otherwise the next publish allocates and the old one is freed when its
last reader finishes. Plain double buffering without this reader count would let a
slow stream read a buffer that the version after next is being written into.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import grpc
import torch
from torch import Tensor

from rljob.v1 import weight_service_pb2 as wpb
from rljob.v1 import weight_service_pb2_grpc as wgrpc
from rljob_workers.common.grpc_server import MAX_MESSAGE_BYTES, Service
from rljob_workers.weights.buckets import BucketPlan, TensorSlot, dtype_name, pack, plan_for
from rljob_workers.weights.group import WeightGroup

# Bucket size when none is given. On CPU (gloo), small buckets of 8 MiB (benchmarks/weight_sync): packing
# bucket i+1 overlaps sending bucket i from the first bucket on, and a replica receiving into new
# buckets is faster in small pieces than in large ones; the extra collectives this makes cost
# little. On CUDA (NCCL) larger messages are needed to reach bus bandwidth and the caching
# allocator makes buffers cheap; 256 MiB there is the usual choice, not measured here.
CPU_BUCKET_BYTES = 8 * 1024 * 1024
CUDA_BUCKET_BYTES = 256 * 1024 * 1024
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
SERVICE_NAME = wpb.DESCRIPTOR.services_by_name["WeightService"].full_name
# Leaves room for the chunk's header fields under the gRPC message limit.
MAX_CHUNK_BYTES = MAX_MESSAGE_BYTES - 1024 * 1024
# A FetchWeights stream whose reader takes no chunk for this long is stalled, and one may take this long in
# all (a whole model over a slow link): past either, it ends DEADLINE_EXCEEDED and lets its snapshot go, so
# a stuck reader cannot pin a version's buffers (a whole model's memory) for ever.
STALL_SECONDS = 60.0
FETCH_DEADLINE_SECONDS = 1800.0


class NoVersionError(LookupError):
    """No published version is new enough."""


@dataclass(eq=False)
class Snapshot:
    """One published version: the plan's buckets, filled. Never written once published."""

    version: int
    plans: tuple[BucketPlan, ...]
    buckets: tuple[Tensor, ...]
    readers: int = 0  # streams and broadcasts holding it; guarded by the publisher's lock

    def tensors(self) -> Iterator[tuple[TensorSlot, Tensor]]:
        """Each parameter as a flat view into its bucket, in plan order."""
        for plan, bucket in zip(self.plans, self.buckets, strict=True):
            for slot in plan.tensors:
                yield slot, bucket[slot.offset : slot.offset + slot.numel]

    @property
    def tensor_count(self) -> int:
        return sum(len(plan.tensors) for plan in self.plans)


class WeightPublisher:
    """Holds the newest published version. One thread publishes; any number of threads and streams read."""

    def __init__(self, bucket_bytes: int | None = None, device: torch.device | str = "cpu") -> None:
        """Buckets of at most bucket_bytes (default: by device type, see CPU_BUCKET_BYTES), kept on `device`."""
        self.device = torch.device(device)
        default = CUDA_BUCKET_BYTES if self.device.type == "cuda" else CPU_BUCKET_BYTES
        self.bucket_bytes = default if bucket_bytes is None else bucket_bytes
        self._lock = threading.Lock()
        self._plans: tuple[BucketPlan, ...] | None = None
        self._latest: Snapshot | None = None
        self._spare: Snapshot | None = None

    @classmethod
    def for_bucket_mb(cls, size_mb: int | None, device: torch.device | str) -> WeightPublisher:
        """From a spec's `weightSync.bucketSizeMb`: unset, the device's own default."""
        return cls(None if size_mb is None else size_mb * 1024 * 1024, device)

    @property
    def plan(self) -> list[BucketPlan]:
        """The bucket plan, fixed by the first publish (replicas need it to receive a broadcast)."""
        if self._plans is None:
            raise RuntimeError("no version published yet, so there is no bucket plan")
        return list(self._plans)

    @property
    def latest_version(self) -> int:
        """Newest published version; -1 when none is."""
        latest = self._latest
        return -1 if latest is None else latest.version

    def publish(
        self, version: int, named_tensors: Iterable[tuple[str, Tensor]], group: WeightGroup | None = None
    ) -> None:
        """Snapshot the parameters as `version`. With `group`, each bucket is broadcast as soon as it
        is packed, so packing the next bucket overlaps sending this one (the replicas run
        receive_broadcast meanwhile); without, call broadcast() later or let replicas pull."""
        if version < 0 or version <= self.latest_version:
            raise ValueError(f"version {version} is not newer than the published {self.latest_version}")
        tensors = {name: tensor.detach() for name, tensor in named_tensors}
        plans = self._check_plan(tensors)
        buffers = self._take_spare()
        buckets, pending = [], []
        with _closed_on_failure(group), torch.no_grad():
            for i, plan in enumerate(plans):
                buckets.append(pack(plan, tensors, None if buffers is None else buffers[i], self.device))
                if group is not None:
                    pending.append(group.broadcast_async(buckets[-1]))
            if group is not None:
                for work in pending:
                    group.wait(work)
        snapshot = Snapshot(version, plans, tuple(buckets))
        with self._lock:
            self._latest, self._spare = snapshot, self._latest

    def broadcast(self, group: WeightGroup) -> int:
        """Broadcast every bucket of the newest version from rank 0, in plan order; returns the version."""
        with self.acquire() as snapshot, _closed_on_failure(group):
            for bucket in snapshot.buckets:
                group.broadcast(bucket)
            return snapshot.version

    def hold(self, min_version: int = 0) -> Snapshot:
        """Take a reader's hold on the newest version ≥ min_version (NoVersionError if none); release() it."""
        with self._lock:
            snapshot = self._latest
            if snapshot is None or snapshot.version < min_version:
                have = "none is published" if snapshot is None else f"the newest is {snapshot.version}"
                raise NoVersionError(f"no weights of version ≥ {min_version}: {have}")
            snapshot.readers += 1
            return snapshot

    def release(self, snapshot: Snapshot) -> None:
        with self._lock:
            snapshot.readers -= 1

    @contextmanager
    def acquire(self, min_version: int = 0) -> Iterator[Snapshot]:
        """hold() for the duration of a with block."""
        snapshot = self.hold(min_version)
        try:
            yield snapshot
        finally:
            self.release(snapshot)

    def _check_plan(self, tensors: dict[str, Tensor]) -> tuple[BucketPlan, ...]:
        plans = tuple(plan_for(tensors.items(), self.bucket_bytes))
        if self._plans is None:
            self._plans = plans
        elif plans != self._plans:
            raise ValueError("the parameters (names, dtypes or shapes) differ from the first published version")
        return plans

    def _take_spare(self) -> tuple[Tensor, ...] | None:
        with self._lock:
            spare, self._spare = self._spare, None
        # A superseded snapshot can gain no new readers, so readers == 0 stays true.
        return spare.buckets if spare is not None and spare.readers == 0 else None


# FetchWeightsResponse.data is field 6, length-delimited (wire type 2).
_DATA_TAG = bytes([6 << 3 | 2])


def iter_chunks(snapshot: Snapshot, chunk_bytes: int) -> Iterator[bytes]:
    """Every tensor of the snapshot as serialized FetchWeightsResponse messages of at most
    chunk_bytes of data each, tensor after tensor.

    The small fields go through protobuf; `data` is appended as its encoded field straight
    from the tensor's memory. A parser reads concatenated fields as one message, and this
    skips the two extra copies of every weight byte (into the message, then out of it)
    that building and serializing a FetchWeightsResponse would make.
    """
    count = snapshot.tensor_count
    for slot, flat in snapshot.tensors():
        raw = flat.cpu().view(torch.uint8).numpy().data
        header = wpb.FetchWeightsResponse(
            version=snapshot.version,
            name=slot.name,
            dtype=dtype_name(slot.dtype),
            shape=slot.shape,
            total_bytes=len(raw),
            tensor_count=count,
        )
        offsets = range(0, len(raw), chunk_bytes) if len(raw) else range(1)  # an empty tensor still gets a chunk
        for offset in offsets:
            data = raw[offset : offset + chunk_bytes]
            header.offset = offset
            yield b"".join((header.SerializeToString(), _DATA_TAG, _varint(len(data)), data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class WeightServicer(wgrpc.WeightServiceServicer):
    """rljob.v1.WeightService over a publisher: the pull path for replicas that join late or restart."""

    def __init__(
        self,
        publisher: WeightPublisher,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        stall_seconds: float = STALL_SECONDS,
        deadline_seconds: float = FETCH_DEADLINE_SECONDS,
    ) -> None:
        self.publisher = publisher
        self.chunk_bytes = chunk_bytes
        self.stall_seconds, self.deadline_seconds = stall_seconds, deadline_seconds

    async def FetchWeights(self, request: wpb.FetchWeightsRequest, context: grpc.aio.ServicerContext) -> None:
        """Write the newest version's chunks; each write is waited on (a reader that stops reading stops it, by
        HTTP/2 flow control), at most `stall_seconds`, the whole at most `deadline_seconds`."""
        if request.max_chunk_bytes < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_chunk_bytes must not be negative")
        chunk_bytes = min(request.max_chunk_bytes or self.chunk_bytes, MAX_CHUNK_BYTES)
        try:
            snapshot = self.publisher.hold(request.min_version)
        except NoVersionError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            return
        deadline, held = time.monotonic() + self.deadline_seconds, True
        try:
            for chunk in iter_chunks(snapshot, chunk_bytes):
                wait = max(min(self.stall_seconds, deadline - time.monotonic()), 0.0)
                write = asyncio.ensure_future(context.write(chunk))
                # asyncio.wait, not wait_for: a write held by flow control does not end when cancelled, and
                # wait_for would wait for it to end.
                done, _ = await asyncio.wait({write}, timeout=wait)
                if not done:
                    write.cancel()
                    # Let the version go first: the status cannot be sent while the write waits on the reader,
                    # so the call itself ends only when the reader goes or its own deadline passes.
                    self.publisher.release(snapshot)
                    held = False
                    stalled = wait >= self.stall_seconds
                    why = f"took no chunk for {wait:.0f} s" if stalled else f"ran past {self.deadline_seconds:g} s"
                    message = f"FetchWeights of version {snapshot.version}: the reader {why}"
                    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
                write.result()  # a write that failed (the client went away) ends the stream here
        finally:
            if held:  # also when the client cancels: the snapshot is free again
                self.publisher.release(snapshot)

    async def GetLatestVersion(
        self, request: wpb.GetLatestVersionRequest, context: grpc.aio.ServicerContext
    ) -> wpb.GetLatestVersionResponse:
        return wpb.GetLatestVersionResponse(version=self.publisher.latest_version)


def weight_service(publisher: WeightPublisher, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Service:
    """The WeightService for grpc_server.start_server."""
    return as_service(WeightServicer(publisher, chunk_bytes))


def as_service(servicer: WeightServicer) -> Service:
    """A WeightServicer (or subclass) for grpc_server.start_server."""
    return Service(_add_to_server, servicer, SERVICE_NAME)


def _add_to_server(servicer: WeightServicer, server: grpc.aio.Server) -> None:
    """The generated add_WeightServiceServicer_to_server, except that FetchWeights yields chunks
    already serialized (iter_chunks); a message it yields instead is serialized as usual."""
    handlers = {
        "FetchWeights": grpc.unary_stream_rpc_method_handler(
            servicer.FetchWeights,
            request_deserializer=wpb.FetchWeightsRequest.FromString,
            response_serializer=_serialized,
        ),
        "GetLatestVersion": grpc.unary_unary_rpc_method_handler(
            servicer.GetLatestVersion,
            request_deserializer=wpb.GetLatestVersionRequest.FromString,
            response_serializer=wpb.GetLatestVersionResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]  # as generated code does


def _serialized(message: bytes | wpb.FetchWeightsResponse) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


@contextmanager
def _closed_on_failure(group: WeightGroup | None) -> Iterator[None]:
    """Abort and close `group` if the broadcast fails: the other members would wait for buckets that will
    never come until the group's timeout (minutes); aborting fails their receives at once, so the group
    can be re-formed."""
    try:
        yield
    except BaseException as error:
        if group is not None:
            with suppress(Exception):  # the store may be gone with the failure
                group.abort(f"the trainer's broadcast failed: {type(error).__name__}: {error}"[:500])
            group.close()
        raise
