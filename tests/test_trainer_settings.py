"""The settings a verl or TRL user expects (#54): a learning-rate schedule with warmup, several update epochs
over a batch, an entropy bonus, dual-clip, and REINFORCE++-baseline's advantages. Each test fails without its
setting: it shows the setting's effect on a real trainer step (the tiny Llama) or on the pure loss, against
the peer's definition."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from pydantic import ValidationError
from test_trainer import config, model_dir, samples_for  # noqa: F401  (model_dir: the fixture)

from rljob_api import AlgorithmSpec
from rljob_workers.trainer.grpo import policy_loss, token_entropy, whiten
from rljob_workers.trainer.policy import PolicyTrainer
from rljob_workers.trainer.samples import TrainSample, advantages
from rljob_workers.trainer.schedule import steps_done

CPU = torch.device("cpu")


def learning_rates(trainer: PolicyTrainer, steps: int) -> list[float]:
    rates = []
    for _ in range(steps):
        samples = samples_for(trainer)
        rates.append(trainer.train_step(samples, len(samples), sum(len(s.token_ids) for s in samples))["learning_rate"])
    return rates


def test_a_cosine_schedule_warms_up_then_decays_to_its_floor(model_dir):  # noqa: F811
    """transformers' cosine_with_min_lr (verl's warmup_style cosine, min_lr_ratio): lr 0 at the first update,
    the peak after warmupSteps, min_ratio × peak at the last; constant (the default) stays at the peak."""
    schedule = {"kind": "cosine", "warmupSteps": 2, "minRatio": 0.1}
    trainer = PolicyTrainer(config(model_dir, totalSteps=10, schedule=schedule), CPU)
    rates = learning_rates(trainer, 10)
    peak = 1e-2
    assert rates[0] == 0.0 and rates[1] == pytest.approx(peak / 2) and rates[2] == pytest.approx(peak)
    assert all(a > b for a, b in itertools.pairwise(rates[2:])), rates
    assert rates[-1] == pytest.approx(peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8))))
    flat = learning_rates(PolicyTrainer(config(model_dir, totalSteps=10), CPU), 3)
    assert flat == [peak] * 3


def test_a_linear_schedule_counts_optimizer_steps_and_resumes_from_the_optimizers_state(model_dir, tmp_path):  # noqa: F811
    """Each train step makes miniBatches × updateEpochs optimizer steps, which the schedule counts (as HF and
    verl do); a trainer whose optimizer state was saved continues the schedule where it stopped."""
    cfg = config(model_dir, totalSteps=4, updateEpochs=2, schedule={"kind": "linear"})
    trainer = PolicyTrainer(cfg, CPU)
    first = learning_rates(trainer, 2)
    assert steps_done(trainer.optimizer) == 4
    assert first == [pytest.approx(1e-2 * (1 - 1 / 8)), pytest.approx(1e-2 * (1 - 3 / 8))]
    trainer.save(tmp_path, dict(trainer.master_weights()))
    resumed = PolicyTrainer(cfg, CPU)
    resumed.load_optimizer(tmp_path)
    assert learning_rates(resumed, 1) == [pytest.approx(1e-2 * (1 - 5 / 8))]


def test_update_epochs_pass_over_the_batch_again_and_move_it_further(model_dir):  # noqa: F811
    """verl's ppo_epochs / TRL's num_iterations: two passes make two optimizer steps from one batch, and the
    rewarded completion's log-prob rises further than after one."""

    def rise(epochs: int) -> tuple[float, int]:
        trainer = PolicyTrainer(config(model_dir, updateEpochs=epochs), CPU)
        samples = samples_for(trainer)
        before = sum(samples[0].behaviour_logprobs)
        trainer.train_step(samples, 2, sum(len(s.token_ids) for s in samples))
        after = float(sequence_logprobs_sum(trainer, samples[0]))
        return after - before, steps_done(trainer.optimizer)

    (one, one_steps), (two, two_steps) = rise(1), rise(2)
    assert (one_steps, two_steps) == (1, 2)
    assert two > one > 0, (one, two)


def sequence_logprobs_sum(trainer: PolicyTrainer, sample: TrainSample) -> float:
    from test_trainer import sequence_logprobs

    return float(sequence_logprobs(trainer, sample).sum())


def test_an_entropy_bonus_raises_the_policys_entropy_where_advantages_teach_nothing(model_dir):  # noqa: F811
    """verl's entropy_coeff: loss - coef × entropy. With every advantage 0 the policy loss has no gradient, so
    only the bonus moves the weights: the entropy on the batch rises; without it nothing moves."""

    def entropy_change(coef: float) -> float:
        trainer = PolicyTrainer(config(model_dir, entropyCoef=coef, learningRate=1e-3), CPU)
        samples = samples_for(trainer)
        for sample in samples:
            sample.advantage = 0.0
        before = trainer.train_step(samples, 2, sum(len(s.token_ids) for s in samples))["entropy"]
        after = trainer.train_step(samples, 2, sum(len(s.token_ids) for s in samples))["entropy"]
        return after - before

    assert entropy_change(0.0) == pytest.approx(0.0, abs=1e-6)
    assert entropy_change(1.0) > 1e-3


def test_token_entropy_is_the_distributions_entropy_and_differentiable() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]]], requires_grad=True)
    entropy = token_entropy(logits)
    assert entropy[0, 0].item() == pytest.approx(math.log(4)) and entropy[0, 1].item() < 0.01
    entropy.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_dual_clip_caps_the_loss_of_a_negative_advantage_token_whose_ratio_ran_away() -> None:
    """verl's compute_policy_loss with clip_ratio_c: for A < 0, min(max(-A·r, -A·clip(r)), -A·c)."""
    ratio = torch.tensor([[5.0, 0.5, 5.0]])
    behaviour = torch.zeros_like(ratio)
    advantages = torch.tensor([[-1.0, -1.0, 1.0]])
    mask = torch.ones_like(ratio)
    kwargs = {"aggregation": "token-mean"}
    plain, _ = policy_loss(ratio.log(), behaviour, advantages, mask, **kwargs)  # type: ignore[arg-type]
    dual, _ = policy_loss(ratio.log(), behaviour, advantages, mask, clip_ratio_c=3.0, **kwargs)  # type: ignore[arg-type]
    # per token: -A·r = 5 for the first (capped at c·|A| = 3), 0.8 for the second (clipped ratio), -1.2 for the third
    assert plain.item() == pytest.approx((5.0 + 0.8 - 1.2) / 3)
    assert dual.item() == pytest.approx((3.0 + 0.8 - 1.2) / 3)
    with pytest.raises(ValidationError, match="clipRatioC"):
        AlgorithmSpec.model_validate({"clipRatioC": 1.0})  # verl asserts c > 1 too


def test_reinforce_pp_baseline_is_the_reward_less_its_groups_mean_whitened_over_the_batch() -> None:
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage: score - mean(group), then whitened over
    the batch's response tokens."""
    rewards, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], ["a", "a", "a", "b", "b", "b"]
    centred = advantages(rewards, groups, "group-mean-batch-normalized")
    assert centred == pytest.approx([2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3])
    lengths = [3, 1, 2, 2, 4, 1]
    width = max(lengths)
    per_token = torch.tensor([[a] * width for a in centred])
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    whitened = whiten(per_token, mask)
    values = per_token[mask == 1]
    expected = (values - values.mean()) / (values.std(unbiased=False) + 1e-6)
    assert whitened[mask == 1].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    resolved = AlgorithmSpec.model_validate({"name": "reinforce_pp_baseline"})
    assert resolved.effective("advantageEstimator") == "group-mean-batch-normalized"
    assert resolved.effective("klIn") == "loss" and resolved.effective("klCoef") == 0.001


def test_a_reinforce_pp_baseline_step_trains_on_whitened_token_advantages(model_dir):  # noqa: F811
    trainer = PolicyTrainer(config(model_dir, name="reinforce_pp_baseline"), CPU)
    samples = samples_for(trainer)
    metrics = trainer.train_step(samples, 2, sum(len(s.token_ids) for s in samples))
    assert math.isfinite(metrics["loss"] if "loss" in metrics else metrics["policy_loss"])
