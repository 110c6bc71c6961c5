"""The run folder's bookkeeping: one run owns a folder at a time, holds the job's token, and a resumed run's
metrics continue from its checkpoint's step."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import IO, Any

from rljob_api.workercfg import WorkerConfigs
from rljob_workers.common.auth import JobToken, TokenError
from rljob_workers.driver.controller.data import PromptSource, chat_prompts, load_prompts
from rljob_workers.driver.errors import SetupError
from rljob_workers.driver.telemetry.files import EVAL_JSONL, METRICS_JSONL
from rljob_workers.trainer import checkpoint

LOCK_FILE = ".rljob.lock"
log = logging.getLogger("rljob")


class FolderLock:
    """An exclusive lock on a folder for as long as this process holds it.

    flock is released by the kernel when the process ends, however it ends, so a killed run
    never leaves a stale lock behind; the file names the holder for the next one to report.
    """

    def __init__(self, folder: Path, field: str) -> None:
        self.folder, self.field = folder, field
        self._handle: IO[str] | None = None

    def acquire(self) -> FolderLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = (self.folder / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise SetupError(
                f"{self.field}: {self.folder} is in use by {holder}; stop that run or choose another folder"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on host {socket.gethostname()}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing drops the flock
            self._handle = None


def lock_run_folders(output: Path, checkpoints: Path) -> list[FolderLock]:
    """Lock the run's output folder and its checkpoint folder (once if one holds the other)."""
    locks = [FolderLock(output, "--output").acquire()]
    try:
        if not checkpoints.resolve().is_relative_to(output.resolve()):
            locks.append(FolderLock(checkpoints, "spec.checkpoint.dir").acquire())
    except SetupError:
        locks[0].release()
        raise
    return locks


def job_token(output: Path, *, cluster: bool) -> JobToken:
    """The run's token: on a cluster the one the operator mounted (RLJOB_TOKEN_FILE), else a new one in
    the output folder (where `rljob status --token-file` finds it)."""
    try:
        return JobToken.from_env() if cluster else JobToken.new(output)
    except TokenError as exc:
        raise SetupError(str(exc)) from None


def cut_metrics_after(jsonl: Path, step: int) -> int:
    """Drop the metrics lines of steps after `step` (trained after the checkpoint a run resumes
    from, and about to be trained again); returns how many were dropped."""
    if not jsonl.exists():
        return 0
    kept, dropped = [], 0
    for line in jsonl.read_text().splitlines():
        if line.strip() and json.loads(line).get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = jsonl.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, jsonl)
    return dropped


def refuse_start_over(root: Path, resume: bool) -> None:
    """Without --resume, a folder that holds checkpoints (whole step folders, or a `latest`) is refused."""
    if resume or not root.is_dir():
        return
    if (root / checkpoint.LATEST).exists() or checkpoint.complete_steps(root):
        raise SetupError(
            f"spec.checkpoint.dir: {root} already holds checkpoints; pass --resume to continue "
            "from the newest, or remove the directory to start over"
        )


def resume_from(root: Path, resume: bool) -> Path | None:
    """The checkpoint a run starts from: the newest whole one under `root` with --resume (saves that did not
    finish are removed), none without (refusing to start over a folder that holds checkpoints)."""
    refuse_start_over(root, resume)
    if not resume or not root.is_dir():
        if resume:
            log.info("no checkpoint under %s; starting from step 0", root)
        return None
    found = checkpoint.latest(root)
    for partial in checkpoint.clean_partial(root):
        log.warning("checkpoint: removed %s, a save that did not finish", partial)
    if found is None:
        torn = (root / checkpoint.LATEST).exists()
        (log.warning if torn else log.info)(
            "no %scheckpoint under %s; starting from step 0", "whole " if torn else "", root
        )
    return found


def dataset_cache(output: Path) -> Path:
    """Where `datasets` keeps the Arrow copy of a data file it converts (JSON, parquet, CSV): in the run's own
    output (on a cluster, the run volume or the driver pod's folder), never a shared home cache."""
    return output / ".cache" / "datasets"


def run_prompts(
    configs: WorkerConfigs, output: Path, state: dict[str, Any], tools: tuple[dict[str, Any], ...] = ()
) -> PromptSource:
    """The data's prompts, positioned where a checkpoint's `state` left them, rendered offering `tools`."""
    data = configs.controller.data
    chat = chat_prompts(
        configs.controller.model_path, data.chat_template, data.messages_field, data.system_prompt, tools
    )
    prompts = load_prompts(
        *(data.path, data.prompt_field, data.fields, configs.controller.algorithm.seed, data.shuffle),
        messages_field=data.messages_field,
        chat=chat,
        split=data.split,
        cache_dir=dataset_cache(output),
    )
    if state:
        prompts.restore(state["data"])
    return prompts


def starting_point(
    configs: WorkerConfigs, output: Path, resume: bool, tools: tuple[dict[str, Any], ...] = ()
) -> tuple[Path | None, dict[str, Any], PromptSource]:
    """Where a run starts: the checkpoint (None: from scratch), its saved state, and the prompts
    positioned where it left them (rendered offering an environment's `tools`). The metrics lines of steps
    after the checkpoint (every step, with none) go: those steps are trained again."""
    resume_dir = resume_from(Path(configs.trainer.checkpoint.dir), resume)
    state = checkpoint.read_state(resume_dir) if resume_dir else {}
    if resume_dir:
        log.info(
            "resuming from %s: step %d, policy version %d",
            *(resume_dir, int(state.get("step", 0)), int(state.get("policy_version", 0))),
        )
    prompts = run_prompts(configs, output, state, tools)
    cut_metrics_after(output / METRICS_JSONL, int(state.get("step", 0)))
    cut_metrics_after(output / EVAL_JSONL, int(state.get("step", 0)))  # a step's round comes before its checkpoint
    return resume_dir, state, prompts
