"""Weight sync: the checkpoint engine against the raw broadcast of the same bytes, in one run.

Rank 0 (this process) holds a ~108 M parameter float32 state dict shaped like a small
transformer (BERT-base sizes, 195 tensors). For 1, 2 and 4 receiver processes on one gloo
group over loopback it times, with the order of the modes rotating every repetition:

- engine:       publisher.publish(v, params, group): pack into flat buckets (the version's
                snapshot), each bucket broadcast as soon as it is packed; the receivers
                run receive_broadcast(out=their buckets);
- engine-fresh: the same, receive_broadcast allocating new buckets (the rollout server's call);
- transfer:     publisher.broadcast(group) of the snapshot already published;
- pack:         publisher.publish(v, params) alone, the snapshot copy, nothing sent;
- raw:          baseline, one tensor of the same bytes over the same group into one buffer
                each receiver reuses; raw-fresh: into a new buffer every time;
- pull:         pull_weights over the WeightService chunk stream to one receiver process.

Each timing starts at a barrier of all members and ends at a barrier after every receiver
holds its tensors; every received version is checked against what was published.
Engine modes run once per --bucket-mb size, so sizes compare within one run.

    python benchmarks/weight_sync/run.py [--replicas 1 2 4] [--reps 5] [--bucket-mb 8 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import platform
import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.common.grpc_server import start_server
from rljob_workers.weights import (
    WeightGroup,
    WeightPublisher,
    empty_buckets,
    from_proto,
    host_store,
    pull_weights,
    receive_broadcast,
    to_proto,
    weight_service,
)

HOST = "127.0.0.1"


def make_model(vocab: int = 30522, dim: int = 768, layers: int = 12, ffn: int = 3072) -> dict[str, torch.Tensor]:
    """A BERT-base-sized float32 state dict: 200 tensors, about 108 M parameters."""
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (vocab, dim)}
    for i in range(layers):
        p = f"layers.{i}."
        for name in ("q", "k", "v", "o"):
            shapes[f"{p}attn.{name}.weight"] = (dim, dim)
            shapes[f"{p}attn.{name}.bias"] = (dim,)
        shapes |= {f"{p}norm1.weight": (dim,), f"{p}norm1.bias": (dim,)}
        shapes |= {f"{p}mlp.up.weight": (ffn, dim), f"{p}mlp.up.bias": (ffn,)}
        shapes |= {f"{p}mlp.down.weight": (dim, ffn), f"{p}mlp.down.bias": (dim,)}
        shapes |= {f"{p}norm2.weight": (dim,), f"{p}norm2.bias": (dim,)}
    shapes |= {"norm.weight": (dim,), "norm.bias": (dim,)}
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


def fingerprint(tensors: dict[str, torch.Tensor]) -> list[int]:
    """Exact per-tensor checksums (integer sums of the raw bits, so no rounding depends on memory layout)."""
    return [int(t.reshape(-1).view(torch.int32).sum(dtype=torch.int64)) for _, t in sorted(tensors.items())]


# What each mode times; engine modes exist once per bucket size ("engine@8MiB").
MODES = {
    "engine": "publish(v, params, group): snapshot copy overlapped with the broadcast; receivers reuse buckets",
    "engine-fresh": "the same, but receive_broadcast allocates new buckets (the rollout server's call)",
    "transfer": "broadcast(group) of the already published snapshot; receivers reuse buckets",
    "pack": "publish(v, params) alone: the snapshot copy on rank 0, nothing sent",
    "raw": "baseline: one tensor of the same bytes over the same group; receivers reuse one buffer",
    "raw-fresh": "baseline: the same into a new buffer on each receiver",
    "pull": "pull_weights over the WeightService chunk stream (4 MiB chunks), one receiver",
}
BASELINE = {"engine": "raw", "transfer": "raw", "engine-fresh": "raw-fresh", "pull": "raw-fresh"}


def mode_list(sizes: list[str]) -> list[str]:
    per_size = [f"{mode}@{size}" for size in sizes for mode in ("engine", "engine-fresh", "transfer", "pack")]
    return [*per_size, "raw", "raw-fresh"]


def order(modes: list[str], rep: int) -> list[str]:
    """The modes, rotated by one every repetition so that none always follows the same neighbour."""
    return modes[rep % len(modes) :] + modes[: rep % len(modes)]


def receiver(
    port: int, gid: str, rank: int, world: int, wires: dict[str, list[bytes]], reps: int, nbytes: int, out: Any
) -> None:
    """One rollout replica: every mode of every repetition, between two barriers; what it received is checked."""
    group = WeightGroup.create(gid, HOST, port, rank, world, "gloo", timeout=300)
    plans = {size: [from_proto(pb.Bucket.FromString(b)) for b in wire] for size, wire in wires.items()}
    buckets = {size: empty_buckets(p) for size, p in plans.items()}
    buffer, prints = torch.empty(nbytes, dtype=torch.uint8), []
    for rep in range(reps):
        for mode in order(mode_list(list(wires)), rep):
            kind, _, size = mode.partition("@")
            group.barrier()  # ready: rank 0 starts its clock
            if kind in ("engine", "transfer", "engine-fresh"):
                tensors = receive_broadcast(group, plans[size], out=None if kind == "engine-fresh" else buckets[size])
            elif kind.startswith("raw"):
                group.broadcast(buffer if kind == "raw" else torch.empty(nbytes, dtype=torch.uint8))
            group.barrier()
            if kind in ("engine", "transfer", "engine-fresh"):
                prints.append(fingerprint(tensors))
                del tensors
    out.put((rank, prints))
    group.close()


def pull_client(address: str, reps: int, out: Any) -> None:
    times, prints = [], []
    for _ in range(reps):
        start = time.perf_counter()
        _, tensors = asyncio.run(pull_weights(address))
        times.append(time.perf_counter() - start)
        prints.append(fingerprint(tensors))
        del tensors
    out.put((times, prints))


def timed(fn: Callable[[], None], group: WeightGroup) -> float:
    """Seconds from all members ready until fn() is done on rank 0 and every receiver holds its tensors."""
    group.barrier()
    start = time.perf_counter()
    fn()
    group.barrier()
    return time.perf_counter() - start


def bench_broadcast(
    model: dict[str, torch.Tensor], publishers: dict[str, WeightPublisher], replicas: int, reps: int
) -> dict[str, list[float]]:
    """Times (warm-up repetition dropped) of each mode for one group of `replicas` receivers."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = host_store(HOST, timeout=300)
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    wires = {size: [to_proto(p).SerializeToString() for p in pub.plan] for size, pub in publishers.items()}
    gid, world = f"bench-{replicas}", replicas + 1
    procs = [
        ctx.Process(target=receiver, args=(store.port, gid, r, world, wires, reps + 1, nbytes, out))
        for r in range(1, world)
    ]
    for p in procs:
        p.start()
    group = WeightGroup.create(gid, HOST, store.port, 0, world, "gloo", timeout=300, store=store)
    raw = torch.ones(nbytes, dtype=torch.uint8)
    modes = mode_list(list(publishers))
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    published = {size: fingerprint(model) for size in publishers}
    expected = []
    for rep in range(reps + 1):
        for mode in order(modes, rep):
            kind, _, size = mode.partition("@")
            times[mode].append(timed(partial(step, kind, publishers.get(size), model, group, raw), group))
            if kind in ("engine", "engine-fresh", "pack"):
                published[size] = fingerprint(model)
            if kind in ("engine", "engine-fresh", "transfer"):
                expected.append(published[size])
    for _ in procs:
        rank, prints = out.get(timeout=300)
        if prints != expected:
            raise AssertionError(f"receiver {rank} got different weights than were published")
    for p in procs:
        p.join()
    group.close()
    return {mode: ts[1:] for mode, ts in times.items()}


def step(
    kind: str, publisher: WeightPublisher | None, model: dict[str, torch.Tensor], group: WeightGroup, raw: torch.Tensor
) -> None:
    """Rank 0's side of one timed mode."""
    if publisher is None:
        group.broadcast(raw)
    elif kind == "transfer":
        publisher.broadcast(group)
    else:
        version = publisher.latest_version + 1
        model["embed.weight"][0, 0] = float(version)  # every version differs; receivers prove they got it
        publisher.publish(version, model.items(), None if kind == "pack" else group)


def bench_pull(publisher: WeightPublisher, reps: int, expected: list[int]) -> list[float]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = asyncio.run_coroutine_threadsafe(start_server([weight_service(publisher)]), loop).result()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=pull_client, args=(f"{HOST}:{server.port}", reps + 1, out))
    proc.start()
    times, prints = out.get(timeout=600)
    proc.join()
    asyncio.run_coroutine_threadsafe(server.stop(None), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    if any(p != expected for p in prints):
        raise AssertionError("the pulled weights differ from the published version")
    return times[1:]


def summarise(times: dict[tuple[str, int], list[float]], nbytes: int) -> list[dict[str, Any]]:
    """One row per (mode, replicas): median, GB/s of model bytes, ratio to its baseline, growth over 1 replica."""
    medians = {key: statistics.median(ts) for key, ts in times.items()}
    rows = []
    for (mode, replicas), median in medians.items():
        baseline = BASELINE.get(mode.partition("@")[0], "")
        base_times = times.get((baseline, replicas), [])
        base = medians.get((baseline, replicas))
        one = medians.get((mode, 1))
        paired = None
        if len(base_times) == len(times[(mode, replicas)]):
            # Same repetition, adjacent in time: robust to load that drifts between repetitions.
            paired = statistics.median(b / t for b, t in zip(base_times, times[(mode, replicas)], strict=True))
        rows.append(
            {
                "mode": mode,
                "replicas": replicas,
                "median_s": median,
                "gb_per_s": nbytes / median / 1e9,
                "baseline": baseline or None,
                "baseline_over_engine": None if base is None else base / median,
                "paired_ratio": paired,
                "vs_1_replica": None if one is None else median / one,
                "times_s": times[(mode, replicas)],
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "" if value is None else format(value, spec)

    header = f"{'mode':<20} {'replicas':>8} {'median s':>9} {'GB/s':>6} {'baseline':>10} {'ratio':>6} {'paired':>6}"
    lines = [header + f" {'vs 1 rep':>8}"]
    for r in rows:
        lines.append(
            f"{r['mode']:<20} {r['replicas']:>8} {r['median_s']:>9.3f} {r['gb_per_s']:>6.2f} "
            f"{r['baseline'] or '':>10} {fmt(r['baseline_over_engine'], '.2f'):>6} {fmt(r['paired_ratio'], '.2f'):>6} "
            f"{fmt(r['vs_1_replica'], '.2f'):>7}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per mode (one more as warm-up)")
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=None, help="bucket sizes (default: the engine's)")
    parser.add_argument("--no-pull", action="store_true", help="skip the WeightService pull row")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # rank 0 is one process among the receivers on the same cores

    model = make_model()
    nbytes = sum(t.numel() * t.element_size() for t in model.values())
    params = sum(t.numel() for t in model.values())
    sizes = [WeightPublisher().bucket_bytes] if args.bucket_mb is None else [mb * 2**20 for mb in args.bucket_mb]
    publishers = {f"{size >> 20}MiB": WeightPublisher(size) for size in sizes}
    for publisher in publishers.values():
        publisher.publish(0, model.items())
    buckets = ", ".join(f"{len(pub.plan)} of ≤ {size}" for size, pub in publishers.items())
    print(
        f"model: {len(model)} float32 tensors, {params / 1e6:.1f} M params, {nbytes / 1e6:.0f} MB; "
        f"buckets: {buckets}; {mp.cpu_count()} CPUs; {args.reps} timed repetitions",
        flush=True,
    )
    times: dict[tuple[str, int], list[float]] = {}
    for replicas in args.replicas:
        by_mode = bench_broadcast(model, publishers, replicas, args.reps)
        times |= {(mode, replicas): ts for mode, ts in by_mode.items()}
        print(f"  {replicas} replica(s) done", flush=True)
    if not args.no_pull:
        size, publisher = next(iter(publishers.items()))
        times[(f"pull@{size}", 1)] = bench_pull(publisher, args.reps, fingerprint(model))
    rows = summarise(times, nbytes)
    print(table(rows))
    if args.json:
        config: dict[str, Any] = {"params": params, "bytes": nbytes, "tensors": len(model), "bucket_bytes": sizes}
        config |= {"buckets": {size: len(pub.plan) for size, pub in publishers.items()}}
        config |= {"reps": args.reps, "cpus": mp.cpu_count(), "torch": torch.__version__}
        config |= {"python": platform.python_version(), "modes": MODES}
        with open(args.json, "w") as f:
            json.dump({"benchmark": "weight_sync", "config": config, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
