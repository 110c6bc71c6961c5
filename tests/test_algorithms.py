"""The GRPO family's estimators, aggregations, ratio levels, penalties and KL estimators against the
papers' formulas, worked by hand on small batches (the value beside its formula in each test).

GRPO: Shao et al. 2024 (arXiv:2402.03300); Dr. GRPO: Liu et al. 2025 (arXiv:2503.20783); DAPO: Yu et
al. 2025 (arXiv:2503.14476); GSPO: Zheng et al. 2025 (arXiv:2507.18071); RLOO: Ahmadian et al. 2024
(arXiv:2402.14740); REINFORCE++: Hu 2025 (arXiv:2501.03262); KL estimators: Schulman 2020.
"""

from __future__ import annotations

import math

import pytest
import torch

from rljob_workers.trainer.grpo import (
    KLKind,
    aggregate,
    grpo_loss,
    kl_folded_returns,
    kl_per_token,
    moments,
    policy_loss,
    whiten,
)
from rljob_workers.trainer.samples import (
    advantages,
    all_equal,
    group_advantages,
    leave_one_out_advantages,
    overlong_penalty,
)

LN = math.log

# --- advantage estimators --------------------------------------------------------------


def test_leave_one_out_subtracts_the_mean_of_the_other_rewards() -> None:
    # RLOO: A_i = r_i - (sum_j r_j - r_i) / (n - 1)
    # [1, 0, 0, 0]: A_0 = 1 - 0/3 = 1; A_1 = 0 - 1/3 = -1/3
    assert leave_one_out_advantages([1.0, 0.0, 0.0, 0.0], [0] * 4) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # [2, 4]: 2 - 4 = -2, 4 - 2 = 2; equal to n/(n-1) (r - mean) = 2 * (2 - 3), 2 * (4 - 3)
    assert leave_one_out_advantages([2.0, 4.0], ["g", "g"]) == pytest.approx([-2.0, 2.0])


def test_leave_one_out_of_one_sample_all_equal_and_interleaved_groups() -> None:
    # a group of one has no other reward: 0, not a division by n - 1 = 0; 0.1 * 3 is not exact in binary,
    # and an all-equal group is still exactly 0
    rewards, ids = [5.0, 0.1, 0.1, 0.1, 3.0, 1.0], ["one", "flat", "flat", "flat", "g", "g"]
    assert leave_one_out_advantages(rewards, ids) == [0.0, 0.0, 0.0, 0.0, pytest.approx(2.0), pytest.approx(-2.0)]


def test_group_relative_with_and_without_std_on_a_group_of_one_and_zero_rewards() -> None:
    # GRPO: (r - mean) / (std + eps); Dr. GRPO: r - mean. A group of one: mean = r, so 0 either way.
    for scale in (True, False):
        assert group_advantages([0.7], [0], scale_by_std=scale) == [0.0]
        assert group_advantages([0.0, 0.0, 0.0], [0, 0, 0], scale_by_std=scale) == [0.0, 0.0, 0.0]
    # [3, 1]: mean 2, population std 1 -> GRPO +-1/(1 + 1e-6); Dr. GRPO +-1
    assert group_advantages([3.0, 1.0], [0, 0]) == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6)])
    assert group_advantages([3.0, 1.0], [0, 0], scale_by_std=False) == [1.0, -1.0]


def test_estimators_by_name() -> None:
    rewards, ids = [1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]
    assert advantages(rewards, ids, "group-relative", scale_by_std=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert advantages(rewards, ids, "leave-one-out") == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # REINFORCE++: the reward itself; the trainer folds in the KL and normalises over the batch
    assert advantages(rewards, ids, "batch-normalized") == rewards
    with pytest.raises(ValueError, match="unknown advantage estimator 'gae'"):
        advantages(rewards, ids, "gae")


def test_all_equal_is_what_dynamic_sampling_drops() -> None:
    assert all_equal([1.0, 1.0, 1.0]) and all_equal([0.0]) and all_equal([])
    assert not all_equal([1.0, 1.0, 0.0])


# --- DAPO's overlong penalty (its eq. 13) ----------------------------------------------


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.0),  # a zero-length completion is short: no penalty
        (16, 0.0),  # |y| <= L_max - L_cache = 20 - 4
        (17, -0.25),  # ((L_max - L_cache) - |y|) / L_cache = (16 - 17) / 4
        (18, -0.5),
        (20, -1.0),  # at L_max: (16 - 20) / 4
        (21, -1.0),  # past L_max: -1
    ],
)
def test_overlong_penalty_is_linear_over_the_buffer(length: int, expected: float) -> None:
    assert overlong_penalty(length, max_new_tokens=20, buffer_tokens=4, penalty=1.0) == pytest.approx(expected)


def test_overlong_penalty_scales_with_its_factor_and_a_whole_budget_buffer() -> None:
    assert overlong_penalty(18, 20, 4, penalty=0.5) == pytest.approx(-0.25)  # 0.5 * (16 - 18) / 4
    assert overlong_penalty(5, 5, 5, penalty=1.0) == pytest.approx(-1.0)  # buffer = budget: (0 - 5) / 5
    assert overlong_penalty(1, 5, 5, penalty=1.0) == pytest.approx(-0.2)  # (0 - 1) / 5


# --- loss aggregation -------------------------------------------------------------------

PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


def test_three_aggregations_by_hand() -> None:
    # token-mean (DAPO): (1 + 2 + 3 + 4) / 4 tokens
    assert float(aggregate(PER_TOKEN, MASK, "token-mean")) == pytest.approx(2.5)
    # sequence-mean (GRPO): ((1 + 2 + 3) / 3 + 4 / 1) / 2 sequences
    assert float(aggregate(PER_TOKEN, MASK, "sequence-mean")) == pytest.approx(3.0)
    # token-sum-norm (Dr. GRPO), C = 4: ((1 + 2 + 3) / 4 + 4 / 4) / 2 sequences
    assert float(aggregate(PER_TOKEN, MASK, "token-sum-norm", norm_tokens=4)) == pytest.approx(1.25)


def test_token_sum_norm_does_not_weigh_a_completion_by_its_own_length() -> None:
    # Doubling one completion's tokens (same per-token loss) doubles its share: sum / C, never sum / |y|.
    short = aggregate(
        torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 0.0]]), "token-sum-norm", 2
    )
    long = aggregate(
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]]), "token-sum-norm", 2
    )
    assert float(short) == pytest.approx(0.5)  # (1/2 + 1/2) / 2
    assert float(long) == pytest.approx(0.75)  # (2/2 + 1/2) / 2
    with pytest.raises(ValueError, match="norm_tokens > 0"):
        aggregate(PER_TOKEN, MASK, "token-sum-norm")


def test_a_zero_length_completion_adds_nothing_and_no_nan() -> None:
    per_token = torch.tensor([[1.0, 2.0], [float("nan"), float("-inf")]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert float(aggregate(per_token, mask, "token-mean")) == pytest.approx(1.5)  # (1 + 2) / 2 tokens
    assert float(aggregate(per_token, mask, "sequence-mean")) == pytest.approx(0.75)  # (1.5 + 0) / 2 sequences
    assert float(aggregate(per_token, mask, "token-sum-norm", 2)) == pytest.approx(0.75)  # (3/2 + 0) / 2


def test_dr_grpo_loss_on_policy_is_minus_the_advantage_token_sum_over_c() -> None:
    # On policy every ratio is 1: loss = -(1/B) sum_i sum_t A_i / C = -(2 * 3 + (-1) * 1) / 5 / 2
    logprobs = torch.tensor([[LN(0.5), LN(0.5), LN(0.5)], [LN(0.5), 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, _ = policy_loss(logprobs, logprobs, adv, MASK, aggregation="token-sum-norm", norm_tokens=5)
    assert float(loss) == pytest.approx(-0.5)


# --- the importance ratio at the sequence level (GSPO) ---------------------------------


def _gspo(adv: float, ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor, dict]:
    behaviour = torch.tensor([[LN(0.5)] * len(ratios)])
    logprobs = (behaviour + torch.tensor([[LN(r) for r in ratios]])).requires_grad_(True)
    loss, metrics = policy_loss(
        logprobs,
        behaviour,
        torch.tensor([adv]),
        torch.ones(1, len(ratios)),
        clip_low=3e-4,
        clip_high=4e-4,
        aggregation="sequence-mean",
        ratio_level="sequence",
    )
    loss.backward()
    assert logprobs.grad is not None
    return loss.detach(), logprobs.grad, metrics


def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios_and_clips_whole() -> None:
    # s = (1.2 * 0.9) ** (1/2) = 1.0392305; A = +1 and s > 1 + 4e-4: clipped, loss -(1 + 4e-4), no gradient
    loss, grad, metrics = _gspo(1.0, [1.2, 0.9])
    assert float(loss) == pytest.approx(-(1 + 4e-4))
    assert grad.abs().sum() == 0
    assert float(metrics["ratio_mean"]) == pytest.approx(math.sqrt(1.08))
    assert float(metrics["clip_fraction"]) == 1.0
    # A = -1: min(-s, -(1 + 4e-4)) = -s, loss s; d loss / d log π_t = -A s / |y| = 1.0392305 / 2 at each token
    loss, grad, _ = _gspo(-1.0, [1.2, 0.9])
    assert float(loss) == pytest.approx(math.sqrt(1.08))
    assert grad.tolist() == [pytest.approx([math.sqrt(1.08) / 2] * 2)]


def test_sequence_ratio_on_policy_and_per_token_ratio_differ_where_tokens_do() -> None:
    # On policy s = 1: loss -A, gradient -A / |y| per token (A ∇s, s = exp(mean log ρ))
    loss, grad, _ = _gspo(2.0, [1.0, 1.0, 1.0, 1.0])
    assert float(loss) == pytest.approx(-2.0)
    assert grad.tolist() == [pytest.approx([-0.5] * 4)]
    # Token ratios 1.5 and 1/1.5: per token, the first is clipped at 1.2 (A = 1); as a sequence s = 1, inside.
    behaviour = torch.tensor([[LN(0.4), LN(0.6)]])
    logprobs = torch.tensor([[LN(0.6), LN(0.4)]])
    token, _ = policy_loss(logprobs, behaviour, torch.tensor([1.0]), torch.ones(1, 2), aggregation="sequence-mean")
    sequence, _ = policy_loss(
        logprobs, behaviour, torch.tensor([1.0]), torch.ones(1, 2), aggregation="sequence-mean", ratio_level="sequence"
    )
    assert float(token) == pytest.approx(-(1.2 + 0.4 / 0.6) / 2)  # -(min(1.5, 1.2) + 0.667) / 2
    assert float(sequence) == pytest.approx(-1.0)


def test_sequence_ratio_of_a_zero_length_completion_is_harmless() -> None:
    logprobs = torch.tensor([[LN(0.5), LN(0.5)], [float("-inf"), float("nan")]], requires_grad=True)
    behaviour = torch.tensor([[LN(0.5), LN(0.5)], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    loss, _ = policy_loss(logprobs, behaviour, torch.tensor([1.0, 5.0]), mask, ratio_level="sequence")
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.0)  # token-mean over the first row's two tokens only
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()


# --- KL estimators (Schulman 2020) ----------------------------------------------------


def test_kl_per_token_by_hand() -> None:
    # π = 0.25, π_ref = 0.5: log_r = ln(π_ref / π) = ln 2
    # k1 = -ln 2 = -0.693147; k2 = (ln 2)^2 / 2 = 0.240227; k3 = 2 - 1 - ln 2 = 0.306853
    logprobs, ref, mask = torch.tensor([[LN(0.25), 0.0]]), torch.tensor([[LN(0.5), 9.0]]), torch.tensor([[1.0, 0.0]])
    assert kl_per_token(logprobs, ref, mask, "k1").tolist() == [pytest.approx([-LN(2), 0.0])]
    assert kl_per_token(logprobs, ref, mask, "k2").tolist() == [pytest.approx([LN(2) ** 2 / 2, 0.0])]
    assert kl_per_token(logprobs, ref, mask, "k3").tolist() == [pytest.approx([1 - LN(2), 0.0])]


def test_kl_estimator_reaches_the_loss_by_name() -> None:
    logprobs = torch.tensor([[LN(0.25)]])
    ref = torch.tensor([[LN(0.5)]])
    one = torch.ones(1, 1)
    # on policy the surrogate is -A = 0 here, so the loss is 0.5 * k
    cases: list[tuple[KLKind, float]] = [("k1", -LN(2)), ("k2", LN(2) ** 2 / 2), ("k3", 1 - LN(2))]
    for kind, k in cases:
        loss, metrics = grpo_loss(logprobs, logprobs, torch.zeros(1), one, ref_logprobs=ref, kl_coef=0.5, kl_kind=kind)
        assert float(loss) == pytest.approx(0.5 * k) and float(metrics["kl_ref"]) == pytest.approx(k)


# --- REINFORCE++: the KL in the reward, normalised over the batch ---------------------


def test_kl_folded_returns_sum_the_kl_still_to_come() -> None:
    # G_t = r - β sum_{i >= t} kl_i, β = 0.1
    # row 0: r = 1, kl (0.1, 0.2, 0.3): 1 - 0.1 * (0.6, 0.5, 0.3) = (0.94, 0.95, 0.97)
    # row 1: r = 0, kl (0.5, 0.5, masked): 0 - 0.1 * (1.0, 0.5) = (-0.1, -0.05), 0 where masked
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    returns = kl_folded_returns(torch.tensor([1.0, 0.0]), kl, mask, kl_coef=0.1)
    assert returns.tolist() == [pytest.approx([0.94, 0.95, 0.97]), pytest.approx([-0.1, -0.05, 0.0])]
    # no KL: every token of a completion carries its reward
    assert kl_folded_returns(torch.tensor([1.0, 0.0]), kl, mask, 0.0).tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_whiten_over_the_batch_tokens_and_in_parts() -> None:
    # tokens 1, 3, 5: mean 3, population std sqrt(8/3) = 1.632993 -> (-1.224745, 0, 1.224745)
    x, mask = torch.tensor([[1.0, 3.0], [5.0, 99.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    std = math.sqrt(8 / 3)
    assert whiten(x, mask).tolist() == [pytest.approx([-2 / std, 0.0], abs=1e-5), pytest.approx([2 / std, 0.0])]
    # Two ranks' parts, whitened with their moments added up, are the whole batch whitened.
    totals = moments(x[:1], mask[:1]) + moments(x[1:], mask[1:])
    assert totals.tolist() == [9.0, 35.0, 3.0]  # sum 1 + 3 + 5, squares 1 + 9 + 25, count
    parts = torch.cat([whiten(x[:1], mask[:1], totals), whiten(x[1:], mask[1:], totals)])
    assert torch.allclose(parts, whiten(x, mask))


def test_whiten_of_equal_values_or_nothing_is_zero() -> None:
    assert whiten(torch.ones(2, 2), torch.ones(2, 2)).abs().max() == 0
    assert whiten(torch.ones(1, 2), torch.zeros(1, 2)).tolist() == [[0.0, 0.0]]
