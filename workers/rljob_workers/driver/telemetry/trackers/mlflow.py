"""MLflow: one MLflow run per `rljob run`, in experiment spec.logging.mlflow.experiment (the job's name by
default) at spec.logging.mlflow.trackingUri (a file store in <output>/mlruns by default).

Through MlflowClient with the run's id, not the fluent API: its active run is per thread, and the run
is started in a set-up thread and logged to from the controller's."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from mlflow.entities import Metric, Param, RunStatus
from mlflow.tracking import MlflowClient

from rljob_api.tracking import MlflowSpec

from .base import RunInfo, SampleTable, flat_params
from .mlflow_uri import is_file_store, tracking_uri

PARAM_CHARS = 6000  # MLflow's longest parameter value


def samples_artifact(step: int) -> str:
    return f"samples/step-{step:06d}.json"


class Mlflow:
    def __init__(self, run: RunInfo) -> None:
        uri = tracking_uri(run)
        if is_file_store(uri):
            # MLflow 3 keeps its file store in maintenance mode behind this opt-in. It is asked for here
            # because the run's output may be a shared volume on a cluster, where SQLite's locks are unsafe.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        name = (run.logging.mlflow or MlflowSpec()).experiment or run.name
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=run.name, tags={"rljob.job": run.name}).info.run_id
        params = [Param(key, value[:PARAM_CHARS]) for key, value in flat_params(run.config).items()]
        self.client.log_batch(self.run_id, params=params)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, value in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_samples(self, step: int, table: SampleTable) -> None:
        # The table as MlflowClient.log_table writes it (pandas' "split" orient), without needing pandas,
        # which mlflow-skinny leaves out: one artifact per step.
        data = {"columns": table.columns, "data": table.rows}
        self.client.log_dict(self.run_id, data, samples_artifact(step))

    def close(self, exit_code: int) -> None:
        status = RunStatus.FINISHED if exit_code == 0 else RunStatus.KILLED if exit_code > 128 else RunStatus.FAILED
        self.client.set_terminated(self.run_id, RunStatus.to_string(status))
