"""Every training signal of every step, in metrics.jsonl and on the run's Prometheus endpoint: the shared run
(tests/researcher_run.py: the shipped example with a KL term, so that there is a reference to measure against),
its /metrics scraped while it ran, then its metrics.jsonl read back."""

from __future__ import annotations

import math

import pytest
from researcher_run import GROUP, MAX_NEW_TOKENS, PROMPTS, STEPS, ResearcherRun

pytestmark = pytest.mark.ray


def test_every_step_has_every_training_signal(researcher_run: ResearcherRun) -> None:
    run = researcher_run
    records = run.records
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        train = r["train_metrics"]
        assert all(math.isfinite(train[k]) for k in ("policy_loss", "kl_ref", "clip_fraction", "grad_norm")), train
        # The sampler's entropy: above 0 (it samples, not argmaxes) and below the uniform distribution's.
        assert 0.0 < train["entropy"] < math.log(run.vocab), train
        assert 0.0 <= train["clip_fraction"] <= 1.0
        # Before clipping, so not capped at maxGradNorm; 0 only where nothing pulls: every group's samples scored
        # alike (no advantage) and no KL yet.
        learnable = any(0.0 < mean < 1.0 for mean in r["group_reward_means"]) or train["kl_ref"] > 0.0
        assert train["grad_norm"] > 0.0 if learnable else train["grad_norm"] >= 0.0, (train, r["group_reward_means"])
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
    assert any(r["train_metrics"]["grad_norm"] > 0.0 for r in records), "no step pulled the weights anywhere"
    # The first step trains the reference's own weights: no KL yet; the policy has moved away by the last.
    assert records[0]["train_metrics"]["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert records[-1]["train_metrics"]["kl_ref"] > 1e-7


def test_prometheus_exports_every_signal_of_the_step(researcher_run: ResearcherRun) -> None:
    got = researcher_run.scrape
    assert got, f"/metrics never answered after a step: {researcher_run.output[-3000:]}"
    step = int(got[("rljob_step", ())])
    r = researcher_run.records[step - 1]
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
