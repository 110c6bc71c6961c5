"""What every tracker takes: the run it records, its settings as one nested dict, and each step's scalars.

Pure functions: the trackers' adapters only hand these to their libraries."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rljob_api import RLJob, resolve_algorithm
from rljob_api.tracking import LoggingSpec


class TrackerError(RuntimeError):
    """A tracker that cannot start; the message names spec.logging.trackers[i] and says why."""


@dataclass(frozen=True)
class RunInfo:
    """The run a tracker records: its name, its output folder, its settings and spec.logging."""

    name: str
    output: Path
    config: dict[str, Any]  # nested, camelCase as in the RLJob (see `run_config`)
    logging: LoggingSpec


@dataclass(frozen=True)
class SampleTable:
    """A step's logged samples (spec.logging.samples) as a table: one row per sample, a column per field and
    one per reward function ('score/<name>')."""

    columns: list[str]
    rows: list[list[Any]]


class Tracker(Protocol):
    """One tracker's adapter: made with a RunInfo (it logs the settings then), fed each step's scalars and
    logged samples, closed once."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def log_samples(self, step: int, table: SampleTable) -> None: ...
    def close(self, exit_code: int) -> None: ...


SAMPLE_FIELDS = ("prompt_id", "prompt", "completion", "reward", "advantage", "policy_version", "truncated")


def sample_table(samples: list[Mapping[str, Any]]) -> SampleTable:
    """The table of a step's samples (each as its sample log's line has it: a `scores` dict per function)."""
    functions = sorted({name for sample in samples for name in sample["scores"]})
    columns = [*SAMPLE_FIELDS, *(f"score/{name}" for name in functions)]
    rows = [
        [sample[field] for field in SAMPLE_FIELDS] + [sample["scores"].get(name) for name in functions]
        for sample in samples
    ]
    return SampleTable(columns, rows)


def run_config(job: RLJob) -> dict[str, Any]:
    """The job's spec as the trackers record it: as written, with the algorithm as it runs (every
    preset-decided setting resolved) rather than as given."""
    spec = job.spec
    config = spec.to_wire()
    config["algorithm"] = resolve_algorithm(spec.algorithm, spec.rollout.sampling.max_new_tokens).to_wire()
    return config


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one metrics.jsonl line, nested ones as 'outer/inner' ('counts/generated'); the step
    itself (the x axis), text, lists, flags and nulls left out."""
    return {name: value for name, value in _numbers(record, "") if name != "step"}


def _numbers(record: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, float]]:
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _numbers(value, f"{name}/")
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            yield name, float(value)


def flat_params(config: Mapping[str, Any] | list[Any], prefix: str = "") -> dict[str, str]:
    """A nested config as 'algorithm.lr' -> '1e-05' (list items by index: 'reward.functions.0.name'), for
    trackers whose parameters are flat strings."""
    flat: dict[str, str] = {}
    items = enumerate(config) if isinstance(config, list) else config.items()
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping | list) and value:
            flat.update(flat_params(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def check_writable(folder: Path, field: str, name: str) -> None:
    """`folder` exists or can be made, and a file can be written in it (root too: os.access would say yes)."""
    if folder.exists() and not folder.is_dir():
        raise TrackerError(f"{field}: {name} cannot write to {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise TrackerError(f"{field}: {name} cannot write to {folder}: {exc.strerror or exc}") from None
