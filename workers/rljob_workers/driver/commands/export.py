"""`rljob export`: a checkpoint's policy as a plain Hugging Face model folder.

A checkpoint's `model/` is already a transformers folder, in fp32 (the trainer's master weights) and
beside the optimizer state and the controller's. The export writes the weights alone, as safetensors
in the dtype asked for, with the tokenizer and its chat template, so that transformers' and vLLM's
`from_pretrained` load the folder as it is. Paths are checked before torch is imported: a wrong one
fails at once, in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rljob_workers.trainer import checkpoint

# What marks a folder as holding a tokenizer a transformers AutoTokenizer can load.
TOKENIZER_FILE = "tokenizer_config.json"


class ExportError(RuntimeError):
    """The export cannot start; the message names the path and what is wrong with it."""


def step_folder(path: Path) -> Path:
    """The checkpoint `path` names: a `step-NNNNNN` folder, or a checkpoint root (its `latest` one)."""
    if not path.is_dir():
        raise ExportError(f"{path}: no such checkpoint folder")
    if (path / checkpoint.STATE).is_file():
        found = path
    elif (path / checkpoint.LATEST).is_file() or checkpoint.complete_steps(path):
        whole = checkpoint.latest(path)
        if whole is None:
            raise ExportError(f"{path / checkpoint.LATEST} names no whole checkpoint, and no step folder is whole")
        found = whole
    else:
        raise ExportError(
            f"{path}: not a checkpoint: neither a step folder ({checkpoint.STATE}) nor a checkpoint folder "
            f"({checkpoint.LATEST})"
        )
    if not (found / "model" / "config.json").is_file():
        raise ExportError(f"{found / 'model'}: the checkpoint has no model (no config.json there)")
    return found


def tokenizer_folder(model: Path, fallback: Path | None) -> Path:
    """Where the tokenizer is: the checkpoint's model folder (the trainer saves it there), else `fallback`."""
    for folder in (model, fallback):
        if folder is not None and (folder / TOKENIZER_FILE).is_file():
            return folder
    named = f"{model} nor in --tokenizer {fallback}" if fallback else f"{model}; name one with --tokenizer"
    raise ExportError(f"no tokenizer ({TOKENIZER_FILE}) in {named}")


def check_out(out: Path) -> None:
    """`out` must be new or an empty folder: an export never mixes with other files."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out}: exists and is not an empty folder")


def export(model: Path, tokenizer: Path, out: Path, dtype: str | None) -> Path:
    """Write `model` (a transformers folder) to `out` in `dtype` (None: as stored) with `tokenizer`'s files.

    Written into a sibling folder first and moved into place whole, so a failed export leaves no
    half-written `out` behind."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, dtype) if dtype else "auto", local_files_only=True
        )
        loaded.save_pretrained(staging, safe_serialization=True)
        AutoTokenizer.from_pretrained(tokenizer, local_files_only=True).save_pretrained(staging)
        if out.exists():
            out.rmdir()  # empty (check_out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def stored_dtype(model: Path) -> str:
    config = json.loads((model / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "float32")


def run_export(path: Path, out: Path, dtype: str | None, tokenizer: Path | None) -> int:
    """The `rljob export` command: check the paths, then export; exit 2 with one line on bad input."""
    try:
        folder = step_folder(path)
        tokenizer_dir = tokenizer_folder(folder / "model", tokenizer)
        check_out(out)
    except ExportError as exc:
        print(f"rljob export: {exc}", file=sys.stderr)
        return 2
    export(folder / "model", tokenizer_dir, out, dtype)
    step = checkpoint.read_state(folder).get("step", "?")
    print(f"exported {folder} (step {step}) to {out} in {dtype or stored_dtype(folder / 'model')}")
    return 0
