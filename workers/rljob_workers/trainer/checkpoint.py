"""Checkpoint directories: `step-NNNNNN/{model/, optimizer…, state.json}` and a `latest` pointer.

A step is written under a staging name (`.step-NNNNNN.partial`), its files and folder fsynced, then renamed
into place; `latest` is replaced (fsynced too) only after that. So a folder named `step-NNNNNN` is always
whole, a committed step is never written again, and a run killed (or out of disk) while saving leaves the
previous checkpoint as it was: a resume starts from the newest whole one even when `latest` is torn or gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LATEST = "latest"
STATE = "state.json"
STAGING_SUFFIX = ".partial"


class CheckpointWriteError(OSError):
    """A save failed (a full disk, say); the message names the step, the folder and the cause."""


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def staging_dir(root: Path, step: int) -> Path:
    return root / f".{step_dir(root, step).name}{STAGING_SUFFIX}"


def is_complete(directory: Path) -> bool:
    """A step folder whose `state.json` is whole: everything else in it was written before it."""
    try:
        json.loads((directory / STATE).read_text())
    except (OSError, ValueError):
        return False
    return True


def complete_steps(root: Path) -> list[Path]:
    """The whole step folders under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if p.is_dir() and is_complete(p))


def begin(root: Path, step: int) -> Path | None:
    """The empty staging folder to write step `step` into, or None when that step is already committed
    (a stop right after a resume): a committed step is never rewritten."""
    if is_complete(step_dir(root, step)):
        return None
    staging = staging_dir(root, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    for folder, _, files in os.walk(directory):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))


def commit(root: Path, staging: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write `state.json` into `staging`, make it durable, rename it to `step-NNNNNN`, point `latest` at it,
    then delete incomplete folders and the oldest whole ones so that `keep` remain (the new one among them).
    A failure (a full disk) removes `staging` and raises one `CheckpointWriteError`; the previous
    checkpoint and `latest` stay as they were."""
    final = step_dir(root, step)
    try:
        (staging / STATE).write_text(json.dumps(state, indent=2, sort_keys=True))
        _fsync_tree(staging)
        shutil.rmtree(final, ignore_errors=True)  # only ever an incomplete one: begin() refuses a whole one
        os.rename(staging, final)
        _fsync(root)
        pointer = root / f".{LATEST}.tmp"
        pointer.write_text(final.name)
        _fsync(pointer)
        os.replace(pointer, root / LATEST)
        _fsync(root)
    except OSError as exc:
        error = failure(step, root, exc)
        abandon(staging)
        raise error from None
    prune(root, keep, final)
    return final


def failure(step: int, root: Path, exc: BaseException) -> CheckpointWriteError:
    """The one-line error of a failed save, naming a full disk where it is one: torch.save reports a full
    disk as a RuntimeError about a file position, not ENOSPC. Called before the staging folder is removed."""
    cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    with contextlib.suppress(OSError):
        usage = shutil.disk_usage(root)
        if usage.free < min(16 << 20, usage.total // 100) and not isinstance(exc, OSError):
            cause = f"no space left on the disk ({usage.free >> 10} KiB free of {usage.total >> 10} KiB): {cause}"
    return CheckpointWriteError(f"saving checkpoint step {step} to {step_dir(root, step)} failed: {cause}")


def abandon(staging: Path) -> None:
    """Remove a staging folder whose save failed, so no partial folder stays on the disk."""
    shutil.rmtree(staging, ignore_errors=True)


def clean_partial(root: Path) -> list[Path]:
    """Delete staging and incomplete step folders (a save killed or out of disk); the ones deleted."""
    partial = [*root.glob(f".step-*{STAGING_SUFFIX}"), *(p for p in root.glob("step-*") if not is_complete(p))]
    for folder in partial:
        shutil.rmtree(folder, ignore_errors=True)
    return partial


def prune(root: Path, keep: int, committed: Path) -> None:
    """Delete incomplete folders, then the oldest whole ones beyond `keep`: `committed`, the one `latest`
    names, is never among them (newer-named folders of an earlier run may sit beside it)."""
    clean_partial(root)
    others = [p for p in complete_steps(root) if p.name != committed.name]
    for old in others[: max(0, len(others) - (max(1, keep) - 1))]:
        shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> Path | None:
    """The checkpoint a resume starts from: the one `latest` names when it is whole; otherwise (a torn or
    missing `latest`, or one naming an incomplete folder) the newest whole step folder, with one warning."""
    pointer = root / LATEST
    named = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        named = pointer.read_text().strip()
    if named and named.startswith("step-") and is_complete(root / named):
        return root / named
    whole = complete_steps(root)
    if not whole:
        return None
    why = "is missing" if named is None else f"names {named!r}, which is not a whole checkpoint"
    log.warning("checkpoint: %s %s; resuming from the newest whole one, %s", pointer, why, whole[-1])
    return whole[-1]


def read_state(directory: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((directory / STATE).read_text())
    return state
