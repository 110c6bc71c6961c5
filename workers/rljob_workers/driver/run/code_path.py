"""The user's code beside the job: the job file's folder, and spec.code.paths after it, on the import path of
`rljob run` and `rljob validate`, and of every pool's process, so that a `my_rewards.py` next to `job.yaml` is
`my_rewards:fn` with nothing set by hand (a console script's path holds its own folder, never the job's). A
cluster's sources (spec.code.configMap, .volume) are the operator's to mount: on one machine the local folders
stand in for them, and the run says so."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from rljob_api.code import CodeSpec


def put_code_on_path(job_file: Path, code: CodeSpec | None = None) -> list[Path]:
    """The job file's folder and `code.paths` (relative to it), in that order, first on this process's `sys.path`
    and on PYTHONPATH, which the local Ray node's processes and a rollout runtime of its own inherit; the folders.
    A path that is no folder is an error naming it."""
    base = job_file.resolve().parent
    folders = [base]
    for index, relative in enumerate(code.paths if code is not None else []):
        folder = (base / relative).resolve()
        if not folder.is_dir():
            raise NotADirectoryError(f"spec.code.paths[{index}]: {folder} is not a folder")
        folders.append(folder)
    for folder in reversed(folders):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [*(str(f) for f in folders), *(p for p in parts if Path(p) not in folders)]
    )
    return folders


def code_message(folders: list[Path], code: CodeSpec | None) -> str:
    """The run's first line about the code it imports."""
    shown = ", ".join(str(f) for f in folders)
    line = f"code: {shown} {'is' if len(folders) == 1 else 'are'} on the import path of the driver and every pool"
    if code is not None and code.on_cluster:
        names = " and ".join(n for n, v in (("configMap", code.config_map), ("volume", code.volume)) if v is not None)
        line += f" (spec.code.{names} is a cluster's; here the job's folder and spec.code.paths stand in)"
    return line
