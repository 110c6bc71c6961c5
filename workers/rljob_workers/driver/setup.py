"""Set-up checks that run before any pool starts: a job that cannot start fails here, in seconds,
with one line naming the field."""

from __future__ import annotations

from pathlib import Path

from rljob_api import RLJob, derive_worker_configs
from rljob_api.workercfg import WorkerConfigs


class SetupError(RuntimeError):
    """Something on this machine keeps the job from starting; the message says what to do."""


def prepare(job: RLJob, steps: int | None) -> WorkerConfigs:
    """Worker configs with local paths made absolute and checked."""
    if steps is not None:
        job.spec.algorithm.total_steps = steps
    for field, value in (("spec.model.path", job.spec.model.path), ("spec.data.path", job.spec.data.path)):
        if not Path(value).exists():
            hint = " (make the example's with `make model`)" if ".cache/" in value else ""
            raise SetupError(f"{field}: {value} does not exist{hint}")
    job.spec.model.path = str(Path(job.spec.model.path).resolve())
    job.spec.data.path = str(Path(job.spec.data.path).resolve())
    job.spec.checkpoint.dir = str(Path(job.spec.checkpoint.dir).resolve())
    return derive_worker_configs(job)
