"""What `rljob run` says when it ends: the lines it prints and, in a driver pod, its termination message."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from rljob_api.workercfg import TERMINATION_LOG_ENV
from rljob_workers.driver.telemetry.files import EVAL_JSONL, METRICS_JSONL, REWARD_CURVE


@dataclass
class RunEnd:
    """How a run ended, as the summary tells it."""

    rc: int
    output: Path
    message: str = ""  # the view's last word: why it stopped or failed
    stopped_by: str | None = None  # the signal's name, when one stopped it
    checkpoint: str | None = None
    job_file: Path | None = None
    scored: dict[str, int] | None = None  # samples scored by each reward replica
    played: dict[str, int] | None = None  # episodes played by each environment replica (kind python)
    trained: bool = False  # some step finished (so metrics.jsonl has lines)


def write_termination_message(message: str) -> None:
    """The driver pod's termination message, the operator's last word on the run (no-op elsewhere)."""
    if os.environ.get(TERMINATION_LOG_ENV):
        with contextlib.suppress(OSError):
            Path(os.environ[TERMINATION_LOG_ENV]).write_text(message)


def summary_lines(end: RunEnd) -> list[str]:
    """The lines printed at the end; the reward curve is named when steps were trained (see `plots`)."""
    lines = []
    if end.stopped_by is not None:
        lines.append(end.message or f"stopped by {end.stopped_by}")
    elif end.rc:
        lines.append(f"run failed: {end.message}")
    if end.checkpoint:
        lines.append(f"checkpoint:   {end.checkpoint}")
        if end.rc and end.job_file is not None:
            lines.append(f"resume with:  rljob run {end.job_file} --resume --output {end.output}")
    if end.scored:  # by reward replica; none without reward functions
        lines.append("reward scored: " + ", ".join(f"{n} {k}" for n, k in end.scored.items()))
    if end.played:
        lines.append("episodes played: " + ", ".join(f"{n} {k}" for n, k in end.played.items()))
    lines.extend(eval_lines(end.output / EVAL_JSONL))
    if plots(end):
        lines.append(f"metrics:      {end.output / METRICS_JSONL}")
        lines.append(f"reward curve: {end.output / REWARD_CURVE}")
    return lines


def plots(end: RunEnd) -> bool:
    """Whether the run has a reward curve to draw."""
    return end.trained and (end.output / METRICS_JSONL).exists()


def eval_lines(path: Path) -> list[str]:
    """The held-out eval's reward at the first round (step 0) and at the last, and the file of every round."""
    if not path.exists():
        return []
    rounds = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rounds:
        return []
    first, last = rounds[0], rounds[-1]
    passes = "  ".join(f"pass@{k} {v:.3f}" for k, v in last["pass_at_k"].items())
    return [
        f"eval reward:  {first['reward_mean']:.3f} at step {first['step']} -> {last['reward_mean']:.3f} at step "
        f"{last['step']} ({passes})",
        f"eval rounds:  {path}",
    ]
