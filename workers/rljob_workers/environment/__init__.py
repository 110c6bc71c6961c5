"""The environment pool: a user's environment class behind an EnvironmentService (multi-turn episodes).

`serve_environment("module:Class")` serves a class in one line, for a job's `kind: remote` environment."""

from rljob_workers.common.server_lock import ServerLock
from rljob_workers.environment.episode import InvalidAction
from rljob_workers.environment.server import serve_environment

__all__ = ["InvalidAction", "ServerLock", "serve_environment"]
