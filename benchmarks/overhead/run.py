"""The data plane's own cost: the shipped example in one process beside `rljob run` of the same spec.

The baseline is the same job done by a plain synchronous loop in one process, written with the
project's own parts: the hf engine generates each step's groups, the job's reward functions score
them, group-relative advantages and the GRPO loss train the policy (PolicyTrainer), and the new
weights go straight into the engine. No Ray, no gRPC, no overlap. Beside it, `rljob run` of the
same spec at each `--staleness` (maxStaleness). Each runs as its own process, timed from spawn to
exit. The table: s/step over the steps trained, samples/s, the ratio to the baseline, where a step
goes, and the whole process with start-up and the rest (shutdown) apart.

On 2 cores the pools share them, and one round's ratio swings (0.84–1.42× at maxStaleness 1 in three
rounds): `--repeat N` runs N rounds, each with its own baseline, prints each round's table, then the
median and range of each run's ratio and of its whole process over its training.

    python benchmarks/overhead/run.py [--steps 100] [--staleness 0,1] [--repeat 1] [--job examples/arithmetic.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
POOLS_UP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*pools up in ", re.M)


@dataclass
class Result:
    """One run: per-step seconds by phase, the reward curve, and the process's times."""

    name: str
    steps: int
    samples: int  # trained per step
    wall: float = 0.0  # spawn to exit
    startup: float = 0.0  # spawn until training could start (models loaded, pools up)
    train: float = 0.0  # first step started to last step done
    phases: dict[str, float] = field(default_factory=dict)  # mean seconds per step
    rewards: list[float] = field(default_factory=list)

    @property
    def per_step(self) -> float:
        return self.train / max(self.steps, 1)

    @property
    def samples_per_second(self) -> float:
        return self.samples * self.steps / max(self.train, 1e-9)


def job_file(work: Path, source: Path, steps: int, staleness: int | None = None) -> Path:
    """The job with its paths made absolute, `steps` steps, maxStaleness `staleness`, no checkpoints to resume."""
    doc = yaml.safe_load(source.read_text())
    spec = doc["spec"]
    for part in ("model", "data"):
        spec[part]["path"] = str((REPO / spec[part]["path"]).resolve())
    spec["data"].pop("eval", None)  # the one-process baseline evaluates nothing
    spec["algorithm"]["totalSteps"] = steps
    if staleness is not None:
        spec["algorithm"]["maxStaleness"] = staleness
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    spec["checkpoint"]["everySteps"] = steps  # one at the end, as the baseline would save once
    work.mkdir(parents=True, exist_ok=True)
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# ---------------------------------------------------------------- the one-process loop
async def one_process(job_path: Path) -> dict[str, Any]:
    """Run the job in this process; its per-step phase times, rewards and start-up seconds."""
    parts = _load_parts(job_path)
    ready_at = time.time()  # the parent measures start-up from its spawn
    steps: list[dict[str, float]] = []
    rewards: list[float] = []
    train_started = time.monotonic()
    for version in range(1, parts["algo"].total_steps + 1):
        phases, reward = await _one_step(parts, version)
        steps.append(phases)
        rewards.append(reward)
    train = time.monotonic() - train_started
    await parts["engine"].close()
    return {"ready_at": ready_at, "train": train, "steps": steps, "rewards": rewards}


def _load_parts(job_path: Path) -> dict[str, Any]:
    import torch

    from rljob_api import derive_worker_configs, load_rljob
    from rljob_workers.driver.controller.data import load_prompts
    from rljob_workers.engines.hf import HFEngine
    from rljob_workers.reward.functions import RewardFunctionSet
    from rljob_workers.trainer.policy import PolicyTrainer

    configs = derive_worker_configs(load_rljob(job_path))
    c = configs.controller
    return {
        "algo": c.algorithm,
        "sampling": c.sampling,
        "prompts": load_prompts(
            *(c.data.path, c.data.prompt_field, c.data.fields, c.algorithm.seed, c.data.shuffle),
            cache_dir=job_path.parent / "datasets-cache",
        ),
        "engine": HFEngine.from_config(configs.rollout),
        "rewards": RewardFunctionSet.from_spec(configs.reward.functions, configs.reward.timeout_seconds, gpus=0),
        "trainer": PolicyTrainer(configs.trainer, torch.device("cpu"), 1),
    }


async def _one_step(parts: dict[str, Any], version: int) -> tuple[dict[str, float], float]:
    """Generate, score, train, load the new weights; (seconds per phase, mean reward)."""
    from rljob.v1 import sample_pb2
    from rljob_workers.engines.base import PromptInput, SamplingConfig

    algo, s, engine = parts["algo"], parts["sampling"], parts["engine"]
    t0 = time.monotonic()
    batch = [parts["prompts"].next() for _ in range(algo.prompts_per_step)]
    inputs = [PromptInput(p.prompt_id, tuple(engine.tokenize(p.text)), algo.group_size) for p in batch]
    sampling = SamplingConfig(s.temperature, s.top_p or 1.0, s.top_k, s.max_new_tokens, tuple(s.stop))
    finished = [sample async for sample in engine.generate(inputs, sampling)]
    t1 = time.monotonic()
    prompts = {p.prompt_id: p for p in batch}
    scores = []
    for f in finished:
        p = prompts[f.prompt_id]
        request = sample_pb2.RewardSample(
            sample_id=f.sample_id, prompt_id=f.prompt_id, prompt=p.text, completion=f.text, fields=p.fields
        )
        score = await parts["rewards"].score(request)
        if score.HasField("error"):
            raise RuntimeError(f"sample {f.sample_id}: {score.error.message}")
        scores.append(score.score)
    t2 = time.monotonic()
    _train(parts["trainer"], finished, scores, algo)
    for p in batch:
        parts["prompts"].trained(p.prompt_id)
    t3 = time.monotonic()
    await engine.stage_weights(version, dict(parts["trainer"].named_weights()))
    t4 = time.monotonic()
    phases = {"generate": t1 - t0, "reward": t2 - t1, "train": t3 - t2, "weight sync": t4 - t3}
    return phases, sum(scores) / max(len(scores), 1)


def _train(trainer: Any, finished: list[Any], scores: list[float], algo: Any) -> None:
    from rljob_workers.trainer.samples import TrainSample, group_advantages

    ids = [f.prompt_id for f in finished]
    advantages = group_advantages(scores, ids, scale_by_std=algo.scale_rewards_by_std)
    samples = [
        TrainSample(list(f.prompt_token_ids), list(f.token_ids), list(f.logprobs), a)
        for f, a in zip(finished, advantages, strict=True)
    ]
    trainer.train_step(samples, len(samples), sum(len(s.token_ids) for s in samples))


# ---------------------------------------------------------------- the runs, each its own process
def run_baseline(job: Path, work: Path) -> Result:
    out = work / "baseline.json"
    spawned, t0 = time.time(), time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--one-process", str(job), "--out", str(out)], check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"the one-process loop failed (exit {done.returncode})")
    data = json.loads(out.read_text())
    result = _result("one process", data["steps"], job, wall, data["ready_at"] - spawned, data["train"])
    result.rewards = data["rewards"]
    return result


def run_rljob(job: Path, work: Path, staleness: int) -> Result:
    output = work / "out"
    command = [sys.executable, "-m", "rljob_workers.driver.cli", "run", str(job), "--no-display"]
    command += ["--output", str(output)]
    spawned, t0 = time.time(), time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise SystemExit(f"rljob run (maxStaleness {staleness}) failed (exit {done.returncode}):\n{tail}")
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    up = POOLS_UP.search(done.stdout + done.stderr)
    steps = [rljob_step(before, r) for before, r in zip([None, *records], records, strict=False)]
    result = _result(f"rljob run, maxStaleness {staleness}", steps, job, wall, 0.0, records[-1]["elapsed_seconds"])
    up_at = datetime.strptime(up.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if up else float("nan")
    result.startup = up_at - spawned
    result.rewards = [r["reward_mean"] for r in records]
    return result


def rljob_step(before: dict[str, Any] | None, record: dict[str, Any]) -> dict[str, float]:
    """Where one step of `rljob run` went, from its metrics.jsonl line and the one before. The train loop's
    own phases add up to the step; the pools' busy seconds and the driver's CPU (the controller and its
    gRPC) ran beside them, overlapping when maxStaleness > 0. The first step's start-up is left out."""
    phases = {
        "waiting for the batch": record["wait_seconds"],
        "train": record["step_seconds"] - record["sync_seconds"],
        "weight sync": record["sync_seconds"],
    }
    if before is not None:
        busy, busy_before = record["busy_seconds"], before["busy_seconds"]
        phases["beside it: rollout busy"] = busy["rollout"] - busy_before["rollout"]
        phases["reward busy"] = busy["reward"] - busy_before["reward"]
        phases["driver CPU"] = record["driver_cpu_seconds"] - before["driver_cpu_seconds"]
    return phases


def _result(name: str, steps: list[dict[str, float]], job: Path, wall: float, startup: float, train: float) -> Result:
    algo = yaml.safe_load(job.read_text())["spec"]["algorithm"]
    phases = {k: statistics.fmean(s[k] for s in steps if k in s) for k in steps[-1]} if steps else {}
    return Result(name, len(steps), algo["promptsPerStep"] * algo["groupSize"], wall, startup, train, phases)


def table(results: list[Result]) -> str:
    base = results[0]
    lines = [
        "| run | s/step | samples/s | × one process | where a step goes (s) | training | start-up | rest | "
        "whole process | reward: first 5 → last 5 steps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        where = ", ".join(f"{k} {v:.3f}" for k, v in r.phases.items())
        rest = r.wall - r.startup - r.train
        curve = f"{statistics.fmean(r.rewards[:5]):.2f} → {statistics.fmean(r.rewards[-5:]):.2f}"
        lines.append(
            f"| {r.name} | {r.per_step:.3f} | {r.samples_per_second:.0f} | "
            f"{r.samples_per_second / base.samples_per_second:.2f} | {where} | {r.train:.1f} s | "
            f"{r.startup:.1f} s | {rest:.1f} s | {r.wall:.1f} s | {curve} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--staleness", default="0,1", help="maxStaleness of each rljob run, comma-separated")
    parser.add_argument("--repeat", type=int, default=1, help="rounds, each with its own baseline")
    parser.add_argument("--job", type=Path, default=REPO / "examples" / "arithmetic.yaml")
    parser.add_argument("--one-process", type=Path, help=argparse.SUPPRESS)  # the baseline's own process
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_process:
        args.out.write_text(json.dumps(asyncio.run(one_process(args.one_process))))
        return 0
    rounds = [one_round(args.job, args.steps, args.staleness) for _ in range(args.repeat)]
    for number, results in enumerate(rounds, start=1):
        where = f", round {number} of {len(rounds)}" if len(rounds) > 1 else ""
        print(f"\n{args.steps} steps of {args.job.name} on this machine, each run its own process{where}:\n")
        print(table(results))
    if len(rounds) > 1:
        print("\n" + summary(rounds))
    return 0


def one_round(job: Path, steps: int, staleness: str) -> list[Result]:
    """The baseline, then `rljob run` at each maxStaleness, one after the other."""
    with tempfile.TemporaryDirectory(prefix="rljob-overhead-") as tmp:
        results = [progress(run_baseline(job_file(Path(tmp) / "base", job, steps), Path(tmp) / "base"))]
        for value in (int(s) for s in staleness.split(",")):
            work = Path(tmp) / f"s{value}"
            results.append(progress(run_rljob(job_file(work, job, steps, value), work, value)))
    return results


def progress(result: Result) -> Result:
    """One line as each run ends, so a round cut short still says what it measured."""
    print(
        f"{result.name}: {result.per_step:.3f} s/step, start-up {result.startup:.1f} s, "
        f"whole process {result.wall:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return result


def summary(rounds: list[list[Result]]) -> str:
    """Each run's ratio to its own round's baseline, and its whole process over its training: median (range)."""

    def spread(values: list[float]) -> str:
        return f"median {statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    lines = [f"over {len(rounds)} rounds:"]
    for column, first in enumerate(rounds[0]):
        ratios = [r[column].samples_per_second / r[0].samples_per_second for r in rounds]
        whole = [r[column].wall / r[column].train for r in rounds]
        lines.append(f"- {first.name}: × one process {spread(ratios)}; whole ÷ training {spread(whole)}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
