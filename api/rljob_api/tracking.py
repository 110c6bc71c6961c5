"""spec.logging: what a run keeps beyond metrics.jsonl and Prometheus (experiment trackers, sample logs)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import FieldRuleError, Model, cel, cel_rules

Tracker = Literal["tensorboard", "wandb", "mlflow"]


class WandbSpec(Model):
    """Where a run's W&B record goes (spec.logging.trackers names wandb)."""

    project: str = Field("rljob", description="W&B project of the run.", min_length=1, max_length=128)
    entity: str | None = Field(
        None, description="W&B entity (user or team) of the project; unset: the API key's default.", max_length=128
    )
    mode: Literal["online", "offline"] = Field(
        "online",
        description=(
            "online: sent to the W&B server as the run goes (needs WANDB_API_KEY); offline: kept in <output>/wandb "
            "only, for `wandb sync` later."
        ),
    )
    name: str | None = Field(None, description="W&B run name; unset: the job's name.", min_length=1, max_length=128)


class MlflowSpec(Model):
    """Where a run's MLflow record goes (spec.logging.trackers names mlflow)."""

    tracking_uri: str | None = Field(
        None,
        description=(
            "MLflow tracking URI: file:///path (a file store), http(s)://host (a tracking server) or databricks; "
            "unset: file://<output>/mlruns."
        ),
        min_length=1,
        max_length=1024,
    )
    experiment: str | None = Field(
        None, description="MLflow experiment (made when missing); unset: the job's name.", min_length=1, max_length=256
    )


_NAMED_RULES = [
    cel(
        f"!has(self.{name}) || (has(self.trackers) && self.trackers.exists(t, t == '{name}'))",
        f"{name} settings need {name} in trackers",
    )
    for name in ("wandb", "mlflow")
]


class LoggingSpec(Model):
    """Experiment trackers and sample logs of a run: each step's scalars, the eval results and the config go to
    every tracker named; `samples` of each step's samples go to samples/step-N.jsonl in the run's output."""

    trackers: list[Tracker] = Field(
        default_factory=list,
        description=(
            "Experiment trackers each step's metrics.jsonl scalars and the job's settings go to: tensorboard "
            "(event files in <output>/tensorboard), wandb and mlflow (the rljob[wandb] and rljob[mlflow] extras; "
            "see their settings below)."
        ),
        max_length=3,
    )
    samples: int = Field(
        0,
        description="Samples of each step written to samples/step-N.jsonl in the run's output (0: none).",
        ge=0,
        le=4096,
    )
    wandb: WandbSpec | None = Field(None, description="W&B project, entity, mode and run name (tracker wandb).")
    mlflow: MlflowSpec | None = Field(None, description="MLflow tracking URI and experiment (tracker mlflow).")
    secret_name: str | None = Field(
        None,
        description=(
            "A Secret in the job's namespace whose keys become the driver's environment variables on a cluster: "
            "the trackers' credentials (WANDB_API_KEY; MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD), taken by the driver pod with envFrom. `rljob run` on one machine reads them "
            "from its own environment."
        ),
        min_length=1,
        max_length=253,
    )

    @model_validator(mode="after")
    def _consistent(self) -> LoggingSpec:
        for index, tracker in enumerate(self.trackers):
            if tracker in self.trackers[:index]:
                raise FieldRuleError(f"trackers[{index}]", f"{tracker} is named twice")
        for name in ("wandb", "mlflow"):
            if getattr(self, name) is not None and name not in self.trackers:
                raise FieldRuleError(name, f"is set but {name} is not in spec.logging.trackers")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel(
                "!has(self.trackers) || self.trackers.all(t, self.trackers.filter(u, u == t).size() == 1)",
                "trackers: each tracker at most once",
            ),
            *_NAMED_RULES,
        )
    }
