"""The rollout correction and the engine/trainer mismatch (trainer/correction.py), worked by hand on small
batches, and the trainer's loss with a known mismatch built in: without a correction the clip cuts a token
the engine merely misjudged; tis and icepop weigh it back or leave it out."""

from __future__ import annotations

import math

import pytest
import torch

from rljob_workers.trainer.correction import correction_weights, mismatch
from rljob_workers.trainer.grpo import policy_loss

# Four tokens of one sample, the trainer's probabilities and the engine's: r = π_trainer / π_engine
TRAINER = torch.log(torch.tensor([[0.45, 0.3, 0.9, 0.05, 0.3]]))
ENGINE = torch.log(torch.tensor([[0.25, 0.5, 0.1, 0.25, 0.3]]))
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the fifth is padding


def test_each_mode_weighs_tokens_by_the_ratio_as_its_paper_says() -> None:
    # r = [0.45/0.25, 0.3/0.5, 0.9/0.1, 0.05/0.25] = [1.8, 0.6, 9, 0.2]
    none = correction_weights(TRAINER, ENGINE, MASK, "none", 0.5, 2.0)
    assert none.tolist() == [[1.0, 1.0, 1.0, 1.0, 0.0]]
    tis = correction_weights(TRAINER, ENGINE, MASK, "tis", 0.5, 2.0)  # min(r, 2)
    assert tis[0, :4].tolist() == pytest.approx([1.8, 0.6, 2.0, 0.2]) and tis[0, 4] == 0
    icepop = correction_weights(TRAINER, ENGINE, MASK, "icepop", 0.5, 2.0)  # r where 0.5 <= r <= 2, else 0
    assert icepop[0, :4].tolist() == pytest.approx([1.8, 0.6, 0.0, 0.0]) and icepop[0, 4] == 0
    assert not tis.requires_grad


def test_the_mismatch_counts_only_the_samples_the_trainers_weights_generated() -> None:
    trainer = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]])
    engine = torch.tensor([[-1.1, -1.7, 9.0], [-3.0, -3.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # row 0 only (row 1 is a stale sample): |−1.1 + 1| + |−1.7 + 2| = 0.1 + 0.3, its largest 0.3, 2 tokens
    total, largest, tokens = mismatch(trainer, engine, mask, torch.tensor([True, False]))
    assert (total, largest, tokens) == (pytest.approx(0.4), pytest.approx(0.3), 2)
    assert mismatch(trainer, engine, mask, torch.tensor([False, False])) == (0.0, 0.0, 0)


def test_a_known_mismatch_is_cut_by_the_clip_and_weighed_back_by_the_correction() -> None:
    """One token with advantage A = 1 that the trainer (at the step's start, π = 0.6) gives three times the
    engine's probability (0.2): the engine misjudged it, the policy has not moved yet.

    Without a correction the ratio is against the engine: ρ = 0.6 / 0.2 = 3, past 1 + 0.2, so the loss is
    -min(3A, 1.2A) = -1.2 and its gradient is cut (0). With tis the ratio is against the trainer itself
    (ρ = 1) and the token weighs min(3, 2) = 2: loss -2ρA = -2, gradient -2 per unit of log-prob. icepop
    leaves a token with r = 3 > 2 out: loss 0, gradient 0; one with r = 1.5 keeps it at 1.5."""
    trainer_start = torch.log(torch.tensor([[0.6]]))
    engine = torch.log(torch.tensor([[0.2]]))
    mask, advantage = torch.ones(1, 1), torch.tensor([1.0])

    def loss_and_gradient(mode: str, engine_logprobs: torch.Tensor) -> tuple[float, float]:
        logprobs = trainer_start.clone().requires_grad_(True)
        old, weights = engine_logprobs, None
        if mode != "none":
            weights = correction_weights(trainer_start, engine_logprobs, mask, mode, 0.5, 2.0)  # type: ignore[arg-type]
            old = trainer_start
        loss, _ = policy_loss(logprobs, old, advantage, mask, token_weights=weights)
        loss.backward()
        assert logprobs.grad is not None
        return float(loss.detach()), float(logprobs.grad)

    assert loss_and_gradient("none", engine) == (pytest.approx(-1.2), pytest.approx(0.0))
    assert loss_and_gradient("tis", engine) == (pytest.approx(-2.0), pytest.approx(-2.0))
    assert loss_and_gradient("icepop", engine) == (pytest.approx(0.0), pytest.approx(0.0))
    milder = torch.log(torch.tensor([[0.4]]))  # r = 0.6 / 0.4 = 1.5: icepop keeps it, weighted 1.5
    assert loss_and_gradient("icepop", milder) == (pytest.approx(-1.5), pytest.approx(-1.5))
    assert math.isclose(loss_and_gradient("tis", milder)[0], -1.5, rel_tol=1e-6)
