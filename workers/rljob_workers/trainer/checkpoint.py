"""Checkpoint directories: `step-NNNNNN/{model/, optimizer.pt, state.json}` and a `latest` pointer.

`latest` is written last and atomically, so a run killed while saving resumes from the
previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

LATEST = "latest"
STATE = "state.json"


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def commit(root: Path, directory: Path, state: dict[str, Any], keep: int) -> Path:
    """Write `state.json`, point `latest` at `directory`, then delete the oldest others so that
    `keep` remain: `directory` itself, the one `latest` names, is never among them."""
    tmp_state = directory / f".{STATE}.tmp"
    tmp_state.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp_state, directory / STATE)  # the folder is complete only once state.json is whole
    tmp = root / f".{LATEST}.tmp"
    tmp.write_text(directory.name)
    os.replace(tmp, root / LATEST)
    others = sorted(p for p in root.glob("step-*") if p.is_dir() and p.name != directory.name)
    for old in others[: max(0, len(others) - (keep - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return directory


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under `root`, if any."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    directory = root / pointer.read_text().strip()
    if not (directory / STATE).is_file():
        raise FileNotFoundError(f"{pointer} names {directory}, which has no {STATE}")
    return directory


def read_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((directory / STATE).read_text())
    return state
