"""One `rljob run` of the shipped example carrying all a researcher keeps of a run, read back by the tests of
each part (test_signals, test_sample_logs, test_trackers, test_eval, test_export): held-out eval rounds, a KL
term, sample logs, TensorBoard + W&B (offline) + MLflow (a file store), a checkpoint at every step, a model
with a chat template, and /metrics scraped while it runs. One run where there were five (40-90 s each on 2
cores); a pytest process (an xdist worker) that runs any of those modules runs it once (session fixture)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from example_job import free_port
from prometheus_client.parser import text_string_to_metric_families

from rljob_workers.driver.telemetry.eval_log import read_evals
from rljob_workers.driver.telemetry.metrics import read_metrics
from rljob_workers.tasks.arithmetic import held_out_problems, make_problems, read_jsonl, write_jsonl

from conftest import REPO, kill_process_tree

STEPS, PROMPTS, GROUP, LOGGED = 5, 4, 8, 6
MAX_NEW_TOKENS = 5  # the example's
EVAL_EVERY, EVAL_PROMPTS, EVAL_K = 2, 12, 4  # rounds at steps 0, 2, 4 and 5 (the end)
WANDB_PROJECT = "rljob-test"
# Given to the model where it has none: the template's way from the job's model to an export is checked. It
# renders a conversation as the prompts the tiny model learned from, BOS first (a template writes the special
# tokens itself), so that the run earns rewards to learn from: a prompt the model never saw (without BOS, or
# wrapped in role tags) leaves every answer wrong and every group's advantage 0.
TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class ResearcherRun:
    output: str  # stdout and stderr together
    out: Path  # --output: metrics.jsonl, eval.jsonl, samples/, tensorboard/, wandb/, mlruns/
    model: Path  # the job's model folder (with TEMPLATE)
    checkpoints: Path  # step-000001 ... step-00000<STEPS>, all kept
    records: list[dict[str, Any]]  # metrics.jsonl
    evals: list[dict[str, Any]]  # eval.jsonl
    scrape: Scrape  # the last /metrics page read after a step
    vocab: int
    status: dict[str, Any]  # the termination log's final status


def scrape(port: int) -> Scrape | None:
    """The endpoint's samples by (name, labels but job_name); None while it does not answer."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "job_name"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _model_with_template(source: Path, folder: Path) -> Path:
    from transformers import AutoTokenizer

    shutil.copytree(source, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = TEMPLATE
        tokenizer.save_pretrained(folder)
    return folder


def _job(work: Path, model: Path) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    train = write_jsonl(work / "train.jsonl", make_problems(256, seed=10_000))
    held_out = write_jsonl(work / "eval.jsonl", held_out_problems(2 * EVAL_PROMPTS, 7, read_jsonl(train)))
    spec["model"]["path"], spec["data"]["path"] = str(model), str(train)
    spec["data"]["eval"] = {
        "path": str(held_out),
        "everySteps": EVAL_EVERY,
        "prompts": EVAL_PROMPTS,
        "samplesPerPrompt": EVAL_K,
        "sampling": {"temperature": 1.0},
    }
    spec["algorithm"].update(totalSteps=STEPS, promptsPerStep=PROMPTS, groupSize=GROUP, klCoef=0.01)
    spec["checkpoint"] = {"dir": str(work / "checkpoints"), "everySteps": 1, "keep": STEPS}
    spec["logging"] = {
        "samples": LOGGED,
        "trackers": ["tensorboard", "wandb", "mlflow"],
        "wandb": {"mode": "offline", "project": WANDB_PROJECT},
    }
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


@pytest.fixture(scope="session")
def researcher_run(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> ResearcherRun:
    work = tmp_path_factory.mktemp("researcher-run")
    model = _model_with_template(example_model, work / "model")
    out, log, termination, port = work / "out", work / "run.log", work / "termination.json", free_port()
    command = [str(Path(sys.executable).parent / "rljob"), "run", str(_job(work, model)), "--no-display"]
    command += ["--output", str(out), "--metrics-port", str(port)]
    # WANDB_MODE=online: spec.logging.wandb.mode offline must win over it.
    env = {**os.environ, "WANDB_MODE": "online", "RLJOB_TERMINATION_LOG": str(termination)}
    last: Scrape = {}
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    try:
        while process.poll() is None and time.monotonic() < deadline:
            got = scrape(port)
            if got and got.get(("rljob_step", ()), 0) >= 1:
                last = got
            time.sleep(0.2)
    finally:
        kill_process_tree(process.pid)
        process.wait()
    output = log.read_text()
    assert process.returncode == 0, output[-5000:]
    return ResearcherRun(
        output=output,
        out=out,
        model=model,
        checkpoints=work / "checkpoints",
        records=read_metrics(out / "metrics.jsonl"),
        evals=read_evals(out / "eval.jsonl"),
        scrape=last,
        vocab=json.loads((model / "config.json").read_text())["vocab_size"],
        status=json.loads(termination.read_text()),
    )
