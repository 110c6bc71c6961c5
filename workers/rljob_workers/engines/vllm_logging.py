"""Where vLLM's own log goes on one machine: into the run's log file, not the user's terminal.

vLLM logs at INFO to stdout from every process it starts (engine core, workers), and Ray forwards each line
to the driver's terminal, over the live table and after the summary; a weight reload adds two warnings
"RotaryEmbedding / ParallelLMHead: Failed to load weights" that read like a defect though they are not (those
layers hold no checkpoint weights: a computed cache, the tied embedding). vLLM reads a logging dictConfig from
VLLM_LOGGING_CONFIG_PATH in each of its processes: this one sends everything to `<output>/logs/vllm.log` and
only an error to stderr, as one line naming the file.

Imported by the driver (without vllm) and by vLLM's processes (the `OneLine` formatter), so it imports
neither vllm nor torch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from rljob_api.workercfg import WorkerConfigs

LOGGING_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"
LOG_FOLDER = "logs"
LOG_FILE = "vllm.log"
CONFIG_FILE = "vllm-logging.json"


class OneLine(logging.Formatter):
    """A record as one line, its traceback left to the log file: "vLLM ERROR: <first line> (<log file>)"."""

    def __init__(self, log_file: str = LOG_FILE) -> None:
        super().__init__()
        self.log_file = log_file

    def format(self, record: logging.LogRecord) -> str:
        lines = record.getMessage().strip().splitlines() or [""]
        return f"vLLM {record.levelname}: {lines[0]} (all of vLLM's log: {self.log_file})"


def logging_config(log_file: Path) -> dict[str, Any]:
    """vLLM's logging: every record at INFO and above into `log_file`, errors also to stderr in one line."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "file": {"format": "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"},
            "terminal": {"()": f"{__name__}.OneLine", "log_file": str(log_file)},
        },
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(log_file), "formatter": "file"},
            "terminal": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "terminal",
                "level": "ERROR",
            },
        },
        "loggers": {"vllm": {"handlers": ["file", "terminal"], "level": "INFO", "propagate": False}},
    }


def uses_vllm(configs: WorkerConfigs) -> bool:
    """Whether any of the job's processes runs vLLM: the rollout engine, or a genrm judge's."""
    judges = (function.genrm.engine for function in configs.reward.functions if function.genrm is not None)
    return configs.rollout.engine == "vllm" or "vllm" in judges


def vllm_log_env(configs: WorkerConfigs, output: Path) -> dict[str, str]:
    """The environment that sends vLLM's log of a local run writing to `output` into its log file (written
    here); nothing for a job that runs no vLLM."""
    if not uses_vllm(configs):
        return {}
    folder = output / LOG_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / CONFIG_FILE
    config.write_text(json.dumps(logging_config((folder / LOG_FILE).resolve()), indent=2) + "\n")
    return {LOGGING_CONFIG_ENV: str(config.resolve())}
