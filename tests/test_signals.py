"""Every training signal of every step, in metrics.jsonl and on the run's Prometheus endpoint: a short `rljob run`
of the shipped example (with a KL term, so that there is a reference to measure against), its /metrics scraped
while it runs, then its metrics.jsonl read back. About 40 s on 2 cores, the tiny model aside."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from example_job import example_job, free_port, start_run
from prometheus_client.parser import text_string_to_metric_families

from rljob_workers.driver.metrics import read_metrics

from conftest import kill_process_tree

pytestmark = pytest.mark.ray

STEPS, PROMPTS, GROUP, MAX_NEW_TOKENS = 4, 4, 8, 5
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


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


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, Any]:
    """The run's exit code, log, metrics.jsonl records and its last /metrics scrape after a step."""
    work = tmp_path_factory.mktemp("signals")
    job = example_job(
        work,
        example_model,
        {"totalSteps": STEPS, "promptsPerStep": PROMPTS, "groupSize": GROUP, "klCoef": 0.01},
        logging={"samples": 3},
    )
    port, log = free_port(), work / "run.log"
    process = start_run(job, work / "out", log, "--metrics-port", str(port))
    last: Scrape = {}
    deadline = time.monotonic() + 300
    try:
        while process.poll() is None and time.monotonic() < deadline:
            got = scrape(port)
            if got and got.get(("rljob_step", ()), 0) >= 1:
                last = got
            time.sleep(0.2)
    finally:
        if process.poll() is None:
            kill_process_tree(process.pid)
        process.wait()
    vocab = json.loads((example_model / "config.json").read_text())["vocab_size"]
    records = read_metrics(work / "out" / "metrics.jsonl")
    return {"rc": process.returncode, "log": log.read_text(), "records": records, "scrape": last, "vocab": vocab}


def test_every_step_has_every_training_signal(run: dict[str, Any]) -> None:
    assert run["rc"] == 0, run["log"][-3000:]
    records = run["records"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        train = r["train_metrics"]
        assert all(math.isfinite(train[k]) for k in ("policy_loss", "kl_ref", "clip_fraction", "grad_norm")), train
        # The sampler's entropy: above 0 (it samples, not argmaxes) and below the uniform distribution's.
        assert 0.0 < train["entropy"] < math.log(run["vocab"]), train
        assert 0.0 <= train["clip_fraction"] <= 1.0
        assert train["grad_norm"] > 0.0  # before clipping, so not capped at maxGradNorm
        assert train["kl_ref"] >= 0.0  # k3 is never negative
        assert 1.0 <= r["response_length_mean"] <= r["response_length_max"] <= MAX_NEW_TOKENS
        assert 0.0 <= r["truncated_fraction"] <= 1.0
        if r["truncated_fraction"] > 0:  # a cut sample is maxNewTokens long
            assert r["response_length_max"] == MAX_NEW_TOKENS
        # One reward function of weight 1: its mean is the reward's.
        assert list(r["reward_by_function"]) == ["exact-match"]
        assert r["reward_by_function"]["exact-match"] == pytest.approx(r["reward_mean"])
        # Every sample is trained (no dynamic sampling): the trained tokens are the samples' lengths.
        trained_tokens = r["samples"] * r["response_length_mean"]
        assert r["samples"] == PROMPTS * GROUP
        assert r["tokens_per_second"] * r["step_seconds"] == pytest.approx(trained_tokens)
        assert "logged_samples" not in r  # they go to samples/, not metrics.jsonl
    # The first step trains the reference's own weights: no KL yet; the policy has moved away by the last.
    assert records[0]["train_metrics"]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert records[-1]["train_metrics"]["kl_ref"] > 1e-7


def test_prometheus_exports_every_signal_of_the_step(run: dict[str, Any]) -> None:
    got = run["scrape"]
    assert got, f"/metrics never answered after a step: {run['log'][-3000:]}"
    step = int(got[("rljob_step", ())])
    r = run["records"][step - 1]
    train = r["train_metrics"]
    expected = {
        ("rljob_policy_loss", ()): train["policy_loss"],
        ("rljob_kl", (("to", "reference"),)): train["kl_ref"],
        ("rljob_kl", (("to", "behaviour"),)): train["approx_kl"],
        ("rljob_clip_fraction", ()): train["clip_fraction"],
        ("rljob_grad_norm", ()): train["grad_norm"],
        ("rljob_entropy", ()): train["entropy"],
        ("rljob_response_length_tokens", (("stat", "mean"),)): r["response_length_mean"],
        ("rljob_response_length_tokens", (("stat", "max"),)): r["response_length_max"],
        ("rljob_truncated_fraction", ()): r["truncated_fraction"],
        ("rljob_reward_function_mean", (("function", "exact-match"),)): r["reward_by_function"]["exact-match"],
        ("rljob_trained_tokens_per_second", ()): r["tokens_per_second"],
    }
    missing = [key for key in expected if key not in got]
    assert not missing, f"not exported: {missing}"
    assert {key: got[key] for key in expected} == pytest.approx(expected)
