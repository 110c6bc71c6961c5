"""The trainer under each algorithm's settings: REINFORCE++'s per-token advantages (the KL in the reward,
normalised over the whole batch, every rank's share of it), and each loss aggregation weighted across
micro-batches exactly as one batch."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_ranks import end_rank, join_group, spawn_two_ranks
from test_trainer import completion_tokens, config, samples_for, with_plain_sgd

from rljob_workers.trainer.policy import PolicyTrainer

from tiny_models import char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def whitened(values: list[float]) -> list[float]:
    """(x - mean) / (population std + 1e-6), REINFORCE++'s normalisation over the batch's tokens."""
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    return [(v - mean) / (std + 1e-6) for v in values]


def test_batch_normalized_without_kl_whitens_the_rewards_over_the_tokens(model_dir: Path) -> None:
    trainer = PolicyTrainer(config(model_dir, name="reinforce_pp", klCoef=0.0), torch.device("cpu"))
    assert trainer.reference is None  # no KL, no reference model
    good, bad = samples_for(trainer)  # rewards +1 (3 tokens) and -1 (4 tokens)
    # 7 tokens: three of 1, four of -1: mean -1/7, population std sqrt(48/49) = 0.9897433
    out = trainer._batch_normalized([good, bad], completion_tokens([good, bad]), {})
    expected = whitened([1.0] * 3 + [-1.0] * 4)
    assert out[0].token_advantages == pytest.approx(expected[:3]) and out[1].token_advantages == pytest.approx(
        expected[3:]
    )
    assert expected[0] == pytest.approx((1 + 1 / 7) / (48 / 49) ** 0.5, rel=1e-5)


def test_the_kl_to_come_is_subtracted_from_each_tokens_return(model_dir: Path) -> None:
    trainer = PolicyTrainer(config(model_dir, name="reinforce_pp", klCoef=0.5), torch.device("cpu"))
    # The behaviour log-probs are the policy's own +0.3, -0.3, ... and the reference is that same (initial)
    # policy, so k1 = log π_old - log π_ref is +0.3, -0.3, ... per token.
    good, bad = samples_for(trainer, off_policy=0.3)
    sums: dict[str, float] = {}
    out = trainer._batch_normalized([good, bad], completion_tokens([good, bad]), sums)
    # G_t = r - 0.5 * sum_{i >= t} kl_i: good (r = 1, kl .3 -.3 .3): 1 - 0.5 * (.3, 0, .3) = (.85, 1, .85)
    # bad (r = -1, kl .3 -.3 .3 -.3): -1 - 0.5 * (0, -.3, 0, -.3) = (-1, -.85, -1, -.85)
    expected = whitened([0.85, 1.0, 0.85, -1.0, -0.85, -1.0, -0.85])
    assert out[0].token_advantages == pytest.approx(expected[:3], abs=1e-4)
    assert out[1].token_advantages == pytest.approx(expected[3:], abs=1e-4)
    assert sums["kl_reward"] == pytest.approx(0.3 / 7, abs=1e-4)  # (.3 - .3 + .3 + .3 - .3 + .3 - .3) / 7


def test_kl_in_the_reward_is_not_in_the_loss_too(model_dir: Path) -> None:
    trainer = PolicyTrainer(config(model_dir, name="reinforce_pp", klCoef=0.5), torch.device("cpu"))
    samples = samples_for(trainer, off_policy=0.3)
    metrics = trainer.train_step(samples, total_samples=2, total_tokens=completion_tokens(samples))
    assert "kl_ref" not in metrics and metrics["kl_reward"] == pytest.approx(0.3 / 7, abs=1e-4)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"name": "grpo"},
        {"name": "dr_grpo"},
        {"name": "gspo"},
        {"name": "reinforce_pp", "klCoef": 0.0},
        {"lossAggregation": "sequence-mean"},
    ],
    ids=["token-mean", "token-sum-norm", "sequence-ratio", "batch-normalized", "sequence-mean"],
)
def test_micro_batches_of_one_step_like_the_whole_batch(model_dir: Path, algorithm: dict[str, Any]) -> None:
    # Each micro-batch's loss is weighted by its share of the batch (tokens for token-mean, completions
    # otherwise), so one micro-batch per sample and one for all take the same SGD step.
    steps = []
    for micro in (1, 4):
        trainer = with_plain_sgd(PolicyTrainer(config(model_dir, micro, **algorithm), torch.device("cpu")))
        samples = samples_for(trainer, count=4, off_policy=0.3)
        trainer.train_step(samples, total_samples=4, total_tokens=completion_tokens(samples))
        steps.append(dict(trainer.named_weights()))
    for name, weight in steps[0].items():
        torch.testing.assert_close(steps[1][name], weight, rtol=1e-5, atol=1e-6, msg=name)


def _rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    join_group(rank, port)
    trainer = PolicyTrainer(config(Path(model_dir), 1, name="reinforce_pp", klCoef=0.5), torch.device("cpu"), 2)
    samples = samples_for(trainer, count=4, off_policy=0.3)
    mine = trainer._batch_normalized(samples[rank::2], completion_tokens(samples), {})
    torch.save([s.token_advantages for s in mine], f"{out}/rank{rank}.pt")
    end_rank()


def test_two_ranks_normalise_over_the_whole_batch(model_dir: Path, tmp_path: Path) -> None:
    # Each rank holds half the batch; the mean and std are the whole batch's (all-reduced moments).
    single = PolicyTrainer(config(model_dir, 1, name="reinforce_pp", klCoef=0.5), torch.device("cpu"))
    samples = samples_for(single, count=4, off_policy=0.3)
    expected = [s.token_advantages for s in single._batch_normalized(samples, completion_tokens(samples), {})]
    spawn_two_ranks(_rank_main, (str(model_dir), str(tmp_path)), 120.0)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    assert ranks[0] == [pytest.approx(v, abs=1e-5) for v in expected[0::2]]
    assert ranks[1] == [pytest.approx(v, abs=1e-5) for v in expected[1::2]]
