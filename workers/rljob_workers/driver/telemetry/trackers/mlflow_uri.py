"""MLflow tracking URIs, told apart without importing mlflow (seconds): which store a URI names, the
folder of a file store, and whether MLflow takes the URI at all."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from urllib.parse import urlparse

from rljob_api.tracking import MlflowSpec

from .base import RunInfo, TrackerError, check_writable

FOLDER = "mlruns"  # the default file store, in the run's output
# Stores that keep runs in a database, through SQLAlchemy (`pip install mlflow` brings it), and remote ones.
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
REMOTE = ("http", "https", "databricks", "databricks-uc", "uc")


def tracking_uri(run: RunInfo) -> str:
    """The URI the run is recorded at: spec.logging.mlflow.trackingUri, else a file store in its output."""
    return (run.logging.mlflow or MlflowSpec()).tracking_uri or (run.output / FOLDER).as_uri()


def is_file_store(uri: str) -> bool:
    return urlparse(uri).scheme in ("", "file")


def store_folder(uri: str) -> Path:
    """The folder of a file store URI (file:///path, or a plain path)."""
    parsed = urlparse(uri)
    return Path(parsed.path if parsed.scheme == "file" else uri)


def check_tracking_uri(uri: str, field: str) -> None:
    """A tracking URI MLflow takes, and a file store's folder writable. The server behind a remote URI is
    reached only when the tracker starts."""
    parsed = urlparse(uri)
    scheme = parsed.scheme.partition("+")[0]  # postgresql+psycopg2://...
    where = f"{field}: mlflow: spec.logging.mlflow.trackingUri {uri!r}"
    if scheme == "file" and parsed.netloc:
        raise TrackerError(f"{where} names host {parsed.netloc!r}; a file store is file:///absolute/path")
    if scheme in ("", "file"):
        check_writable(store_folder(uri), field, "mlflow")
    elif scheme in DATABASES:
        if importlib.util.find_spec("sqlalchemy") is None or importlib.util.find_spec("alembic") is None:
            raise TrackerError(f"{where} is a database store, which needs SQLAlchemy (pip install mlflow)")
    elif scheme not in REMOTE or (scheme.startswith("http") and not parsed.netloc):
        kinds = ", ".join(["file", *REMOTE[:3], *DATABASES])
        raise TrackerError(f"{where} is not a tracking URI MLflow takes ({kinds})")
