"""rljob's rollout server against vLLM's own AsyncLLM: tokens/s on the same prompts, side by side, one run.

- baseline: vLLM's `AsyncLLM`, called directly: every sample its own request (as rljob's adapter makes them),
  all submitted at once, the sampled token's log-prob asked for (rljob needs it);
- rljob: the same engine arguments (`rljob_workers.engines.vllm.engine_args`) behind rljob's RolloutService
  (`serve_rollout`: the VLLMEngine adapter, its version gate, the gRPC server), called over gRPC on loopback
  with one GenerateRequest of all the prompts, as the controller calls a replica.

Each side runs in a process of its own (one vLLM engine per process: its in-process worker initialises
torch.distributed), one warm-up round, then `--reps` timed rounds; a round's tokens/s is every generated
token over its wall time. The ratio is rljob's median over the baseline's (#35's bar: >= 0.9). Runs with vLLM's
environment (runtimes/vllm.sh), each side re-executing this script there; the model is vllm_bench.py's (~25 M
parameters, built once under --cache), whose samples all run to --max-new-tokens.

    python benchmarks/vllm_engine/run.py [--prompts 16] [--n 8] [--max-new-tokens 64] [--reps 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's own module, also when loaded by path
from vllm_bench import REPO, bench_model, run_side

SIDES = ("baseline", "rljob")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "models", help="where the model is built")
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)  # built by the parent
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--prompt-len", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # one side, in its own process
    return parser.parse_args(argv)


def prompts(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    pick = random.Random(0)
    return [[pick.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]


def worker_config(args: argparse.Namespace) -> Any:
    from rljob_api.workercfg import RolloutWorkerConfig

    return RolloutWorkerConfig(
        model_path=str(args.model),
        dtype="float32",
        engine="vllm",
        gpus=0,
        tensor_parallel_size=1,
        max_concurrent_prompts=args.prompts * args.n,
        gpu_memory_utilization=0.9,
        seed=1,
    )


async def baseline_rounds(args: argparse.Namespace, token_ids: list[list[int]]) -> list[dict[str, float]]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # as the adapter runs it on a CPU
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    from rljob_workers.engines.base import derive_seed
    from rljob_workers.engines.vllm import engine_args

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args(worker_config(args))))
    calls = iter(range(1 << 30))

    async def one(ids: list[int], seed: int) -> int:
        params = SamplingParams(n=1, temperature=1.0, max_tokens=args.max_new_tokens, seed=seed, logprobs=0)
        final = None
        async for output in engine.generate(TokensPrompt(prompt_token_ids=ids), params, f"r{next(calls)}"):
            final = output
        assert final is not None
        return len(final.outputs[0].token_ids)

    async def round_() -> int:
        # The seeds rljob's adapter gives these samples (request seed 1, prompt p{p}, index i), so both sides
        # sample the same sequences: with other seeds a few baseline samples drew the (suppressed) EOS early
        # (8,009 tokens a round against rljob's 8,192), and the sides did not do the same work.
        jobs = [one(ids, derive_seed(1, f"p{p}/{i}")) for p, ids in enumerate(token_ids) for i in range(args.n)]
        return sum(await asyncio.gather(*jobs))

    try:
        return await timed_rounds(args, round_)
    finally:
        engine.shutdown()


async def rljob_rounds(args: argparse.Namespace, token_ids: list[list[int]]) -> list[dict[str, float]]:
    import grpc

    from rljob.v1 import rollout_service_pb2 as pb
    from rljob.v1 import rollout_service_pb2_grpc as pb_grpc
    from rljob.v1 import sample_pb2
    from rljob_workers.rollout.server import serve_rollout

    running, servicer = await serve_rollout(worker_config(args))
    sampling = sample_pb2.SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=1)
    request = pb.GenerateRequest(
        prompts=[pb.PromptRequest(prompt_id=f"p{i}", token_ids=ids, n=args.n) for i, ids in enumerate(token_ids)],
        sampling=sampling,
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    stub = pb_grpc.RolloutServiceStub(channel)

    async def round_() -> int:
        tokens = 0
        async for response in stub.Generate(request):
            done = [response.completion] if response.HasField("completion") else []
            tokens += sum(len(c.token_ids) for c in [*done, *response.completions])
        return tokens

    try:
        return await timed_rounds(args, round_)
    finally:
        await channel.close(grace=None)
        await servicer.close()
        await running.stop()


async def timed_rounds(args: argparse.Namespace, round_: Any) -> list[dict[str, float]]:
    await round_()  # warm-up: the engine's first batches
    rounds = []
    for _ in range(args.reps):
        started = time.perf_counter()
        tokens = await round_()
        seconds = time.perf_counter() - started
        rounds.append({"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)})
    return rounds


def measure_side(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    token_ids = prompts(args, vocab)
    measure = baseline_rounds if args.side == "baseline" else rljob_rounds
    print(json.dumps({"side": args.side, "rounds": asyncio.run(measure(args, token_ids))}))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.side:
        return measure_side(args)
    model = bench_model(args.cache)
    given = [*(argv if argv is not None else sys.argv[1:]), "--model", str(model)]
    sides = {side: run_side(Path(__file__).resolve(), given, side)["rounds"] for side in SIDES}
    medians = {side: statistics.median(r["tokens_per_s"] for r in rounds) for side, rounds in sides.items()}
    ratio = medians["rljob"] / medians["baseline"]
    result = {
        "prompts": args.prompts,
        "samples_per_prompt": args.n,
        "max_new_tokens": args.max_new_tokens,
        "sides": sides,
        "median_tokens_per_s": medians,
        "rljob_over_asyncllm": round(ratio, 3),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
    }
    print(json.dumps(result, indent=2))
    print(f"tokens/s: AsyncLLM {medians['baseline']:.0f}, rljob over gRPC {medians['rljob']:.0f}, ratio {ratio:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
