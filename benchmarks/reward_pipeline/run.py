"""Reward pipeline benchmark: synchronous vs one-step off-policy vs rljob's asynchronous
per-sample streaming, and a fixed vs an elastic reward pool, with a slow judge.

verl's asynchronous reward agent experiment, scaled down 100×: each sample's reward takes
10–400 ms (uniform, fixed per sample id; `pipeline_judge.py`), and the judge slows down
`--slow-factor`× for samples of the middle stretch of policy versions. Real rollout and real
GRPO training of the shipped tiny model (`rljob make-model`), on a local Ray cluster, one
configuration after the other in one run, all at the same reward concurrency (replicas ×
maxInFlightPerReplica):

  sync           (1) maxStaleness 0, reward dispatch `batch`: generate the batch, score all of it, train
  one-step       (2) maxStaleness 1, reward dispatch `group`: one-step off-policy, mini-batch pipelining
  async          (3) maxStaleness 2, reward dispatch `sample`: per-sample streaming, fixed pool of --replicas
  async-elastic  (3) the same with the elastic pool, 1..--replicas replicas

Per configuration, over the steps after --warmup: wall seconds per step; trainer idle % (the
trainer pool's exact busy clock: train step plus weight sync); the limit
``max(rollout s/step, train s/step, reward work ÷ reward capacity)`` and the efficiency
``limit ÷ wall s/step``; reward replica-seconds. Rollout and train seconds per step are each
pool's exact busy time in that run (overlapped stages share this machine's cores, so they cost
more than alone; the sync run's, where each runs alone, are printed beside); reward work is the
summed service time of the scored samples, capacity the pool's slots at its full size.

    python benchmarks/reward_pipeline/run.py [--steps 40] [--warmup 5] [--configs sync,async]
                                             [--replicas 4] [--in-flight 16] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# The reward replicas import `pipeline_judge` from here.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)

from rljob_api import parse_rljob  # noqa: E402
from rljob_workers.driver.controller.loop import StepReport  # noqa: E402
from rljob_workers.driver.local_run import LocalRun  # noqa: E402
from rljob_workers.driver.setup import prepare  # noqa: E402

MODEL = REPO / ".cache" / "models" / "tiny-arith"
DATA = REPO / ".cache" / "data" / "arithmetic-train.jsonl"


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    max_staleness: int
    dispatch: str
    elastic: bool


CONFIGS = {
    c.name: c
    for c in (
        Config("sync", "(1) sync: generate, score batch, train", 0, "batch", False),
        Config("one-step", "(2) one-step off-policy, group pipelining", 1, "group", False),
        Config("async", "(3) async streaming, fixed pool", 2, "sample", False),
        Config("async-elastic", "(3) async streaming, elastic pool", 2, "sample", True),
    )
}


@dataclass(frozen=True)
class Snapshot:
    """Cumulative clocks of a run, taken as a step finished."""

    step: int
    at: float
    rollout_busy: float
    trainer_busy: float
    reward_service: float
    replica_seconds: float
    discarded_stale: int
    group_latency_max: float


@dataclass
class Probe:
    """Takes a Snapshot at every step; integrates the reward pool's size over time."""

    snapshots: list[Snapshot] = field(default_factory=list)
    replica_seconds: float = 0.0
    max_replicas: int = 0
    _last: tuple[float, int] | None = None
    _sampler: asyncio.Task[None] | None = None

    def _integrate(self, run: LocalRun) -> None:
        now, replicas = time.monotonic(), len(run.reward.actors)
        if self._last is not None:
            self.replica_seconds += (now - self._last[0]) * self._last[1]
        self._last = (now, replicas)
        self.max_replicas = max(self.max_replicas, replicas)

    async def _sample(self, run: LocalRun) -> None:
        while True:
            self._integrate(run)
            await asyncio.sleep(0.05)

    def __call__(self, run: LocalRun, report: StepReport) -> None:
        if self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample(run))
        self._integrate(run)
        assert run.controller is not None
        self.snapshots.append(
            Snapshot(
                step=report.step,
                at=time.monotonic(),
                rollout_busy=run.clients.busy.seconds(),
                trainer_busy=run.controller.trainer_busy.seconds(),
                reward_service=run.router.stats().service_seconds,
                replica_seconds=self.replica_seconds,
                discarded_stale=report.counts.discarded_stale,
                group_latency_max=report.group_latency_max,
            )
        )


@dataclass(frozen=True)
class Measured:
    """One configuration over its measured steps (after the warm-up)."""

    config: str
    steps: int
    wall_per_step: float
    trainer_idle: float
    rollout_per_step: float
    train_per_step: float
    reward_work_per_step: float
    replica_seconds: float
    max_replicas: int
    discarded_stale: int
    reward_last5: float
    latency_bound_per_step: float


def latency_bound(group_latencies: list[float], train_per_step: float, max_staleness: int) -> float:
    """The least s/step the groups' latency allows, however fast each stage is.

    A group dispatched as step k's train step (and weight sync) ends must be trained by step
    k + maxStaleness + 1, and that step ends a train step after the group is ready: so
    maxStaleness + 1 steps take at least the group's latency (dispatch to last score) plus a
    train step. Taken with the batch's slowest group, averaged over the steps. With
    maxStaleness 0 it is exactly the synchronous step: generate and score, then train.
    """
    if not group_latencies:
        return math.nan
    return (statistics.fmean(group_latencies) + train_per_step) / (max_staleness + 1)


def measure(config: Config, probe: Probe, reports: list[StepReport], warmup: int) -> Measured:
    """Differences of the cumulative clocks between the warm-up's last step and the run's last."""
    first, last = probe.snapshots[warmup - 1], probe.snapshots[-1]
    steps = last.step - first.step
    wall = last.at - first.at
    latencies = [s.group_latency_max for s in probe.snapshots[warmup:]]
    train_per_step = (last.trainer_busy - first.trainer_busy) / steps
    return Measured(
        config=config.name,
        steps=steps,
        wall_per_step=wall / steps,
        trainer_idle=1.0 - (last.trainer_busy - first.trainer_busy) / wall,
        rollout_per_step=(last.rollout_busy - first.rollout_busy) / steps,
        train_per_step=train_per_step,
        reward_work_per_step=(last.reward_service - first.reward_service) / steps,
        replica_seconds=last.replica_seconds - first.replica_seconds,
        max_replicas=probe.max_replicas,
        discarded_stale=last.discarded_stale - first.discarded_stale,
        reward_last5=statistics.fmean(r.reward_mean for r in reports[-5:]) if reports else math.nan,
        latency_bound_per_step=latency_bound(latencies, train_per_step, config.max_staleness),
    )


def limit_per_step(m: Measured, slots: int) -> float:
    """The fastest a step of this run can go: its slowest stage, each at the cost it had in this run.

    On separate GPU pools a stage costs the same however the pipeline overlaps it; on one small
    CPU machine the overlapped stages share cores and each gets slower, so the stage times of
    the run itself are what its pipeline can be held to (the sync run's are printed beside).
    """
    return max(m.rollout_per_step, m.train_per_step, m.reward_work_per_step / slots)


def job_doc(config: Config, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["metadata"]["name"] = f"bench-{config.name}"
    spec = doc["spec"]
    spec["model"]["path"] = str(args.model)
    spec["data"]["path"] = str(args.data)
    spec["algorithm"].update(
        totalSteps=args.steps,
        maxStaleness=config.max_staleness,
        promptsPerStep=args.prompts_per_step,
        groupSize=args.group_size,
        klCoef=args.kl_coef,
    )
    spec["trainer"]["microBatchSize"] = args.micro_batch
    spec["reward"] = {
        "functions": [{"name": "judge", "kind": "rule", "rule": {"function": "pipeline_judge:slow_exact_match"}}],
        "replicas": {"min": 1 if config.elastic else args.replicas, "max": args.replicas},
        "maxInFlightPerReplica": args.in_flight,
        "dispatch": config.dispatch,
        "onError": "fail",
        "scaling": {
            "targetBacklogPerReplica": args.in_flight * args.target_fill,
            "intervalSeconds": args.scale_interval,
            "cooldownSeconds": args.cooldown,
            "maxStepUp": args.replicas,
            "maxStepDown": 1,
        },
    }
    spec["checkpoint"] = {"dir": str(work / config.name / "checkpoints"), "everySteps": args.steps}
    return doc


def run_config(config: Config, args: argparse.Namespace, work: Path) -> Measured:
    """One configuration, in this process (the benchmark runs each in a process of its own)."""
    job = parse_rljob(copy.deepcopy(job_doc(config, args, work)))
    probe = Probe()
    run = LocalRun(
        job, prepare(job, None), work / config.name, resume=False, display=False, metrics_port=0, step_hook=probe
    )
    rc = asyncio.run(run.main())
    if rc != 0:
        raise SystemExit(f"{config.name}: the run failed: {run.view.message if run.view else rc}")
    return measure(config, probe, run.reports, args.warmup)


def run_in_subprocess(name: str, argv: list[str], work: Path) -> Measured:
    """Run one configuration in a fresh process (its own Ray cluster); its output goes to a log file."""
    out, log = work / f"{name}.json", work / f"{name}.log"
    with log.open("w") as handle:
        command = [sys.executable, __file__, *argv, "--configs", name, "--one", str(out)]
        rc = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT).returncode
    if rc != 0 or not out.exists():
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise SystemExit(f"{name}: the run failed (exit {rc}); last lines of {log}:\n{tail}")
    return Measured(**json.loads(out.read_text()))


def table(results: list[Measured], args: argparse.Namespace) -> tuple[str, dict[str, dict[str, float]]]:
    by_name = {m.config: m for m in results}
    stages = by_name.get("sync")
    slots = args.replicas * args.in_flight
    header = (
        "| configuration | s/step | vs sync | trainer idle | rollout s/step | train s/step "
        "| reward work ÷ capacity | limit s/step | efficiency | latency bound s/step | replica-s | stale |"
    )
    lines = [header, "|---" * (header.count("|") - 1) + "|"]
    derived: dict[str, dict[str, float]] = {}
    for m in results:
        limit = limit_per_step(m, slots)
        speedup = stages.wall_per_step / m.wall_per_step if stages else float("nan")
        derived[m.config] = {"limit_per_step": limit, "efficiency": limit / m.wall_per_step, "vs_sync": speedup}
        lines.append(
            f"| {CONFIGS[m.config].label} | {m.wall_per_step:.3f} | {speedup:.2f}× | {100 * m.trainer_idle:.1f}% "
            f"| {m.rollout_per_step:.3f} | {m.train_per_step:.3f} | {m.reward_work_per_step / slots:.3f} "
            f"| {limit:.3f} | {limit / m.wall_per_step:.2f} | {m.latency_bound_per_step:.3f} "
            f"| {m.replica_seconds:.0f} | {m.discarded_stale} |"
        )
    if stages is not None and "async" in by_name:
        overlapped = by_name["async"]
        lines.append(
            f"\nstages alone (sync): rollout {stages.rollout_per_step:.3f} s, "
            f"train {stages.train_per_step:.3f} s per step; "
            f"overlapped (async): rollout ×{overlapped.rollout_per_step / stages.rollout_per_step:.2f}, "
            f"train ×{overlapped.train_per_step / stages.train_per_step:.2f} (the pools share the machine's cores)"
        )
    if "async" in by_name and "async-elastic" in by_name:
        fixed, elastic = by_name["async"], by_name["async-elastic"]
        saved = 1 - elastic.replica_seconds / fixed.replica_seconds
        slower = elastic.wall_per_step / fixed.wall_per_step - 1
        derived["async-elastic"].update(replica_seconds_saved=saved, wall_increase=slower)
        lines.append(
            f"\nelastic vs fixed pool: {100 * saved:.0f}% fewer replica-seconds "
            f"({elastic.replica_seconds:.0f} vs {fixed.replica_seconds:.0f}), {100 * slower:+.1f}% wall per step; "
            f"elastic peaked at {elastic.max_replicas} replicas"
        )
    return "\n".join(lines), derived


def targets(results: list[Measured], derived: dict[str, dict[str, float]]) -> list[str]:
    """The issue's targets, each marked met or missed (the benchmark reports; it does not assert)."""
    by_name = {m.config: m for m in results}
    out = []

    def check(ok: bool, text: str) -> None:
        out.append(f"[{'met' if ok else 'MISSED'}] {text}")

    for name in ("async", "async-elastic"):
        if name in by_name and "sync" in by_name:
            check(
                derived[name]["vs_sync"] >= 2.5,
                f"{name}: {derived[name]['vs_sync']:.2f}× faster per step than sync (≥ 2.5)",
            )
        if name in by_name:
            idle = by_name[name].trainer_idle
            check(idle <= 0.05, f"{name}: trainer idle {100 * idle:.1f}% (≤ 5%)")
            eff = derived[name]["efficiency"]
            check(eff >= 0.9, f"{name}: {eff:.2f} of the limit (≥ 0.9)")
    if "replica_seconds_saved" in derived.get("async-elastic", {}):
        saved, slower = derived["async-elastic"]["replica_seconds_saved"], derived["async-elastic"]["wall_increase"]
        check(saved >= 0.3, f"elastic: {100 * saved:.0f}% fewer replica-seconds than the fixed pool (≥ 30%)")
        check(slower <= 0.05, f"elastic: {100 * slower:+.1f}% wall per step vs the fixed pool (≤ +5%)")
    return out


def _without(argv: list[str], *options: str) -> list[str]:
    """argv minus the given options and their values (both `--opt v` and `--opt=v`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif not any(arg.startswith(f"{o}=") for o in options):
            out.append(arg)
    return out


def ensure_assets(model: Path, data: Path) -> None:
    """The shipped example's model and data (what `make model` builds), unless given."""
    from rljob_workers.models.tiny import make_tiny_model
    from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

    if not model.exists():
        print(f"building the tiny model at {model} ...", flush=True)
        make_tiny_model(model)
    if not data.exists():
        write_jsonl(data, make_problems(4096, seed=10_000))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the measurement")
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=128, help="trainer microBatchSize")
    parser.add_argument("--kl-coef", type=float, default=0.0, help="algorithm klCoef (> 0 adds a reference model)")
    parser.add_argument("--replicas", type=int, default=4, help="reward replicas (the elastic pool's max)")
    parser.add_argument("--in-flight", type=int, default=16, help="maxInFlightPerReplica")
    parser.add_argument("--latency-ms", type=float, nargs=2, default=[10.0, 400.0], metavar=("LOW", "HIGH"))
    parser.add_argument("--slow-factor", type=float, default=3.0, help="judge slowdown in the slow stretch")
    parser.add_argument(
        "--slow-stretch",
        type=float,
        nargs=2,
        default=[0.35, 0.65],
        metavar=("FROM", "UNTIL"),
        help="the slow stretch, as fractions of --steps (policy versions)",
    )
    parser.add_argument("--target-fill", type=float, default=0.75, help="elastic target backlog ÷ maxInFlight")
    parser.add_argument("--scale-interval", type=float, default=0.5)
    parser.add_argument("--cooldown", type=float, default=3.0)
    parser.add_argument("--model", type=Path, default=MODEL, help="model directory (built if missing)")
    parser.add_argument("--data", type=Path, default=DATA, help="prompts, JSON lines (written if missing)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run one config
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(CONFIGS)}")
    if not 1 <= args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and less than --steps")
    logging.basicConfig(level=logging.WARNING)
    ensure_assets(args.model, args.data)
    low, high = (x / 1000 for x in args.latency_ms)
    slow_from, slow_until = (round(f * args.steps) for f in args.slow_stretch)
    os.environ["RLJOB_BENCH_LATENCY"] = f"{low},{high}"
    os.environ["RLJOB_BENCH_SLOW"] = f"{slow_from},{slow_until},{args.slow_factor}"
    print(
        f"reward latency U({args.latency_ms[0]:g}, {args.latency_ms[1]:g}) ms per sample, ×{args.slow_factor:g} for "
        f"policy versions {slow_from}..{slow_until - 1}; {args.prompts_per_step}×{args.group_size} samples per step; "
        f"reward concurrency {args.replicas}×{args.in_flight}; {args.steps} steps, first {args.warmup} not measured; "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    if args.one is not None:
        [name] = names
        with tempfile.TemporaryDirectory(prefix=f"rljob-reward-bench-{name}-") as tmp:
            args.one.write_text(json.dumps(asdict(run_config(CONFIGS[name], args, Path(tmp)))))
        return 0
    results: list[Measured] = []
    passed_on = _without(list(sys.argv[1:] if argv is None else argv), "--configs", "--json")
    with tempfile.TemporaryDirectory(prefix="rljob-reward-bench-") as tmp:
        for name in names:
            started = time.monotonic()
            measured = run_in_subprocess(name, passed_on, Path(tmp))
            results.append(measured)
            print(
                f"{name}: {measured.wall_per_step:.3f} s/step (rollout busy {measured.rollout_per_step:.3f}, "
                f"trainer busy {measured.train_per_step:.3f}), trainer idle {100 * measured.trainer_idle:.1f}%, "
                f"reward (last 5 steps) {measured.reward_last5:.3f}; {time.monotonic() - started:.0f}s in all",
                flush=True,
            )
    text, derived = table(results, args)
    print()
    print(text)
    print()
    print("\n".join(targets(results, derived)))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()},
                    "machine": {
                        "cores": os.cpu_count(),
                        "python": sys.version.split()[0],
                        "platform": platform.platform(),
                    },
                    "results": [asdict(m) for m in results],
                    "derived": derived,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
