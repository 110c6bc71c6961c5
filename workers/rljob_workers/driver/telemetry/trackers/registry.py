"""The trackers a job names: checked before Ray starts, started together, fed and closed together.

Each tracker's module is imported only when a job names it: wandb and mlflow are optional extras, and
mlflow's import alone takes seconds."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rljob_api import RLJob
from rljob_api.tracking import LoggingSpec
from rljob_api.tracking import Tracker as TrackerName

from .base import RunInfo, Tracker, TrackerError, check_writable, run_config, sample_table, scalars
from .mlflow_uri import check_tracking_uri, tracking_uri

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    library: str  # the module it needs, importable
    adapter: str  # "module:Class" of its adapter in this package
    install: str  # what installs the library


REGISTRY: dict[TrackerName, Entry] = {
    "tensorboard": Entry("tensorboard", "tensorboard:TensorBoard", "pip install tensorboard"),
    "wandb": Entry("wandb", "wandb:Wandb", "pip install 'rljob[wandb]'"),
    "mlflow": Entry("mlflow", "mlflow:Mlflow", "pip install 'rljob[mlflow]'"),
}


def _named(spec: LoggingSpec) -> Iterator[tuple[str, TrackerName]]:
    for index, name in enumerate(spec.trackers):
        yield f"spec.logging.trackers[{index}]", name


def check_installed(spec: LoggingSpec) -> None:
    """Every tracker named is installed (looked for, not imported: well under a second)."""
    for field, name in _named(spec):
        if importlib.util.find_spec(REGISTRY[name].library) is None:
            raise TrackerError(f"{field}: {name} is not installed ({REGISTRY[name].install})")


def run_info(job: RLJob, output: Path, config: dict[str, Any] | None = None) -> RunInfo:
    return RunInfo(job.metadata.name, output, config or {}, job.spec.logging)


def check_startable(job: RLJob, output: Path) -> None:
    """What would keep a tracker from starting, told before Ray starts without importing one: its library
    missing, its folder not writable, a tracking URI MLflow does not take."""
    check_installed(job.spec.logging)
    for field, name in _named(job.spec.logging):
        if name == "mlflow":
            check_tracking_uri(tracking_uri(run_info(job, output)), field)
        else:
            check_writable(output / name, field, name)


class Trackers:
    """The run's trackers as one: each step's metrics.jsonl line goes to all of them."""

    def __init__(self, started: Mapping[str, Tracker] | None = None) -> None:
        self.started = dict(started or {})
        self._failed: set[str] = set()

    def log(self, step: int, record: Mapping[str, Any]) -> None:
        """The numbers of a metrics.jsonl line, at `step`."""
        values = scalars(record)
        self._each(step, lambda tracker: tracker.log(step, values))

    def log_samples(self, step: int, samples: Sequence[Any]) -> None:
        """A step's logged samples (LoggedSample dataclasses, as its sample log writes them), as each tracker's
        table; the table is built only for a tracker to take."""
        if samples and self.started:
            table = sample_table([asdict(sample) for sample in samples])
            self._each(step, lambda tracker: tracker.log_samples(step, table))

    def _each(self, step: int, call: Callable[[Tracker], None]) -> None:
        """`call` on every tracker still in. One that fails is told once and left out: the run, its
        metrics.jsonl and its sample logs go on without it."""
        for name, tracker in self.started.items():
            if name in self._failed:
                continue
            try:
                call(tracker)
            except Exception as exc:
                self._failed.add(name)
                log.warning("tracker %s failed at step %d and is left out: %s: %s", name, step, type(exc).__name__, exc)

    def close(self, exit_code: int) -> None:
        """End every tracker's run, each whatever the others do (`exit_code`: the run's)."""
        for name, tracker in self.started.items():
            try:
                tracker.close(exit_code)
            except Exception as exc:
                log.warning("tracker %s did not close cleanly: %s: %s", name, type(exc).__name__, exc)
        self.started.clear()


def _adapter(name: TrackerName) -> Callable[[RunInfo], Tracker]:
    module, _, cls = REGISTRY[name].adapter.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), cls)  # type: ignore[no-any-return]


def open_trackers(job: RLJob, output: Path) -> Trackers:
    """Every tracker the job names, started with the job's settings. One that fails to start is a
    TrackerError naming it; those started before it are closed again."""
    run = run_info(job, output, run_config(job))
    started = Trackers()
    for field, name in _named(job.spec.logging):
        try:
            started.started[name] = _adapter(name)(run)
        except Exception as exc:
            started.close(1)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise TrackerError(f"{field}: {name} did not start: {type(exc).__name__}: {first}") from None
    return started
