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
                                             [--staleness 2,4,6]

--staleness runs async and async-elastic at each maxStaleness given (`async@6` names one); the
latency bound, not the stages, sets the pace at a small maxStaleness.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import os
import platform
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
# The reward replicas import `pipeline_judge` from here.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)

from rljob_workers.common.grpc_env import use_grpc_process_env  # noqa: E402

use_grpc_process_env()  # before the imports below load grpc
from rljob_api import parse_rljob  # noqa: E402
from rljob_workers.driver.controller.report import StepReport  # noqa: E402
from rljob_workers.driver.run.plan import plan_job  # noqa: E402
from rljob_workers.driver.run.session import RunSession  # noqa: E402

sys.path.insert(0, str(HERE))  # the benchmark's own modules, also when loaded by file path
from pipeline_measure import (  # noqa: E402
    CONFIGS,
    SWEPT,
    Config,
    Measured,
    Snapshot,
    config_named,
    measure,
    sweep,
    table,
    targets,
)

MODEL = REPO / ".cache" / "models" / "tiny-arith"
DATA = REPO / ".cache" / "data" / "arithmetic-train.jsonl"


@dataclass
class Probe:
    """Takes a Snapshot at every step; integrates the reward pool's size over time."""

    snapshots: list[Snapshot] = field(default_factory=list)
    replica_seconds: float = 0.0
    max_replicas: int = 0
    _last: tuple[float, int] | None = None
    _sampler: asyncio.Task[None] | None = None

    def _integrate(self, run: RunSession) -> None:
        now, replicas = time.monotonic(), len(run.pools.reward.actors)
        if self._last is not None:
            self.replica_seconds += (now - self._last[0]) * self._last[1]
        self._last = (now, replicas)
        self.max_replicas = max(self.max_replicas, replicas)

    async def _sample(self, run: RunSession) -> None:
        while True:
            self._integrate(run)
            await asyncio.sleep(0.05)

    def __call__(self, run: RunSession, report: StepReport) -> None:
        if self._sampler is None:
            self._sampler = asyncio.get_running_loop().create_task(self._sample(run))
        self._integrate(run)
        assert run.controller is not None
        self.snapshots.append(
            Snapshot(
                step=report.step,
                at=time.monotonic(),
                rollout_busy=run.pools.clients.busy.seconds(),
                trainer_busy=run.controller.trainer_busy.seconds(),
                reward_service=run.pools.router.stats().service_seconds,
                replica_seconds=self.replica_seconds,
                discarded_stale=report.counts.discarded_stale,
                group_latency_max=report.group_latency_max,
            )
        )


def job_doc(config: Config, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["metadata"]["name"] = f"bench-{config.name.replace('@', '-s')}"  # async@6: bench-async-s6
    spec = doc["spec"]
    spec["model"]["path"] = str(args.model)
    spec["data"]["path"] = str(args.data)
    spec["data"].pop("eval", None)  # the reward pool's load is the training's alone
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
            "scaleDownWindowSeconds": args.scale_down_window,
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
    run = RunSession(plan_job(job, output=work / config.name, display=False), step_hook=probe)
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, from: " + ", ".join(CONFIGS))
    parser.add_argument(
        "--staleness",
        default="2",
        help=f"comma-separated maxStaleness values: {' and '.join(SWEPT)} run at each (a sweep: 2,4,6)",
    )
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
    parser.add_argument("--scale-down-window", type=float, default=3.0, help="scaleDownWindowSeconds")
    parser.add_argument("--model", type=Path, default=MODEL, help="model directory (built if missing)")
    parser.add_argument("--data", type=Path, default=DATA, help="prompts, JSON lines (written if missing)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)  # internal: run one config
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        staleness = [int(v) for v in args.staleness.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--staleness: {args.staleness!r} is not a comma-separated list of integers")
    if not staleness or min(staleness) < 0:
        parser.error(f"--staleness: {args.staleness!r}: give one or more values ≥ 0")
    names = sweep([n.strip() for n in args.configs.split(",") if n.strip()], staleness)
    for name in names:
        try:
            config_named(name)
        except ValueError as exc:
            parser.error(f"--configs: {exc}")
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
            args.one.write_text(json.dumps(asdict(run_config(config_named(name), args, Path(tmp)))))
        return 0
    given = list(sys.argv[1:] if argv is None else argv)
    results = run_all(names, _without(given, "--configs", "--json", "--staleness"))
    text, derived = table(results, args)
    print()
    print(text)
    print()
    print("\n".join(targets(results, derived)))
    if args.json is not None:
        write_json(args.json, args, results, derived)
    return 0


def run_all(names: list[str], passed_on: list[str]) -> list[Measured]:
    """Each configuration in a process of its own, one after the other."""
    results: list[Measured] = []
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
            idlest = sorted(enumerate(measured.idle_by_step, start=1), key=lambda item: -item[1])[:5]
            print(
                f"  trainer idle: waiting for a full batch {measured.batch_wait_per_step:.3f} s/step; "
                "idlest measured steps " + ", ".join(f"#{n} {idle:.3f} s" for n, idle in idlest),
                flush=True,
            )
    return results


def write_json(
    path: Path, args: argparse.Namespace, results: list[Measured], derived: dict[str, dict[str, float]]
) -> None:
    machine = {"cores": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}
    document = {
        "args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()},
        "machine": machine,
        "results": [asdict(m) for m in results],
        "derived": derived,
    }
    path.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    sys.exit(main())
