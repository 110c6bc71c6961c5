"""Experiment trackers (spec.logging.trackers): thin adapters over TensorBoard, W&B and MLflow, each given
the job's settings when it starts, each step's metrics.jsonl line, and the run's exit code at the end.

`registry` checks and starts the ones a job names (each library imported only then); `base` holds what
they share: the run they record and the pure conversions of the config and the step's numbers."""

from .base import TrackerError
from .registry import Trackers, check_installed, check_startable, open_trackers

__all__ = ["TrackerError", "Trackers", "check_installed", "check_startable", "open_trackers"]
