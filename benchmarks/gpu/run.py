"""The GPU check: each part of the project against its plain baseline, side by side in one run.

One row per check, on one device (CUDA when there is one):

- trainer step: PolicyTrainer.train_step against a plain torch loop (same model, batch and
  clipped-surrogate loss, same autocast, clipping and AdamW): seconds per step;
- hf engine: HFEngine.generate (behaviour log-probs included) against plain `model.generate` on
  the same model, prompts and seed: speed and peak memory (CUDA: torch.cuda.max_memory_allocated;
  CPU: the resident set's growth, sampled every millisecond in this process);
- weight sync: publish -> receive through the checkpoint engine to a second process against a raw
  broadcast of the same bytes over the same group (NCCL with two GPUs, else gloo: sync_check.py);
- fp32 masters: bf16 compute, lr 1e-6, one optimizer step: the fraction of the master weights
  with a gradient that changed (bar: >= 99%; a bf16 weight cannot take such an update);
- behaviour log-probs: the engine's sampled-token log-probs against the trainer's teacher-forced
  forward of the same tokens (bar: max |diff| <= 1e-3 in float32, 0.1 in a 16-bit dtype).

"speed" is baseline seconds / ours (>= 1: ours is faster); "memory" is ours / baseline. Without
--model a random Llama with the project's character tokenizer is built locally, never downloaded.
Exit status: 1 when a bar fails, 77 (skipped) for --device cuda where torch sees no CUDA device.

    python benchmarks/gpu/run.py [--device auto|cpu|cuda] [--quick] [--model PATH] [--dtype auto]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the check's own modules, also when loaded by file path
from peak_memory import PeakMemory, return_freed_memory
from sync_check import device_sync, measure_sync

SKIPPED = 77  # the exit status test harnesses read as "skipped"
LOGPROB_BAR = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.1}
MASTER_BAR = 0.99
ENGINE_SPEED_BAR, ENGINE_MEMORY_BAR = 0.9, 1.3  # on CUDA only: a CPU's resident set is too coarse to hold 1.3


@dataclass(frozen=True)
class Size:
    """The model built when no --model is given, and the work each check does."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int  # 0: the tokenizer's; larger: rows no text reaches, as padded vocabularies have
    batch: int
    prompt: int
    new_tokens: int
    steps: int  # timed train steps of each kind
    repeats: int  # timed generations of each kind
    sync_reps: int  # timed transfers of each kind


QUICK = Size(64, 2, 4, 256, 0, batch=4, prompt=8, new_tokens=16, steps=3, repeats=2, sync_reps=3)
FULL = Size(1024, 12, 16, 2816, 32000, batch=16, prompt=64, new_tokens=256, steps=10, repeats=3, sync_reps=5)


@dataclass
class Row:
    """One line of the table: a check, ours against its baseline, and its bar if it has one."""

    check: str
    ours: str
    baseline: str = "-"
    ratio: str = "-"
    bar: str = "-"
    ok: bool | None = None  # None: measured, no bar
    note: str = ""

    @property
    def status(self) -> str:
        return "info" if self.ok is None else "pass" if self.ok else "FAIL"


def build_model(out: Path, size: Size) -> Path:
    """A random Llama of `size` with the character tokenizer of rljob_workers.models.tiny, saved at `out`."""
    from rljob_workers.models import tiny

    spec = tiny.TinyModelSpec(
        hidden_size=size.hidden, intermediate_size=size.ffn, num_layers=size.layers, num_heads=size.heads,
        max_positions=max(64, 2 * (size.prompt + size.new_tokens)),
    )  # fmt: skip
    tokenizer = tiny.char_tokenizer(max_length=spec.max_positions)
    torch.manual_seed(0)
    model = tiny.build_model(tokenizer, spec)
    if size.vocab > len(tokenizer):
        model.resize_token_embeddings(size.vocab, mean_resizing=False)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def trainer_for(model: Path, device: torch.device, dtype: str, batch: int, lr: float = 1e-6) -> Any:
    """The project's trainer, one rank, one micro-batch per step (as the plain loop does)."""
    from rljob_api import AlgorithmSpec, CheckpointSpec, WeightSyncSpec, resolve_algorithm
    from rljob_api.workercfg import TrainerWorkerConfig
    from rljob_workers.trainer.policy import PolicyTrainer

    config = TrainerWorkerConfig(
        model_path=str(model), dtype=dtype, algorithm=resolve_algorithm(AlgorithmSpec(learning_rate=lr), 256),
        temperature=1.0, strategy="ddp", world_size=1, gpus_per_node=int(device.type == "cuda"),
        micro_batch_size=batch, gradient_checkpointing=False, checkpoint=CheckpointSpec(), weight_sync=WeightSyncSpec(),
    )  # fmt: skip
    return PolicyTrainer(config, device)


def teacher_forced(trainer: Any, samples: list[Any]) -> list[torch.Tensor]:
    """The trainer's own log-probs of each sample's completion tokens (its forward, autocast included)."""
    from rljob_workers.trainer.microbatch import collate

    batch = collate(samples, trainer.pad_id, trainer.device)
    with torch.no_grad():
        logprobs = trainer._logprobs(trainer.model, batch)  # the quantity train_step puts in the ratio
    return [row[mask == 1].float().cpu() for row, mask in zip(logprobs, batch["mask"], strict=True)]


def train_samples(trainer: Any, size: Size, token_range: tuple[int, int]) -> list[Any]:
    """Random prompt + completion tokens, advantages +-1, behaviour log-probs the policy's own (on-policy)."""
    from rljob_workers.trainer.samples import TrainSample

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(*token_range, (size.batch, size.prompt + size.new_tokens), generator=gen).tolist()
    samples = [
        TrainSample(row[: size.prompt], row[size.prompt :], [0.0] * size.new_tokens, (-1.0) ** i)
        for i, row in enumerate(ids)
    ]
    for sample, logprobs in zip(samples, teacher_forced(trainer, samples), strict=True):
        sample.behaviour_logprobs = logprobs.tolist()
    return samples


def clocked(fn: Callable[[], Any], device: torch.device) -> float:
    device_sync(device)
    start = time.perf_counter()
    fn()
    device_sync(device)
    return time.perf_counter() - start


def plain_step_fn(model_path: Path, trainer: Any, samples: list[Any]) -> Callable[[], None]:
    """One step of a plain torch loop: the trainer's model, batch, loss shape, autocast, clipping and AdamW."""
    from transformers import AutoModelForCausalLM

    from rljob_workers.trainer.microbatch import collate

    algo, device, dtype = trainer.algo, trainer.device, trainer.compute_dtype
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, local_files_only=True)
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=algo.learning_rate, weight_decay=algo.weight_decay)
    batch = collate(samples, trainer.pad_id, device)
    ids, mask, adv = batch["input_ids"], batch["mask"], batch["advantages"][:, None]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=ids, attention_mask=batch["attention_mask"]).logits
        logprobs = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(logprobs - batch["behaviour"])
        clipped = ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high)
        loss = -(torch.minimum(ratio * adv, clipped * adv) * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), algo.max_grad_norm)
        optimizer.step()

    return step


def trainer_row(model_path: Path, trainer: Any, size: Size, token_range: tuple[int, int]) -> Row:
    samples = train_samples(trainer, size, token_range)
    tokens = sum(len(s.token_ids) for s in samples)
    runs: dict[str, Callable[[], Any]] = {"ours": partial(trainer.train_step, samples, len(samples), tokens)}
    runs["plain"] = plain_step_fn(model_path, trainer, samples)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for step in range(size.steps + 1):  # the first of each is a warm-up
        for name in ("ours", "plain") if step % 2 == 0 else ("plain", "ours"):
            times[name].append(clocked(runs[name], trainer.device))
    mine, base = (statistics.median(times[k][1:]) for k in ("ours", "plain"))
    return Row(
        "trainer step", f"{mine:.4f} s/step", f"plain torch loop {base:.4f} s/step", f"speed {base / mine:.2f}",
        note=f"{size.batch} x {size.prompt}+{size.new_tokens} tokens, {trainer.compute_dtype}, median of {size.steps}",
    )  # fmt: skip


async def engine_vs_generate(engine: Any, size: Size, token_range: tuple[int, int]) -> tuple[Row, list[Any]]:
    """HFEngine.generate against engine.model.generate with the engine's own config and seed; its last samples."""
    from rljob_workers.engines.base import PromptInput, SamplingConfig, derive_seed
    from rljob_workers.engines.hf import _generation_config

    device = torch.device(engine.device)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(*token_range, (size.batch, size.prompt), generator=gen)
    prompts = [PromptInput(f"p{i}", tuple(row)) for i, row in enumerate(ids.tolist())]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=size.new_tokens, seed=1)
    ids, config = ids.to(device), _generation_config(sampling)
    samples: list[Any] = []

    async def ours() -> None:
        samples[:] = [sample async for sample in engine.generate(prompts, sampling)]

    async def plain() -> None:
        torch.manual_seed(derive_seed(sampling.seed, "p0/0"))  # the seed the engine sets for this batch
        with torch.no_grad():
            engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)

    results: dict[str, list[tuple[float, int]]] = {"ours": [], "plain": []}
    for rep in range(size.repeats + 1):  # the first of each is a warm-up
        for name in ("ours", "plain") if rep % 2 == 0 else ("plain", "ours"):
            with PeakMemory(device) as memory:
                start = time.perf_counter()
                await (ours() if name == "ours" else plain())
                device_sync(device)
                seconds = time.perf_counter() - start
            results[name].append((seconds, memory.peak))
    best = {name: (min(t for t, _ in r[1:]), min(m for _, m in r[1:])) for name, r in results.items()}
    (mine, mine_mem), (base, base_mem) = best["ours"], best["plain"]
    on_cuda = device.type == "cuda"
    kind = "max_memory_allocated" if on_cuda else "CPU: peak RSS growth, sampled every ms"
    speed, memory_ratio = base / mine, mine_mem / base_mem
    row = Row(
        "hf engine", f"{mine:.3f} s, {mine_mem / 2**20:.2f} MiB",
        f"plain generate {base:.3f} s, {base_mem / 2**20:.2f} MiB", f"speed {speed:.2f}, memory {memory_ratio:.2f}",
        bar=f"speed >= {ENGINE_SPEED_BAR:g}, memory <= {ENGINE_MEMORY_BAR:g}" if on_cuda else "-",
        ok=speed >= ENGINE_SPEED_BAR and memory_ratio <= ENGINE_MEMORY_BAR if on_cuda else None,
        note=f"{size.batch} x {size.new_tokens} new tokens, {engine.model.dtype}, best of {size.repeats}; {kind}",
    )  # fmt: skip
    return row, samples


def logprob_row(trainer: Any, samples: list[Any]) -> Row:
    """The engine's behaviour log-probs against the trainer's teacher-forced forward of the same tokens."""
    from rljob_workers.trainer.samples import TrainSample

    train = [TrainSample(list(s.prompt_token_ids), list(s.token_ids), [0.0] * len(s.token_ids), 0.0) for s in samples]
    forced = torch.cat(teacher_forced(trainer, train))
    behaviour = torch.tensor([lp for s in samples for lp in s.logprobs])
    diff = (forced - behaviour).abs()
    bar = LOGPROB_BAR.get(trainer.compute_dtype, 0.1)
    return Row(
        "behaviour log-probs", f"max abs diff {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}",
        "trainer's teacher-forced forward", bar=f"max <= {bar:g}", ok=float(diff.max()) <= bar,
        note=f"{diff.numel()} sampled tokens, {trainer.compute_dtype}",
    )  # fmt: skip


def master_row(model_path: Path, device: torch.device, size: Size, token_range: tuple[int, int]) -> Row:
    """One step at lr 1e-6 with bf16 compute: the fp32 masters take it; bf16 weights would mostly not."""
    trainer = trainer_for(model_path, device, "bfloat16", size.batch, lr=1e-6)
    samples = train_samples(trainer, size, token_range)
    before = {name: p.detach().clone() for name, p in trainer.policy.named_parameters()}
    trainer.train_step(samples, len(samples), sum(len(s.token_ids) for s in samples))
    touched = changed = changed_in_bf16 = 0
    for name, param in trainer.policy.named_parameters():
        if param.grad is None:
            continue
        has_grad, old, new = param.grad != 0, before[name], param.detach()
        touched += int(has_grad.sum())
        changed += int(((new != old) & has_grad).sum())
        as_bf16 = old.bfloat16()  # the same update applied to a bf16 weight
        changed_in_bf16 += int((((as_bf16.float() + (new - old)).bfloat16() != as_bf16) & has_grad).sum())
    masters = {p.dtype for p in trainer.policy.parameters()}
    fraction, in_bf16 = changed / max(touched, 1), changed_in_bf16 / max(touched, 1)
    return Row(
        "fp32 masters, lr 1e-6", f"{100 * fraction:.2f}% changed", f"bf16 weights: {100 * in_bf16:.2f}% would",
        bar=f">= {100 * MASTER_BAR:g}%", ok=touched > 0 and fraction >= MASTER_BAR and masters == {torch.float32},
        note=f"bf16 compute, {touched} weights with a gradient, masters {', '.join(map(str, masters))}",
    )  # fmt: skip


def sync_row(weights: dict[str, torch.Tensor], reps: int) -> Row:
    r = measure_sync(weights, reps)
    return Row(
        "weight sync", f"publish -> receive {r.engine_s:.4f} s", f"raw {r.backend} broadcast {r.raw_s:.4f} s",
        f"speed {r.raw_s / r.engine_s:.2f}", bar="receiver got every version", ok=r.verified,
        note=f"{r.nbytes / 2**20:.1f} MiB in {r.buckets} bucket(s), {r.how}, median of {reps}",
    )  # fmt: skip


def run_checks(model_path: Path, device: torch.device, dtype: str, size: Size) -> list[Row]:
    """Every check, in an order that keeps them apart: the log-probs are compared before any train step."""
    from rljob_workers.engines.hf import HFEngine

    engine = HFEngine(str(model_path), device=str(device), dtype=dtype, seed=0, max_batch_sequences=size.batch)
    trainer = trainer_for(model_path, device, dtype, size.batch)
    params = sum(p.numel() for p in trainer.policy.parameters())
    print(f"model {model_path}: {params / 1e6:.1f} M parameters, compute dtype {trainer.compute_dtype}\n", flush=True)
    token_range = (4, min(len(trainer.tokenizer), trainer.policy.config.vocab_size))  # past <pad> <s> </s> <unk>

    async def generate() -> tuple[Row, list[Any]]:
        try:
            return await engine_vs_generate(engine, size, token_range)
        finally:
            await engine.close()

    engine_row, samples = asyncio.run(generate())
    logprobs = logprob_row(trainer, samples)  # the engine's weights are still the trainer's
    steps = trainer_row(model_path, trainer, size, token_range)
    weights = {name: t.clone() for name, t in trainer.named_weights()}
    transfer = sync_row(weights, size.sync_reps)
    masters = master_row(model_path, device, size, token_range)
    return [steps, engine_row, transfer, masters, logprobs]


def table(rows: list[Row]) -> str:
    lines = ["| check | ours | baseline | ratio | bar | status | note |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.check} | {r.ours} | {r.baseline} | {r.ratio} | {r.bar} | {r.status} | {r.note} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: cuda if available")
    parser.add_argument("--quick", action="store_true", help="a tiny model and few iterations: a smoke run")
    parser.add_argument("--model", type=Path, help="a local transformers causal LM (default: build a tiny one)")
    parser.add_argument("--dtype", default="auto", help="engine and trainer compute dtype (auto: bf16 on CUDA)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"SKIPPED: --device cuda needs a CUDA device; torch {torch.__version__} sees none")
        return SKIPPED
    device = torch.device("cuda", 0) if args.device != "cpu" and torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        return_freed_memory()
    size = QUICK if args.quick else FULL
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="rljob-gpu-check-") as tmp:
        model_path = args.model or build_model(Path(tmp) / "model", size)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        print(f"{name}, {torch.cuda.device_count()} GPU(s), {torch.get_num_threads()} CPU threads, "
              f"torch {torch.__version__}; {'--quick' if args.quick else 'full size'}")  # fmt: skip
        rows = run_checks(model_path, device, args.dtype, size)
    print(table(rows))
    failed = [r.check for r in rows if r.ok is False]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
