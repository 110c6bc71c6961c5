"""The user's code beside the job: the job file's folder on the import path of `rljob run` and `rljob validate`,
and of every pool's process, so that a `my_rewards.py` next to `job.yaml` is `my_rewards:fn` with nothing set
by hand (a console script's path holds its own folder, never the job's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def put_job_folder_on_path(job_file: Path) -> Path:
    """The job file's folder first on this process's `sys.path` and on PYTHONPATH, which the local Ray node's
    processes and a rollout runtime of its own inherit; the folder."""
    folder = job_file.resolve().parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *parts])
    return folder
