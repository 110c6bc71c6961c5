"""Weights & Biases: one W&B run per `rljob run` (spec.logging.wandb: project, entity, mode, name). Offline,
the run stays in <output>/wandb for `wandb sync`; online, it needs WANDB_API_KEY."""

from __future__ import annotations

from collections.abc import Mapping

import wandb

from rljob_api.tracking import WandbSpec

from .base import RunInfo, SampleTable

SAMPLES_KEY = "samples"  # the table's key in the run: one table per step that logged samples


class Wandb:
    def __init__(self, run: RunInfo) -> None:
        settings = run.logging.wandb or WandbSpec()
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=settings.name or run.name,
            mode=settings.mode,
            dir=str(run.output),  # wandb adds its own wandb/ folder under it
            config=run.config,
            # The run's display owns the terminal: wandb neither wraps stdout nor prints its banner.
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def log_samples(self, step: int, table: SampleTable) -> None:
        # the same step as its scalars: W&B adds the table to that step's row
        columns: list[str | int] = list(table.columns)
        self.run.log({SAMPLES_KEY: wandb.Table(columns=columns, data=table.rows)}, step=step)

    def close(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)
