"""The Python runtime `rljob run` starts the rollout replicas with: this interpreter, or an engine's own.

vLLM pins its own torch and transformers, so it often has a runtime of its own (runtimes/vllm.sh builds
one, a Python virtual environment; on a cluster, its own image). The rollout actors then run that
runtime's Python (Ray's runtime env `py_executable`), with rljob's own source folders on its path; the
trainer and the reward pool stay in this one. The pools meet only over gRPC and the weight group, so
nothing else must match but Ray and Python themselves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The packages a rollout replica imports from rljob, by the folder each lives in (api/, workers/, proto/gen/).
PACKAGES = ("rljob_api", "rljob_workers", "rljob")


class RolloutRuntimeError(RuntimeError):
    """The rollout interpreter cannot run rljob's replicas; the message says why and what to do."""


def source_folders() -> list[str]:
    """The folders that hold rljob's packages in this checkout: what another interpreter puts on its path."""
    folders = []
    for name in PACKAGES:
        module = sys.modules.get(name) or __import__(name)
        folder = Path(next(iter(module.__path__))).resolve().parent
        if folder.name in ("site-packages", "dist-packages"):
            raise RolloutRuntimeError(
                f"rljob is installed into {folder}, not run from its source folders: another interpreter cannot "
                "borrow it from there; install rljob into the rollout runtime too (pip install --no-deps)"
            )
        folders.append(str(folder))
    return list(dict.fromkeys(folders))


def runtime_env(python: str | None) -> dict[str, Any] | None:
    """Ray runtime env fields of a rollout actor run by `python` (None, or this interpreter: nothing)."""
    if python is None or _same(python, sys.executable):
        return None
    path = os.pathsep.join([*source_folders(), *filter(None, [os.environ.get("PYTHONPATH", "")])])
    return {"py_executable": python, "env_vars": {"PYTHONPATH": path}}


def has_module(python: str | None, module: str) -> bool:
    """Whether `module` can be imported by `python` (None: this interpreter), without importing it."""
    if python is None or _same(python, sys.executable):
        import importlib.util

        return importlib.util.find_spec(module) is not None
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        done = subprocess.run([python, "-c", check], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RolloutRuntimeError(f"--rollout-python {python} does not run: {exc}") from None
    return done.returncode == 0


def _same(a: str, b: str) -> bool:
    """Two interpreters of one environment: the same bin folder (a virtual environment's python is a link to
    its base interpreter, so the links' targets would make every environment of that Python the same)."""
    return Path(os.path.abspath(a)).parent == Path(os.path.abspath(b)).parent
