"""spec.logging: what a run keeps beyond metrics.jsonl and Prometheus (experiment trackers, sample logs)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Model

Tracker = Literal["tensorboard", "wandb", "mlflow"]


class LoggingSpec(Model):
    """Experiment trackers and sample logs of a run: each step's scalars, the eval results and the config go to
    every tracker named; `samples` of each step's samples go to samples/step-N.jsonl in the run's output."""

    trackers: list[Tracker] = Field(
        default_factory=list,
        description=(
            "Experiment trackers each step's scalars go to: tensorboard (event files in the run's output), wandb "
            "and mlflow (optional extras)."
        ),
        max_length=3,
    )
    samples: int = Field(
        0,
        description="Samples of each step written to samples/step-N.jsonl in the run's output (0: none).",
        ge=0,
        le=4096,
    )
