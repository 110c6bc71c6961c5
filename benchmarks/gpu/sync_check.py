"""The GPU check's weight-sync row: publish -> receive through the checkpoint engine against a raw
broadcast of the same bytes over the same group, to a second process, in one run.

Rank 0 (the calling process) publishes the trainer's weights with WeightPublisher (flat buckets,
each broadcast as soon as it is packed); the receiver does what the rollout server does,
receive_broadcast into new buckets and then onto its weights' device. The baseline is one tensor of
the same bytes from the same device, broadcast into a new buffer and moved the same way. Both are
timed as benchmarks/weight_sync times them: from a barrier of both members to a barrier after the
receiver holds the weights, the order alternating every repetition, the first one a warm-up.
Every version the receiver gets is checked against what was published.

Backends: NCCL (cuda:0 -> cuda:1) with two GPUs; with one, gloo with the sources on the GPU and the
receiver's copy moved onto it, since NCCL cannot pair two ranks on one GPU; on a CPU, gloo.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rljob_workers.weights.group import BackendName

HOST = "127.0.0.1"
GROUP_ID = "gpu-check"
TIMEOUT_S = 300


@dataclass(frozen=True)
class SyncResult:
    engine_s: float  # median seconds of publish -> receive
    raw_s: float  # median seconds of the raw broadcast
    nbytes: int
    buckets: int
    backend: str
    how: str  # the pairing, in words
    verified: bool  # the receiver got every published version


def device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def checksum(tensors: dict[str, torch.Tensor]) -> int:
    """The sum of every byte, tensor by tensor: tells one version from the next (each changes a weight)."""
    return sum(
        int(t.contiguous().view(-1).view(torch.uint8).sum(dtype=torch.int64)) for _, t in sorted(tensors.items())
    )


def plan_sync(device: torch.device) -> tuple[BackendName, str, str]:
    """(backend, the receiver's weights device, the pairing in words) for rank 0's `device`."""
    if device.type != "cuda":
        return "gloo", "cpu", "gloo on the CPU"
    if torch.cuda.device_count() >= 2:
        return "nccl", "cuda:1", "NCCL, cuda:0 -> cuda:1"
    return "gloo", "cuda:0", "one GPU, so gloo (NCCL needs two): sources on the GPU, the receiver copies onto it"


def order(rep: int) -> tuple[str, str]:
    """The two kinds, swapped every repetition so that neither always runs first."""
    return ("engine", "raw") if rep % 2 == 0 else ("raw", "engine")


def receiver(port: int, backend: Any, device: str, wire: list[bytes], nbytes: int, reps: int, out: Any) -> None:
    """The rollout replica, in its own process: the server's receive, then the raw one; its checksums to `out`."""
    from rljob.v1 import rollout_service_pb2 as pb
    from rljob_workers.weights import WeightGroup, from_proto, receive_broadcast
    from rljob_workers.weights.group import bucket_device

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    buckets_on = bucket_device(backend, device)
    out.put("joining")
    group = WeightGroup.create(GROUP_ID, HOST, port, 1, 2, backend, timeout=TIMEOUT_S, device=buckets_on)
    plans, sums = [from_proto(pb.Bucket.FromString(b)) for b in wire], []
    for rep in range(reps):
        for kind in order(rep):
            group.barrier()
            if kind == "engine":
                tensors = {n: t.to(device) for n, t in receive_broadcast(group, plans, buckets_on).items()}
            else:
                raw = torch.empty(nbytes, dtype=torch.uint8, device=buckets_on)
                group.broadcast(raw)
                raw = raw.to(device)
            device_sync(torch.device(device))
            group.barrier()
            if kind == "engine":
                sums.append(checksum(tensors))
    out.put(sums)
    group.close()


def send_raw(group: Any, raw: torch.Tensor, device: torch.device) -> None:
    """The baseline's send: the bytes onto the backend's device (a copy to the host for gloo), then broadcast."""
    group.broadcast(raw.to(device))


def timed(fn: Callable[[], Any], group: Any, device: torch.device) -> float:
    """Seconds from both members ready until the receiver holds the weights."""
    group.barrier()
    start = time.perf_counter()
    fn()
    device_sync(device)
    group.barrier()
    return time.perf_counter() - start


def wait_for_receiver(proc: Any, out: Any) -> None:
    """Until the receiver is about to join; one that dies first fails at once, not at the group's timeout."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            out.get(timeout=1)
            return
        except queue.Empty:
            if not proc.is_alive():
                raise RuntimeError(f"the receiver process exited with status {proc.exitcode} before joining") from None
    raise TimeoutError(f"the receiver process did not start within {TIMEOUT_S} s")


def measure_sync(weights: dict[str, torch.Tensor], reps: int) -> SyncResult:
    """`reps` timed transfers of each kind (one more as warm-up) of `weights` (modified in place: a
    marker element per version) to a receiver process."""
    from rljob_workers.weights import WeightGroup, WeightPublisher, host_store, to_proto
    from rljob_workers.weights.group import bucket_device

    source = next(iter(weights.values()))
    backend, remote, how = plan_sync(source.device)
    buckets_on = bucket_device(backend, source.device)
    publisher = WeightPublisher(device=buckets_on)
    publisher.publish(0, weights.items())  # fixes the plan the receiver needs
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    raw = torch.ones(nbytes, dtype=torch.uint8, device=source.device)
    store, ctx = host_store(HOST, timeout=TIMEOUT_S), mp.get_context("spawn")
    out = ctx.Queue()
    wire = [to_proto(p).SerializeToString() for p in publisher.plan]
    args = (store.port, backend, remote, wire, nbytes, reps + 1, out)
    proc = ctx.Process(target=receiver, args=args, daemon=True)
    proc.start()
    wait_for_receiver(proc, out)
    group = WeightGroup.create(GROUP_ID, HOST, store.port, 0, 2, backend, timeout=TIMEOUT_S, store=store)
    times: dict[str, list[float]] = {"engine": [], "raw": []}
    expected = []
    for rep in range(reps + 1):
        for kind in order(rep):
            if kind == "engine":
                source.view(-1)[0] = float(rep + 1)  # every version differs; the receiver proves it got each
                expected.append(checksum(weights))
                fn = partial(publisher.publish, rep + 1, weights.items(), group)
            else:
                fn = partial(send_raw, group, raw, buckets_on)
            times[kind].append(timed(fn, group, source.device))
    received = out.get(timeout=TIMEOUT_S)
    proc.join(timeout=60)
    group.close()
    engine_s, raw_s = (statistics.median(times[kind][1:]) for kind in ("engine", "raw"))
    return SyncResult(engine_s, raw_s, nbytes, len(publisher.plan), backend, how, received == expected)
