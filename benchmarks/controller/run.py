"""How many samples per second one controller moves: the ceiling of a job's data plane.

A rollout replica whose engine does no work (each sample one token, at once) and a reward replica
whose rule does none (a constant score) run in child processes; this process runs the driver's own
Controller, RolloutClients and RewardRouter over real gRPC on loopback, with a trainer whose step
returns at once and a weight sync that pulls a one-element model over the WeightService. The
controller's process is pinned to one core and the replicas to the others where there are any.
Every call carries a job token, checked by each server, as in a real run.
Reported: trained samples per second and the controller process's CPU per sample, against the
target of 20,000 samples/s, for two wirings one after the other: the baseline, one sample per
gRPC message both ways (what the replicas sent before batching), and the default, where the
samples that are ready together share a message (a rollout group; the rewards sent in one moment).

    python benchmarks/controller/run.py [--steps 40] [--group-size 16] [--prompts-per-step 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from rljob_api import parse_rljob
from rljob_api.workercfg import WorkerConfigs, derive_worker_configs
from rljob_workers.common.grpc_server import start_server
from rljob_workers.driver.controller.data import PromptSource, Row
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.driver.pools.rollout import RolloutClients
from rljob_workers.engines.base import FinishedSample, FinishReason, PromptInput, SamplingConfig, sample_slots
from rljob_workers.trainer.samples import TrainSample
from rljob_workers.weights.publisher import WeightPublisher, weight_service

REPO = Path(__file__).resolve().parents[2]
TOKEN_ENV = "RLJOB_BENCH_TOKEN"  # the null replicas' job token, kept off their command line
TARGET = 20_000  # samples/s one controller should move (issue 18)


@dataclass(frozen=True)
class Capacity:
    samples: int
    seconds: float
    controller_cpu_seconds: float
    replicas_cpu_seconds: float  # the null rollout and reward replicas together

    @property
    def per_second(self) -> float:
        return self.samples / self.seconds

    @property
    def cpu_us_per_sample(self) -> float:
        return 1e6 * self.controller_cpu_seconds / self.samples

    @property
    def replicas_us_per_sample(self) -> float:
        return 1e6 * self.replicas_cpu_seconds / self.samples

    @property
    def one_core_per_second(self) -> float:
        """Samples per second the controller would move with a core to itself and replicas that keep up."""
        return 1e6 / self.cpu_us_per_sample


class NullEngine:
    """An engine that does no work: every sample is one token, finished at once."""

    name, model_path, eos_token_id, weights_device = "null", "null", 0, "cpu"

    def __init__(self) -> None:
        self.policy_version = 0

    async def generate(self, prompts: Sequence[PromptInput], sampling: SamplingConfig) -> AsyncIterator[FinishedSample]:
        for prompt, index in sample_slots(prompts):
            yield FinishedSample(
                prompt.prompt_id, index, prompt.token_ids, (1,), (-0.5,), self.policy_version, FinishReason.STOP, "1"
            )

    async def stage_weights(self, version: int, tensors: Mapping[str, torch.Tensor]) -> None:
        self.policy_version = version  # one generate call at a time per prompt: every call is a safe point

    def tokenize(self, text: str) -> list[int]:
        return [1, 2, 3, 4]

    async def close(self) -> None:
        pass


class NullTrainer:
    """A trainer whose step returns at once; it publishes a one-element model for the rollout pool to pull."""

    def __init__(self, clients: RolloutClients, timeout: float, token: str | None = None) -> None:
        from rljob_workers.driver.controller.weight_sync import WeightSync

        self.token = token
        self.publisher = WeightPublisher(1 << 20)
        self.weight_address = ""
        self.sync = WeightSync(self, clients, "gloo", timeout)  # type: ignore[arg-type]

    async def serve(self) -> Any:
        server = await start_server([weight_service(self.publisher)], "127.0.0.1", 0, token=self.token)
        self.weight_address = f"127.0.0.1:{server.port}"
        return server

    async def publish(self, version: int, broadcast: bool = False) -> None:
        self.publisher.publish(version, [("w", torch.full((1,), float(version)))])

    async def sync_weights(self, version: int) -> None:
        await self.publish(version)
        await asyncio.gather(*(self.sync.catch_up(r, version) for r in self.sync.rollout.live()))

    async def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        return {"loss": 0.0}

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        return f"step-{step:06d}"


def job_configs(steps: int, group_size: int, prompts_per_step: int, max_staleness: int) -> WorkerConfigs:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["algorithm"].update(
        groupSize=group_size, promptsPerStep=prompts_per_step, totalSteps=steps, maxStaleness=max_staleness
    )
    doc["spec"]["checkpoint"]["everySteps"] = steps
    return derive_worker_configs(parse_rljob(doc))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pin(pid: int, cores: set[int]) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, cores)


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_seconds(pid: int) -> float:
    """User and system CPU of a running process (Linux /proc)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start_replicas(
    cores: set[int], per_message: int, token: str | None
) -> tuple[list[subprocess.Popen[str]], str, str]:
    """The null rollout and reward replicas, each a child process on `cores`; their addresses."""
    children, addresses = [], []
    env = {**os.environ, TOKEN_ENV: token or ""}
    for role in ("rollout", "reward"):
        port = _free_port()
        command = [sys.executable, __file__, "--serve", role, str(port), str(per_message)]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        _pin(child.pid, cores)
        assert child.stdout is not None
        if not child.stdout.readline():  # the "serving" line
            raise RuntimeError(f"the null {role} replica exited before serving (exit code {child.wait()})")
        children.append(child)
        addresses.append(f"127.0.0.1:{port}")
    return children, addresses[0], addresses[1]


async def measure(
    steps: int = 40,
    group_size: int = 16,
    prompts_per_step: int = 32,
    max_staleness: int = 1,
    warmup: int = 3,
    per_message: int = 0,
    with_token: bool = True,
) -> Capacity:
    """Run the controller for `warmup + steps` steps; the figures are those of the last `steps`.
    `per_message` 1: the replicas send one sample per message (the baseline); 0: they batch. With
    `with_token` every call carries a new job token, as in a real run."""
    token = secrets.token_urlsafe(32) if with_token else None
    all_cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    own = {min(all_cores)} if all_cores else set()
    _pin(0, own)
    children, rollout_address, reward_address = _start_replicas(all_cores - own or all_cores, per_message, token)
    configs = job_configs(warmup + steps, group_size, prompts_per_step, max_staleness)
    clients = RolloutClients(configs.rollout.max_concurrent_prompts, token=token)
    router = RewardRouter(replica_timeout=configs.controller.reward_timeout_seconds, token=token)
    trainer = NullTrainer(clients, timeout=30, token=token)
    server = await trainer.serve()
    marks: list[tuple[int, float, float, float]] = []
    try:
        clients.add("rollout-0", rollout_address)
        await router.add_replica("reward-0", reward_address)
        rows = [Row(f"{i}+{i}=", {"answer": str(2 * i)}) for i in range(4096)]
        controller = Controller(
            config=configs.controller,
            prompts=PromptSource(rows, seed=0),
            rollout=clients,
            scorer=router,
            trainer=trainer,
            sync_weights=trainer.sync_weights,
            on_step=lambda r: marks.append(
                (r.counts.trained, time.monotonic(), _own_cpu_seconds(), sum(_cpu_seconds(c.pid) for c in children))
            ),
        )
        await trainer.publish(0)
        await controller.run()
    finally:
        await router.close()
        await clients.close()
        await server.stop()
        for child in children:
            child.terminate()
            child.wait()
    (trained0, at0, cpu0, replicas0), (trained1, at1, cpu1, replicas1) = marks[warmup - 1], marks[-1]
    return Capacity(trained1 - trained0, at1 - at0, cpu1 - cpu0, replicas1 - replicas0)


def serve(role: str, port: int, per_message: int) -> None:
    """A child: the null rollout replica or the null reward replica on `port`; `per_message` 1 sends
    one sample per message (the baseline), 0 lets the replica batch. The job token is in TOKEN_ENV."""
    token = os.environ.get(TOKEN_ENV) or None
    from rljob_workers.reward import RewardFunctionSet
    from rljob_workers.reward.callables import WeightedFunction
    from rljob_workers.reward.server import start_reward_server
    from rljob_workers.rollout.server import serve_rollout

    async def reward() -> None:
        functions = RewardFunctionSet([WeightedFunction("null", lambda prompt, completion, **fields: 1.0)], 60.0)
        running, servicer = await start_reward_server(functions, name="null", max_in_flight=64, port=port, token=token)
        servicer.max_samples_per_message = per_message or servicer.max_samples_per_message
        print(f"reward 'null' serving on 127.0.0.1:{running.port}", flush=True)
        await asyncio.Event().wait()

    async def rollout() -> None:
        config = job_configs(1, 2, 1, 0).rollout  # groupSize ≥ 2 is the spec's rule
        running, servicer = await serve_rollout(config, "127.0.0.1", port, engine=NullEngine(), token=token)  # type: ignore[arg-type]
        servicer.max_completions_per_message = per_message
        print(f"rollout 'null' serving on 127.0.0.1:{running.port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(reward() if role == "reward" else rollout())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--max-staleness", type=int, default=1)
    parser.add_argument("--serve", nargs=3, metavar=("ROLE", "PORT", "PER_MESSAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), int(args.serve[2]))
        return 0
    shape = (args.steps, args.group_size, args.prompts_per_step, args.max_staleness)
    results = {}
    for label, per_message in (("one sample per message (baseline)", 1), ("batched messages", 0)):
        result = results[per_message] = asyncio.run(measure(*shape, per_message=per_message))
        print(
            f"{label}: {result.samples} samples in {result.seconds:.2f} s: {result.per_second:,.0f} samples/s "
            f"({result.per_second / TARGET:.2f} of the {TARGET:,} target); CPU per sample: controller process "
            f"{result.cpu_us_per_sample:.0f} µs (its own core's worth: {result.one_core_per_second:,.0f} samples/s, "
            f"{result.one_core_per_second / TARGET:.2f} of the target), the two null replicas "
            f"{result.replicas_us_per_sample:.0f} µs",
            flush=True,
        )
    ratio = results[0].per_second / results[1].per_second
    cpu_ratio = results[1].cpu_us_per_sample / results[0].cpu_us_per_sample
    print(
        f"batched ÷ baseline: {ratio:.2f}× samples/s, the controller's CPU per sample {cpu_ratio:.2f}× lower "
        f"({os.cpu_count()} cores on this machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
