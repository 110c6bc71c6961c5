"""Episodes per second: rljob's streamed episodes vs a turn-synchronous agent loop, at environment step
latencies of 10, 100 and 400 ms.

One rollout replica (the real hf engine on the tiny model's shape, `rljob make-model`'s, untrained so the
build takes seconds) and one environment replica (`paced_game.PacedGame`: a game of 1 to 2 × `--turns` − 1
turns whose steps take log-normal times of the latency's mean, all drawn from the episode's seed) run as
child processes behind their gRPC services, as in a job. This process drives the same episodes with the same
seeds two ways:

  turn-synchronous  what simple agent loops do: `--in-flight` episodes at a time; every live episode's turn
                    k is generated as one batch, then every environment step runs (concurrently), then
                    turn k+1; the next episodes start when the whole batch is done
  streamed          rljob's EpisodeRunner: up to `--in-flight` episodes live, each advancing the moment its
                    environment answers; a finished episode's place goes to the next at once

Reported per latency: episodes/s of each, their ratio, the rollout engine's idle share (1 − the share of
the wall time with at least one generation in flight, from the driver's exact busy clock), and CPU per model
turn of this process and of the rollout replica's. Figures and what they say: README.md.

    python benchmarks/episodes/run.py [--episodes 128] [--in-flight 32] [--turns 3]
                                      [--latencies-ms 10,100,400] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# The environment replica imports `paced_game` from here.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)

from rljob_workers.common.grpc_env import use_grpc_process_env  # noqa: E402

use_grpc_process_env()  # before the imports below load grpc
from rljob_api import parse_rljob  # noqa: E402
from rljob_api.workercfg import WorkerConfigs, derive_worker_configs  # noqa: E402
from rljob_workers.driver.controller.data import Prompt  # noqa: E402
from rljob_workers.driver.controller.episode import Play  # noqa: E402
from rljob_workers.driver.controller.episodes import EpisodeRunner  # noqa: E402
from rljob_workers.driver.controller.observations import ObservationEncoder  # noqa: E402
from rljob_workers.driver.controller.report import Counts  # noqa: E402
from rljob_workers.driver.pools.environment import EnvironmentClients  # noqa: E402
from rljob_workers.driver.pools.rollout import RolloutClients  # noqa: E402

sys.path.insert(0, str(HERE))  # the benchmark's own modules, also when loaded by file path
from turn_synchronous import play_turn_synchronous  # noqa: E402

ENVIRONMENT = "paced_game:PacedGame"
MAX_POSITIONS = 128


@dataclass(frozen=True)
class Result:
    loop: str
    step_ms: float
    episodes: int
    turns: int
    seconds: float
    engine_busy_seconds: float
    driver_cpu_seconds: float  # this process's: the controller's side of every turn
    rollout_cpu_seconds: float  # the rollout replica's process: gRPC and the engine

    @property
    def per_second(self) -> float:
        return self.episodes / self.seconds

    @property
    def engine_idle(self) -> float:
        return max(0.0, 1.0 - self.engine_busy_seconds / self.seconds)


def job_configs(model: Path, environment: str, args: argparse.Namespace) -> WorkerConfigs:
    doc = yaml.safe_load((REPO / "examples" / "calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(model)
    spec["data"].pop("eval")  # episodes of the benchmark's own
    spec["environment"] = {
        "kind": "remote",
        "remote": {"endpoints": [environment]},
        "maxTurns": 2 * args.turns - 1,  # the longest game
        "maxEpisodesPerReplica": args.in_flight,
        "maxEpisodeTokens": MAX_POSITIONS,  # room for every turn: both loops play every episode to its end
        "stepTimeoutSeconds": 30,
    }
    spec["rollout"]["sampling"]["maxNewTokens"] = args.max_new_tokens
    return derive_worker_configs(parse_rljob(doc))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(role: str, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    command = [sys.executable, __file__, "--serve", role, str(port), *extra]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    assert child.stdout is not None
    if not child.stdout.readline():  # its "serving" line
        raise RuntimeError(f"the {role} replica exited before serving (exit code {child.wait()})")
    return child, f"127.0.0.1:{port}"


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prompts(count: int) -> list[Prompt]:
    return [
        Prompt(f"e0-{i}", f"{i % 90 + 10}+{i % 7 + 1}=", {"answer": str(i % 90 + 11 + i % 7)}) for i in range(count)
    ]


async def measure(
    loop: str, configs: WorkerConfigs, rollout: str, environment: str, args: argparse.Namespace
) -> Result:
    """Play `args.episodes` episodes one way; the figures."""
    config = configs.controller
    clients = RolloutClients(max_in_flight=10**6)
    environments = EnvironmentClients(max_episodes=args.in_flight, step_timeout=30.0)
    replica = clients.add("rollout-0", rollout)
    environments.add("environment-0", environment)
    counts = Counts()
    try:
        info = await environments.info()
        play = Play(config, clients, environments, ObservationEncoder(config.model_path), info)
        todo = prompts(args.episodes)
        start, cpu, rollout_cpu = time.monotonic(), time.process_time(), cpu_seconds(args.rollout_pid)
        if loop == "streamed":
            runner, slots = EpisodeRunner(play, counts), asyncio.Semaphore(args.in_flight)

            async def one(prompt: Prompt) -> None:
                async with slots:
                    await runner.run(prompt, 0)

            await asyncio.gather(*(one(p) for p in todo))
        else:
            for first in range(0, len(todo), args.in_flight):
                counts.turns += await play_turn_synchronous(play, replica, todo[first : first + args.in_flight])
                counts.episodes += len(todo[first : first + args.in_flight])
        seconds, cpu = time.monotonic() - start, time.process_time() - cpu
        rollout_cpu = cpu_seconds(args.rollout_pid) - rollout_cpu
    finally:
        await environments.close()
        await clients.close()
    return Result(loop, args.step_ms, counts.episodes, counts.turns, seconds, clients.busy.seconds(), cpu, rollout_cpu)


async def measure_latency(model: Path, rollout: str, args: argparse.Namespace) -> list[Result]:
    env = {"RLJOB_BENCH_STEP_MS": str(args.step_ms), "RLJOB_BENCH_TURNS": str(args.turns)}
    child, environment = _start("environment", str(args.in_flight), env=env)
    try:
        configs = job_configs(model, environment, args)
        return [await measure(loop, configs, rollout, environment, args) for loop in ("turn-synchronous", "streamed")]
    finally:
        child.terminate()
        child.wait()


def serve(role: str, port: int, extra: list[str]) -> None:
    """A child: the rollout replica on model `extra[0]`, or the paced environment with `extra[0]` slots."""
    from rljob_workers.environment.server import start_environment_server
    from rljob_workers.rollout.server import serve_rollout

    async def main() -> None:
        if role == "rollout":
            args = argparse.Namespace(turns=3, in_flight=64, max_new_tokens=8)
            config = job_configs(Path(extra[0]), "127.0.0.1:1", args).rollout
            running, _ = await serve_rollout(config, "127.0.0.1", port)
        else:
            running, _ = await start_environment_server(ENVIRONMENT, port=port, max_episodes=int(extra[0]))
        print(f"{role} serving on 127.0.0.1:{running.port}", flush=True)
        await asyncio.Event().wait()  # `running` keeps the server alive until the parent ends this process

    asyncio.run(main())


def build_model(out: Path) -> Path:
    """The tiny calculator model's shape, untrained: what the engine costs, not what it says, matters here."""
    from rljob_workers.models.tiny import make_tiny_model

    return make_tiny_model(out, "arithmetic", sft_steps=0, max_positions=MAX_POSITIONS)


def table(results: list[Result]) -> str:
    """One row per loop and latency: episodes/s, the engine's idle share, CPU per model turn, the ratio."""
    head = f"{'step':>7}  {'loop':<16} {'episodes/s':>10} {'engine idle':>11} {'CPU/turn: driver':>16} {'rollout':>8}"
    lines = [f"{head} {'streamed ÷ sync':>15}"]
    by_latency: dict[float, dict[str, Result]] = {}
    for r in results:
        by_latency.setdefault(r.step_ms, {})[r.loop] = r
    for step_ms, pair in by_latency.items():
        ratio = pair["streamed"].per_second / pair["turn-synchronous"].per_second
        for loop, r in pair.items():
            shown = f"{ratio:.2f}×" if loop == "streamed" else ""
            driver, rollout = (1000 * seconds / r.turns for seconds in (r.driver_cpu_seconds, r.rollout_cpu_seconds))
            lines.append(
                f"{step_ms:>4.0f} ms  {loop:<16} {r.per_second:>10.2f} {r.engine_idle:>11.0%} {driver:>13.2f} ms "
                f"{rollout:>5.2f} ms {shown:>15}"
            )
    return "\n".join(lines)


def ratios(results: list[Result]) -> dict[float, float]:
    """streamed ÷ turn-synchronous episodes/s, by step latency."""
    rates = {(r.step_ms, r.loop): r.per_second for r in results}
    return {ms: rates[(ms, "streamed")] / rates[(ms, "turn-synchronous")] for ms, loop in rates if loop == "streamed"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--in-flight", type=int, default=32, help="episodes live at once, in both loops")
    parser.add_argument("--turns", type=int, default=3, help="model turns of every episode")
    parser.add_argument("--max-new-tokens", type=int, default=8, help="the longest model turn")
    parser.add_argument("--latencies-ms", default="10,100,400", help="environment step latencies to run")
    parser.add_argument("--model", type=Path, help="a model directory (default: the untrained tiny model)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.serve[2:])
        return 0
    with tempfile.TemporaryDirectory(prefix="rljob-episodes-bench-") as tmp:
        model = args.model or build_model(Path(tmp) / "model")
        # one torch thread, as a rollout actor of `cpus: 1` has (common.actor.limit_threads)
        rollout_child, rollout = _start("rollout", str(model), env={"OMP_NUM_THREADS": "1"})
        args.rollout_pid = rollout_child.pid
        try:
            results = []
            for step_ms in (float(ms) for ms in args.latencies_ms.split(",")):
                args.step_ms = step_ms
                results += asyncio.run(measure_latency(model, rollout, args))
                print(table([r for r in results if r.step_ms == step_ms]).split("\n", 1)[1], flush=True)
        finally:
            rollout_child.terminate()
            rollout_child.wait()
    print(f"\n{args.episodes} episodes of {args.turns} turns, {args.in_flight} in flight ({os.cpu_count()} cores):")
    print(table(results))
    print(
        "streamed ÷ turn-synchronous: "
        + ", ".join(f"{ratio:.2f}× at {ms:.0f} ms" for ms, ratio in ratios(results).items())
    )
    if args.json:
        rows = [{**asdict(r), "per_second": r.per_second, "engine_idle": r.engine_idle} for r in results]
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
