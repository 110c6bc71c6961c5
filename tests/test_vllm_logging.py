"""vLLM's log on one machine (engines/vllm_logging.py): every record in the run's logs/vllm.log, an error also on
the terminal as one line naming that file. Run here in a fresh Python process configured the way vLLM configures
each of its processes (logging.config.dictConfig of the file VLLM_LOGGING_CONFIG_PATH names); the learning run
with the vLLM engine (tests/test_vllm.py) checks that none of vLLM's lines reach the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from rljob_api import derive_worker_configs, load_rljob
from rljob_api.workercfg import WorkerConfigs
from rljob_workers.engines.vllm_logging import LOGGING_CONFIG_ENV, vllm_log_env

from conftest import REPO

# What a vLLM process does with the file: vllm/logger.py _configure_vllm_root_logger.
VLLM_PROCESS = """
import json, logging, logging.config, os
logging.config.dictConfig(json.load(open(os.environ["VLLM_LOGGING_CONFIG_PATH"])))
log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
log.info("Loading weights took 0.01 seconds")
log.warning("RotaryEmbedding: Failed to load weights")
try:
    raise RuntimeError("KV cache is full\\nsecond line of the message")
except RuntimeError:
    log.exception("EngineCore failed")
"""


def _configs(engine: str, tmp_path: Path) -> WorkerConfigs:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["rollout"]["engine"] = engine
    path = tmp_path / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return derive_worker_configs(load_rljob(path))


def test_vllm_logs_into_the_run_folder_and_shows_an_error_in_one_line(tmp_path: Path) -> None:
    env = vllm_log_env(_configs("vllm", tmp_path), tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-c", VLLM_PROCESS], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    log_file = tmp_path / "out" / "logs" / "vllm.log"
    assert done.stdout == ""
    assert done.stderr.splitlines() == [f"vLLM ERROR: EngineCore failed (all of vLLM's log: {log_file.resolve()})"]
    logged = log_file.read_text()
    for line in ("INFO Loading weights", "WARNING RotaryEmbedding: Failed to load weights", "ERROR EngineCore failed"):
        assert line in logged, logged
    assert "Traceback" in logged and "KV cache is full" in logged  # the detail stays in the file
    assert json.loads(Path(env[LOGGING_CONFIG_ENV]).read_text())["loggers"]["vllm"]["propagate"] is False


def test_a_job_without_vllm_writes_no_vllm_logging(tmp_path: Path) -> None:
    assert vllm_log_env(_configs("hf", tmp_path), tmp_path / "out") == {}
    assert not (tmp_path / "out").exists()
