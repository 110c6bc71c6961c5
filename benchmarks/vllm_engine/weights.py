"""New weights into vLLM's worker, and generation while they come: two measurements, one engine, one run.

A trainer process (rank 0 of rljob's weight group over gloo on loopback, rljob's WeightPublisher) and vLLM's
CPU engine behind rljob's adapter (its worker, in vLLM's engine process, rank 1); the model is vllm_bench.py's
(~25 M parameters, 100 MB in fp32).

(b) Sync vs raw: the baseline broadcasts one tensor of the version's bytes over the same group into a new
buffer inside vLLM's worker (a function run there by `collective_rpc`): what the transport alone costs. The
sync is rljob's: the trainer packs and broadcasts its buckets while the adapter's worker receives them
(`receive_broadcast`), loads them into the model (vLLM's `reload_weights`), drops the prefix cache and serves
the version. Ratios: raw over the sync's receive (the transport, as the worker timed it) and over the whole
sync (pack to served). #35's bar: >= 0.8. Beside them, the serial floor of any sync into vLLM's CPU build:
the raw broadcast, then the re-layout vLLM's CPU kernels need of every linear layer's new weights
(`create_onednn_mm`, which vLLM's own post-load processing runs), from the received bytes; raw over it is
the best ratio a sync that loads in turn after its transport can reach on the machine at hand.

(c) Updates in flight vs drain: `--concurrency` samples always running (a new one starts as one ends, as the
controller keeps a replica busy), for `--window` seconds, a new version every `--every` seconds; the same
engine under `drain` (no request starts while a version waits, it loads once the running ones end) and
`inflight` (pause keeping the running requests, load, resume), and with no sync at all as the reference.
After a first window to warm up, the three windows run in turn, `--rounds` times, each round in another
order (this machine's pace drifts by up to a fifth from one minute to the next, so each mode is set against
the reference of its own round, and no mode always runs last). Per mode, medians over the
rounds: samples/s, and the generation time each sync cost: window x (1 - samples/s / the round's reference's)
/ syncs.

    python benchmarks/vllm_engine/weights.py [--reps 15] [--bucket-mb 16] [--rounds 3] [--window 20] [--every 5]
        [--concurrency 32] [--max-new-tokens 64] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's own module, also when loaded by path
from vllm_bench import REPO, bench_model, run_side

MODES = ("none", "drain", "inflight")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "models", help="where the model is built")
    parser.add_argument("--reps", type=int, default=15, help="syncs and raw broadcasts timed, each")
    parser.add_argument("--bucket-mb", type=float, default=16.0, help="as examples/arithmetic-vllm.yaml")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three generation windows")
    parser.add_argument("--window", type=float, default=20.0, help="seconds of generation per mode and round")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between versions")
    parser.add_argument("--concurrency", type=int, default=32, help="samples running at once")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)  # built by the parent
    parser.add_argument("--side", choices=("engine",), help=argparse.SUPPRESS)  # in vLLM's environment
    return parser.parse_args(argv)


# ---- the trainer: its own process, rank 0 -------------------------------------------------------------
def trainer_main(conn: Connection, model_dir: str, bucket_bytes: int) -> None:
    """Serve the engine side's commands: join, raw BYTES, perturb V, publish V, stop."""
    import torch
    from transformers import AutoModelForCausalLM

    from rljob_workers.weights.group import WeightGroup, host_store
    from rljob_workers.weights.publisher import WeightPublisher

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    weights = [(name, p.detach()) for name, p in model.named_parameters()]
    publisher = WeightPublisher(bucket_bytes)
    publisher.publish(0, weights)
    store = host_store("127.0.0.1", 0)
    conn.send((int(store.port), publisher.plan))
    group: WeightGroup | None = None
    while True:
        command, arg = conn.recv()
        started = time.perf_counter()
        if command == "join":
            group = WeightGroup.create(arg, "127.0.0.1", int(store.port), 0, 2, "gloo", 120, store=store)
        elif command == "raw":
            assert group is not None
            group.broadcast(torch.ones(arg, dtype=torch.uint8))
        elif command == "perturb":
            with torch.no_grad():
                for _, tensor in weights:
                    tensor.add_(1e-3 * arg)
        elif command == "publish":
            publisher.publish(arg, weights, group)
        elif command == "stop":
            return
        conn.send(time.perf_counter() - started)


def raw_receive(worker: Any, nbytes: int) -> float:
    """Run in vLLM's worker (cloudpickled by collective_rpc): one broadcast of `nbytes` into a new buffer."""
    import torch

    started = time.perf_counter()
    worker._rljob_state.group.broadcast(torch.empty(nbytes, dtype=torch.uint8))
    return time.perf_counter() - started


def raw_receive_and_repack(worker: Any, nbytes: int) -> tuple[float, float]:
    """Run in vLLM's worker: the raw broadcast, then the one step any load into vLLM's CPU build must take on
    top of the bytes: re-laying every linear layer's weight out for oneDNN (vLLM's `create_onednn_mm`, as its
    own post-load processing calls it), here from consecutive slices of the received bytes. Seconds of each."""
    import torch
    from vllm import _custom_ops as ops

    started = time.perf_counter()
    received = torch.empty(nbytes, dtype=torch.uint8)
    worker._rljob_state.group.broadcast(received)
    repacking = time.perf_counter()
    offset, handlers = 0, []
    for layer in worker.model_runner.get_model().modules():
        weight = getattr(layer, "weight", None)
        if not hasattr(layer, "cpu_linear") or weight is None:
            continue
        shape = (  # a packed layer's weight is left empty; its sizes stay on the layer
            (layer.output_size_per_partition, layer.input_size_per_partition) if weight.numel() == 0 else weight.shape
        )
        count = shape[0] * shape[1]
        if offset + 4 * count > nbytes:  # vLLM pads the vocabulary: its rows outrun the checkpoint's bytes
            offset = 0
        values = received[offset : offset + 4 * count].view(torch.float32).view(shape)
        handlers.append(ops.create_onednn_mm(values.t(), 32))
        offset += 4 * count
    return repacking - started, time.perf_counter() - repacking


class Trainer:
    """The engine side's handle on the trainer process."""

    def __init__(self, model_dir: Path, bucket_bytes: int) -> None:
        self.conn, theirs = mp.get_context("spawn").Pipe()
        self.process = mp.get_context("spawn").Process(target=trainer_main, args=(theirs, str(model_dir), bucket_bytes))
        self.process.start()
        self.port, self.plan = self.conn.recv()
        self.nbytes = sum(plan.nbytes for plan in self.plan)

    async def ask(self, command: str, arg: Any = None) -> float:
        self.conn.send((command, arg))
        seconds: float = await asyncio.to_thread(self.conn.recv)
        return seconds

    def stop(self) -> None:
        self.conn.send(("stop", None))
        self.process.join(30)


async def wait_for_version(engine: Any, version: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while engine.policy_version != version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"still serving {engine.policy_version}, not {version}")
        await asyncio.sleep(0.005)


async def sync(engine: Any, trainer: Trainer, version: int) -> dict[str, float]:
    """One version, pack to served: (seconds, and the worker's own receive and load seconds)."""
    await trainer.ask("perturb", version)
    started = time.perf_counter()
    await asyncio.gather(engine.receive_broadcast(version, trainer.plan), trainer.ask("publish", version))
    await wait_for_version(engine, version)
    took = time.perf_counter() - started
    counters = (await engine.worker_counters())[0]
    return {"seconds": took, "receive_s": counters["receive_seconds"], "load_s": counters["load_seconds"]}


async def sync_vs_raw(engine: Any, trainer: Trainer, reps: int, versions: itertools.count[int]) -> dict[str, Any]:
    import cloudpickle

    raw, floors, syncs = [], [], []
    receive = cloudpickle.dumps(raw_receive)
    receive_and_repack = cloudpickle.dumps(raw_receive_and_repack)
    for _ in range(reps + 1):  # the first of each: warm-up
        started = time.perf_counter()
        await asyncio.gather(
            engine._engine.collective_rpc(receive, args=(trainer.nbytes,)), trainer.ask("raw", trainer.nbytes)
        )
        raw.append(time.perf_counter() - started)
        started = time.perf_counter()
        [(_, repack_s)], _ = await asyncio.gather(
            engine._engine.collective_rpc(receive_and_repack, args=(trainer.nbytes,)),
            trainer.ask("raw", trainer.nbytes),
        )
        floors.append({"seconds": time.perf_counter() - started, "repack_s": repack_s})
        syncs.append(await sync(engine, trainer, next(versions)))
    raw, floors, syncs = raw[1:], floors[1:], syncs[1:]
    raw_s = statistics.median(raw)
    floor = {key: statistics.median(f[key] for f in floors) for key in ("seconds", "repack_s")}
    medians = {key: statistics.median(s[key] for s in syncs) for key in ("seconds", "receive_s", "load_s")}
    return {
        "bytes": trainer.nbytes,
        "buckets": len(trainer.plan),
        "raw_s": [round(s, 4) for s in raw],
        "floor": [{k: round(v, 4) for k, v in f.items()} for f in floors],
        "sync": [{k: round(v, 4) for k, v in s.items()} for s in syncs],
        "raw_median_s": round(raw_s, 4),
        "floor_median": {k: round(v, 4) for k, v in floor.items()},
        "sync_median": {k: round(v, 4) for k, v in medians.items()},
        "raw_over_receive": round(raw_s / medians["receive_s"], 3),
        "raw_over_floor": round(raw_s / floor["seconds"], 3),
        "raw_over_sync": round(raw_s / medians["seconds"], 3),
    }


async def generation_window(
    engine: Any, trainer: Trainer, args: argparse.Namespace, mode: str, versions: itertools.count[int]
) -> dict[str, Any]:
    """`args.concurrency` samples always running for `args.window` seconds; under `mode`, a version every
    `args.every` seconds."""
    from rljob_workers.engines.base import PromptInput, SamplingConfig

    if mode != "none":
        engine.weight_update = mode
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=3)
    ids = itertools.count()
    done: list[float] = []
    tokens = [0]
    started = time.perf_counter()
    end = started + args.window

    async def keep_one_running() -> None:
        while time.perf_counter() < end:
            n = next(ids)
            prompt = PromptInput(f"{mode}-{n}", tuple(3 + (n * 7 + i) % 40 for i in range(24)))
            async for sample in engine.generate([prompt], sampling):
                if time.perf_counter() <= end:
                    done.append(time.perf_counter() - started)
                    tokens[0] += len(sample.token_ids)

    async def versions_every() -> list[float]:
        took: list[float] = []
        while True:
            await asyncio.sleep(started + args.every * (len(took) + 1) - time.perf_counter())
            if time.perf_counter() + 1 >= end:
                return took
            took.append((await sync(engine, trainer, next(versions)))["seconds"])

    runners = [asyncio.create_task(keep_one_running()) for _ in range(args.concurrency)]
    synced = await versions_every() if mode != "none" else []
    await asyncio.gather(*runners)
    return {
        "mode": mode,
        "samples": len(done),
        "samples_per_s": round(len(done) / args.window, 2),
        "tokens_per_s": round(tokens[0] / args.window, 1),
        "syncs": len(synced),
        "sync_to_served_s": [round(s, 3) for s in synced],
    }


async def engine_side(args: argparse.Namespace) -> dict[str, Any]:
    from rljob_api.workercfg import RolloutWorkerConfig
    from rljob_workers.engines.base import WeightGroupMembership
    from rljob_workers.engines.vllm import VLLMEngine

    config = RolloutWorkerConfig(
        model_path=str(args.model), dtype="float32", engine="vllm", gpus=0, tensor_parallel_size=1,
        max_concurrent_prompts=args.concurrency, gpu_memory_utilization=0.9, seed=1, weight_update="drain",
    )  # fmt: skip
    engine = await asyncio.to_thread(VLLMEngine, config)
    trainer = Trainer(args.model, int(args.bucket_mb * (1 << 20)))
    versions = itertools.count(1)
    try:
        membership = WeightGroupMembership("bench", "127.0.0.1", trainer.port, 1, 2, "gloo", 120)
        await asyncio.gather(engine.join_weight_group(membership), trainer.ask("join", "bench"))
        weights = await sync_vs_raw(engine, trainer, args.reps, versions)
        # A first window warms the engine up at this concurrency (seen: the reference, first, ran 20% slow), and
        # each round takes the modes in another order: the pace still rises by a few percent a round after it.
        await generation_window(engine, trainer, args, "none", versions)
        windows = [
            {"round": i, **await generation_window(engine, trainer, args, mode, versions)}
            for i in range(args.rounds)
            for mode in MODES[i % len(MODES) :] + MODES[: i % len(MODES)]
        ]
        return {"sync_vs_raw": weights, "windows": windows, "worker": (await engine.worker_counters())[0]}
    finally:
        trainer.stop()
        await engine.close()


def per_mode(windows: list[dict[str, Any]], window: float) -> dict[str, dict[str, Any]]:
    """Each mode's medians over the rounds; the generation a sync cost, against its own round's reference."""
    reference = {w["round"]: w["samples_per_s"] for w in windows if w["mode"] == "none"}
    found: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        mine = [w for w in windows if w["mode"] == mode]
        lost = [window * (1 - w["samples_per_s"] / reference[w["round"]]) / w["syncs"] for w in mine if w["syncs"]]
        found[mode] = {
            "samples_per_s": round(statistics.median(w["samples_per_s"] for w in mine), 2),
            "syncs": sum(w["syncs"] for w in mine),
            "sync_to_served_s": sorted(s for w in mine for s in w["sync_to_served_s"]),
            "lost_per_sync_s": round(statistics.median(lost), 2) if lost else None,
        }
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        print(json.dumps(asyncio.run(engine_side(args))), flush=True)
        return 0
    model = bench_model(args.cache)
    given = [*(argv if argv is not None else sys.argv[1:]), "--model", str(model)]
    found = run_side(Path(__file__).resolve(), given, "engine")
    found["modes"] = per_mode(found["windows"], args.window)
    found["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(json.dumps(found, indent=2))
    weights = found["sync_vs_raw"]
    print(
        f"{weights['bytes'] / 1e6:.0f} MB: raw broadcast {weights['raw_median_s']:.3f}s; sync: receive "
        f"{weights['sync_median']['receive_s']:.3f}s, load {weights['sync_median']['load_s']:.3f}s, pack to served "
        f"{weights['sync_median']['seconds']:.3f}s; raw/receive {weights['raw_over_receive']:.2f}, "
        f"raw/sync {weights['raw_over_sync']:.2f}; floor (raw + vLLM's repack "
        f"{weights['floor_median']['repack_s']:.3f}s) {weights['floor_median']['seconds']:.3f}s: "
        f"raw/floor {weights['raw_over_floor']:.2f}"
    )
    for mode, m in found["modes"].items():
        served = m["sync_to_served_s"]
        took = f", sync to served {served[0]:.2f}-{served[-1]:.2f}s" if served else ""
        lost = m["lost_per_sync_s"]
        print(f"{mode:>8}: {m['samples_per_s']:.2f} samples/s, {m['syncs']} syncs{took}, lost per sync {lost}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
