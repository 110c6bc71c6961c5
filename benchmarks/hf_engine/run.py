"""The hf engine's behaviour log-probs against plain `generate`: peak memory and speed, side by side.

Three ways to sample the same batch with a random Llama (local, no download) whose vocabulary is
large enough for logits to matter: plain `model.generate` (the baseline, no log-probs at all);
the engine's way (`_SampledLogprobs`, a forward hook that keeps one step's log-softmax at a time);
and the old way (`output_logits=True`, every step's full-vocabulary logits kept until the end).
Each runs in a fresh process, so its peak is its own: on a GPU `torch.cuda.max_memory_allocated`,
on a CPU the resident set's growth during generation (ru_maxrss against the RSS before it, with
glibc's mmap threshold fixed: see run_all).

    python benchmarks/hf_engine/run.py [--batch 16] [--new-tokens 256] [--vocab 32000] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import torch

VARIANTS = ("plain", "engine", "all-logits")


def _model(vocab: int, device: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        eos_token_id=vocab + 1,
        pad_token_id=0,
    )  # an EOS outside the vocabulary: every row runs the full length
    model: Any = LlamaForCausalLM(config)
    return model.to(device).eval()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure(variant: str, batch: int, new_tokens: int, vocab: int, device: str, repeats: int = 3) -> dict[str, float]:
    """One variant in this process: seconds of the best of `repeats` runs, and its peak memory in bytes."""
    from transformers import GenerationConfig

    from rljob_workers.engines.hf import _SampledLogprobs

    model = _model(vocab, device)
    ids = torch.randint(1, vocab, (batch, 16), device=device)
    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        return_dict_in_generate=True, output_logits=variant == "all-logits", pad_token_id=0,
    )  # fmt: skip
    best, rss_before = float("inf"), _rss_bytes()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.no_grad():
            if variant == "engine":
                sampled = _SampledLogprobs(1.0)
                hook = model.register_forward_hook(sampled, with_kwargs=True)
                out = model.generate(input_ids=ids, generation_config=config)
                hook.remove()
                sampled.result(out.sequences[:, ids.shape[1] :])
            elif variant == "all-logits":
                out = model.generate(input_ids=ids, generation_config=config)
                torch.stack([torch.log_softmax(step.float(), -1) for step in out.logits])
            else:
                out = model.generate(input_ids=ids, generation_config=config)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
        del out
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    return {"seconds": best, "peak_bytes": float(max(peak, 1))}


def run_all(
    batch: int, new_tokens: int, vocab: int, device: str, rounds: int = 2, repeats: int = 3
) -> dict[str, dict[str, float]]:
    """Each variant in a process of its own, the variants taking turns for `rounds` rounds (a busy
    machine slows them alike); the best time and the smallest peak of each.

    glibc's malloc raises its mmap threshold after the first large free, and then keeps freed
    temporaries (a step's logits) in the heap, which the resident set counts; a fixed threshold
    returns them, so the peak is what a variant holds rather than what the allocator kept."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    results: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for variant in VARIANTS:
            args = [sys.executable, __file__, "--one", variant, "--batch", str(batch), "--new-tokens", str(new_tokens)]
            args += ["--vocab", str(vocab), "--device", device, "--repeats", str(repeats)]
            out = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            best = results.setdefault(variant, got)
            results[variant] = {k: min(best[k], got[k]) for k in got}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=3, help="runs per process; the best time counts")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # a child process's variant
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.batch, args.new_tokens, args.vocab, args.device, args.repeats)))
        return 0
    results = run_all(args.batch, args.new_tokens, args.vocab, args.device)
    plain = results["plain"]
    print(f"{args.batch} sequences x {args.new_tokens} new tokens, vocabulary {args.vocab}, {args.device}\n")
    print("| variant | seconds | speed vs plain | peak memory | memory vs plain |")
    print("|---|---|---|---|---|")
    for variant, r in results.items():
        speed, memory = plain["seconds"] / r["seconds"], r["peak_bytes"] / plain["peak_bytes"]
        print(f"| {variant} | {r['seconds']:.2f} | {speed:.2f} | {r['peak_bytes'] / 2**20:.0f} MiB | {memory:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
