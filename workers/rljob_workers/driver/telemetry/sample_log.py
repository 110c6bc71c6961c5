"""Sample logs: the samples a step kept (spec.logging.samples) as samples/step-NNNNNN.jsonl in the run's output,
one JSON object a line, each file written whole by a thread of its own, off the train loop."""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from rljob_workers.driver.controller.report import LoggedSample, StepReport

log = logging.getLogger(__name__)

SAMPLES_DIR = "samples"  # in the run's output folder


def samples_file(output: Path, step: int) -> Path:
    return output / SAMPLES_DIR / f"step-{step:06d}.jsonl"


def sample_lines(step: int, samples: list[LoggedSample]) -> bytes:
    """The file's text: one JSON object per sample, its step first."""
    return "".join(json.dumps({"step": step, **_fields(sample)}) + "\n" for sample in samples).encode()


EPISODE_ONLY = ("messages", "prompt_token_ids", "token_ids", "loss_mask")


def _fields(sample: LoggedSample) -> dict[str, object]:
    """A sample's fields; the conversation and its token sequence only for an episode's."""
    fields = asdict(sample)
    for name in EPISODE_ONLY:
        if fields[name] is None:
            del fields[name]
    return fields


def write_whole(path: Path, data: bytes) -> None:
    """`data` as `path` in one write to a file beside it, then renamed: a reader sees the whole file or none,
    and a resumed run's step replaces the one its first run wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    part.write_bytes(data)
    os.replace(part, path)


class SampleLog:
    """Writes each report's logged samples in the background; `close` waits for every file."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self._writer: ThreadPoolExecutor | None = None

    def write(self, report: StepReport) -> None:
        if not report.logged_samples:
            return
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sample-log")
        path, data = samples_file(self.output, report.step), (report.step, report.logged_samples)
        self._writer.submit(lambda: write_whole(path, sample_lines(*data))).add_done_callback(_log_failure)

    def close(self) -> None:
        """Wait for the files still being written."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None


def _log_failure(written: Future[None]) -> None:
    if written.exception() is not None:  # the run's outcome stands: only its sample log is missing
        log.warning("sample log not written: %s", written.exception())
