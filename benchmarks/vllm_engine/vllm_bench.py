"""What the vLLM benchmarks share: vLLM's runtime (runtimes/vllm.sh), each side in a process of its own
there, and the model they run.

The model: the tiny arithmetic model's tokenizer under a random Llama large enough that a step's work, not
Python's, sets the pace (8 layers of width 512, ~25 M parameters, 100 MB in fp32), with room for long samples
(512 positions), that never ends a sample early (its EOS row points away from the mean hidden state, as
tests/tiny_models.py does), so that both sides of a comparison generate the same number of tokens. Built once
per shape, from the tiny model `make model` writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("api", "workers", "proto/gen")  # rljob's packages, for vLLM's interpreter
TINY = REPO / ".cache" / "models" / "tiny-arith"
SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
         "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 512}  # fmt: skip


def vllm_environment() -> tuple[str, dict[str, str]]:
    """This interpreter if it has vllm, else runtimes/vllm.sh's, with rljob's source folders on its path."""
    python = sys.executable
    if importlib.util.find_spec("vllm") is None:
        if subprocess.run(["bash", str(REPO / "runtimes" / "vllm.sh"), "check"]).returncode:
            raise SystemExit("vLLM's runtime is not built: make vllm-env (or bash runtimes/vllm.sh)")
        found = subprocess.run(["bash", str(REPO / "runtimes" / "vllm.sh"), "path"], capture_output=True, text=True)
        python = found.stdout.strip()
    path = os.pathsep.join(str(REPO / folder) for folder in SOURCES)
    # one OpenMP thread pool per engine, on every core this machine gives it
    return python, {**os.environ, "PYTHONPATH": path, "VLLM_CPU_OMP_THREADS_BIND": "auto"}


def bench_model(folder: Path) -> Path:
    """The benchmarks' model (see the module's docstring), built under `folder` unless it is there."""
    out = folder / "llama-{hidden_size}x{num_hidden_layers}".format(**SHAPE)
    if (out / "model.safetensors").exists():
        return out
    if not (TINY / "tokenizer.json").exists():
        raise SystemExit(f"{TINY} is missing: make model")
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(TINY)
    for key, value in SHAPE.items():
        setattr(config, key, value)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        ids = torch.randint(3, config.vocab_size, (8, 32))
        mean = model.model(ids).last_hidden_state.reshape(-1, config.hidden_size).mean(0)
        model.lm_head.weight[config.eos_token_id] = mean * (-20.0 / mean.norm() ** 2)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (TINY / name).exists():
            shutil.copy(TINY / name, partial / name)
    partial.rename(out)
    return out


def run_side(script: Path, given: list[str], side: str, timeout: float = 1800) -> Any:
    """Run `script --side SIDE` in vLLM's runtime; the JSON object its last line printed."""
    python, env = vllm_environment()
    done = subprocess.run(
        [python, str(script), *given, "--side", side], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode:
        raise SystemExit(f"{side} failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
