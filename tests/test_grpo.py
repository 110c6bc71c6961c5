"""GRPO math against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rljob_workers.trainer.grpo import (
    entropy_sum,
    grpo_loss,
    kl_penalty,
    masked_mean,
    policy_loss,
    token_logprobs,
)
from rljob_workers.trainer.samples import group_advantages, mean_and_std

LN = math.log


def lp(*probs: float) -> torch.Tensor:
    """A [1, T] row of log-probabilities."""
    return torch.tensor([[LN(p) for p in probs]])


# --- advantages ----------------------------------------------------------------------


def test_group_advantages_one_right_of_four() -> None:
    # mean 0.25, population std sqrt(0.25 * 0.75) = 0.4330
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0])
    std = math.sqrt(0.1875)
    assert adv == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], abs=1e-5)


def test_group_advantages_unscaled_is_centred_reward() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], scale_by_std=False)
    assert adv == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_all_equal_group_gets_zero_not_nan() -> None:
    # 0.1 is not exact in binary: r - mean is a hair off zero, and / eps would blow it up.
    rewards = [0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5]
    adv = group_advantages(rewards, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert adv[:6] == [0.0] * 6
    assert all(math.isfinite(a) for a in adv)
    assert abs(sum(adv[6:])) < 1e-9


def test_interleaved_groups_with_any_ids_match_each_group_alone() -> None:
    rewards, ids = [1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 1.0, 1.0], ["a", "a", "a", "a", 7, 7, 7, 7]
    perm = [5, 0, 7, 2, 4, 1, 6, 3]  # groups interleaved, ids not 0..G-1
    flat = group_advantages([rewards[i] for i in perm], [ids[i] for i in perm])
    alone = group_advantages(rewards[:4], [0] * 4) + group_advantages(rewards[4:], [0] * 4)
    assert flat == pytest.approx([alone[i] for i in perm])


def test_groups_of_unequal_size_and_singletons() -> None:
    adv = group_advantages([1.0, 0.0, 3.0, 5.0, 5.0], [0, 0, 1, 2, 2])
    # group 0: mean 0.5, std 0.5 -> +-1; group 1 is one sample; group 2 is all equal.
    assert adv == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0], abs=1e-5)


def test_a_group_id_for_each_reward() -> None:
    with pytest.raises(ValueError, match="4 rewards but 3 group ids"):
        group_advantages([0.0] * 4, [0, 0, 0])


def test_mean_and_std_are_the_population_ones() -> None:
    assert mean_and_std([1.0, 0.0, 0.0, 0.0]) == pytest.approx((0.25, math.sqrt(0.1875)))
    assert mean_and_std([]) == (0.0, 0.0)


# --- masked mean ---------------------------------------------------------------------


def test_masked_mean_ignores_masked_inf() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, -math.inf]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 4.0]))


def test_masked_mean_of_nothing_is_zero() -> None:
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


# --- the clipped surrogate -----------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "clipped", "grad"),
    [
        # A > 0: the ratio may rise only to 1.2; below 1 - eps nothing is clipped.
        (1.5, 1.0, -1.2, True, 0.0),
        (0.5, 1.0, -0.5, False, -0.5),
        # A < 0: the ratio may fall only to 0.8; above 1 + eps nothing is clipped.
        (0.5, -1.0, 0.8, True, 0.0),
        (1.5, -1.0, 1.5, False, 1.5),
        # Inside the trust region: plain -ratio * A.
        (1.1, 2.0, -2.2, False, -2.2),
    ],
)
def test_policy_loss_clips_each_side(ratio: float, adv: float, loss: float, clipped: bool, grad: float) -> None:
    behaviour = lp(0.4)
    logprobs = (behaviour + LN(ratio)).requires_grad_()
    out, metrics = policy_loss(logprobs, behaviour, torch.tensor([adv]), torch.ones(1, 1))
    out.backward()
    assert out.item() == pytest.approx(loss, abs=1e-5)
    assert metrics["clip_fraction"].item() == float(clipped)
    # d(-ratio * A)/d logprob = -ratio * A where unclipped; 0 where clipped.
    assert logprobs.grad is not None
    assert logprobs.grad.item() == pytest.approx(grad, abs=1e-5)


def test_clip_higher_is_asymmetric() -> None:
    behaviour = lp(0.4)
    up = behaviour + LN(1.5)
    loss, _ = policy_loss(up, behaviour, torch.tensor([1.0]), torch.ones(1, 1), clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28, abs=1e-5)
    down = behaviour + LN(0.5)
    loss, _ = policy_loss(down, behaviour, torch.tensor([-1.0]), torch.ones(1, 1), clip_low=0.1)
    assert loss.item() == pytest.approx(0.9, abs=1e-5)


def test_off_policy_ratio_and_metrics() -> None:
    # A stale sample: the sampler gave the token 0.5, the policy now gives it 0.55.
    loss, metrics = policy_loss(lp(0.55), lp(0.5), torch.tensor([2.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-2.2, abs=1e-5)
    assert metrics["ratio_mean"].item() == pytest.approx(1.1, abs=1e-6)
    # k3 of KL(behaviour || policy): (r - 1) - ln r
    assert metrics["approx_kl"].item() == pytest.approx(0.1 - LN(1.1), abs=1e-6)
    assert metrics["clip_fraction"].item() == 0.0


def test_on_policy_loss_is_minus_mean_advantage() -> None:
    logprobs = lp(0.3, 0.6)
    loss, metrics = policy_loss(logprobs, logprobs, torch.tensor([0.5]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["ratio_mean"].item() == 1.0
    assert metrics["approx_kl"].item() == 0.0


def test_masked_tokens_do_not_count_or_poison() -> None:
    logprobs = torch.tensor([[LN(0.5), 3.0], [LN(0.5), 0.0]], requires_grad=True)
    behaviour = torch.tensor([[LN(0.5), -math.inf], [LN(0.25), math.nan]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, metrics = policy_loss(logprobs, behaviour, torch.tensor([1.0, 1.0]), mask)
    loss.backward()
    # Token ratios 1 and 2 (clipped to 1.2): mean of -1 and -1.2.
    assert loss.item() == pytest.approx(-1.1, abs=1e-5)
    assert metrics["clip_fraction"].item() == 0.5
    assert logprobs.grad is not None
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[:, 1].abs().sum() == 0


def test_aggregation_modes_weigh_tokens_or_sequences() -> None:
    # On-policy, so each token's loss is -A: sequence 0 (1 token, A=+1), 1 (3 tokens, A=-1).
    logprobs = torch.full((2, 3), LN(0.5))
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -1.0])
    token, _ = policy_loss(logprobs, logprobs, adv, mask, aggregation="token-mean")
    seq, _ = policy_loss(logprobs, logprobs, adv, mask, aggregation="sequence-mean")
    assert token.item() == pytest.approx((-1 + 3) / 4)
    assert seq.item() == pytest.approx((-1 + 1) / 2)
    with pytest.raises(ValueError, match="aggregation"):
        policy_loss(logprobs, logprobs, adv, mask, aggregation="sum")  # type: ignore[arg-type]


def test_per_token_advantages_are_accepted() -> None:
    logprobs = lp(0.5, 0.5)
    adv = torch.tensor([[1.0, 3.0]])
    loss, _ = policy_loss(logprobs, logprobs, adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-2.0)


# --- KL to the reference -------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        # policy 0.5, reference 0.25: log_r = ln(0.25 / 0.5) = -ln 2
        ("k1", LN(2)),
        ("k2", 0.5 * LN(2) ** 2),
        ("k3", 0.5 - 1 + LN(2)),
    ],
)
def test_kl_kinds(kind: str, value: float) -> None:
    kl = kl_penalty(lp(0.5), lp(0.25), torch.ones(1, 1), kind)  # type: ignore[arg-type]
    assert kl.item() == pytest.approx(value, abs=1e-6)


def test_kl_is_zero_at_the_reference_and_masked() -> None:
    logprobs = torch.tensor([[LN(0.5), LN(0.9)]])
    ref = torch.tensor([[LN(0.5), -math.inf]])
    for kind in ("k1", "k2", "k3"):
        kl = kl_penalty(logprobs, ref, torch.tensor([[1.0, 0.0]]), kind)  # type: ignore[arg-type]
        assert kl.item() == 0.0


def test_grpo_loss_adds_scaled_kl_and_skips_reference_at_zero() -> None:
    logprobs, ref, mask, adv = lp(0.5), lp(0.25), torch.ones(1, 1), torch.tensor([1.0])
    plain, metrics = grpo_loss(logprobs, logprobs, adv, mask)
    assert "kl_ref" not in metrics
    assert plain.item() == pytest.approx(-1.0)
    with_kl, metrics = grpo_loss(logprobs, logprobs, adv, mask, ref_logprobs=ref, kl_coef=0.1)
    k3 = 0.5 - 1 + LN(2)
    assert with_kl.item() == pytest.approx(-1.0 + 0.1 * k3, abs=1e-6)
    assert metrics["kl_ref"].item() == pytest.approx(k3, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, logprobs, adv, mask, kl_coef=0.1)


# --- log-probs -----------------------------------------------------------------------


def test_token_logprobs_by_hand() -> None:
    logits = torch.tensor([[[0.0, LN(3.0)]]])
    target = torch.tensor([[1]])
    assert token_logprobs(logits, target).item() == pytest.approx(LN(0.75))
    # temperature 2 halves the logits: p = sqrt(3) / (1 + sqrt(3))
    s3 = math.sqrt(3.0)
    assert token_logprobs(logits, target, 2.0).item() == pytest.approx(LN(s3 / (1 + s3)))


def test_token_logprobs_matches_log_softmax_in_chunks() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen, requires_grad=True)
    target = torch.randint(0, 11, (3, 5), generator=gen)
    out = token_logprobs(logits, target, temperature=0.7, chunk_rows=4)
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, target[..., None]).squeeze(-1)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_token_logprobs_upcasts_half_precision() -> None:
    logits = torch.randn(2, 4, 7).to(torch.bfloat16)
    out = token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long))
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(logits, torch.zeros(2, 4, dtype=torch.long), temperature=0.0)


def test_entropy_sum_by_hand_over_kept_positions_only() -> None:
    """Uniform over 4 tokens: ln 4 nats; a -inf logit is a token never drawn (0, not NaN); masked rows count not."""
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, float("-inf"), float("-inf")], [9.0, 0.0, 0.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert entropy_sum(logits, mask) == pytest.approx(LN(4.0) + LN(2.0))
    # Temperature flattens the distribution the sampler draws from: the masked-in one-sided row gains entropy.
    peaked = torch.tensor([[[4.0, 0.0]]])
    one = torch.ones(1, 1)
    assert 0.0 < entropy_sum(peaked, one) < entropy_sum(peaked, one, temperature=4.0) < LN(2.0)


def test_entropy_sum_in_chunks_matches_whole() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen)
    mask = (torch.rand(3, 5, generator=gen) > 0.3).float()
    log_p = torch.log_softmax(logits / 0.7, -1)
    expected = float((-(log_p.exp() * log_p).sum(-1) * mask).sum())
    assert entropy_sum(logits, mask, 0.7, chunk_rows=2) == pytest.approx(expected, rel=1e-5)


# --- the gradient points the right way -----------------------------------------------


@pytest.mark.parametrize(("adv", "sign"), [(1.0, 1), (-1.0, -1)])
def test_sgd_step_moves_logprob_with_advantage(adv: float, sign: int) -> None:
    # A one-token policy over 4 tokens; token 2 was sampled, with advantage adv.
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    target = torch.tensor([[2]])
    before = token_logprobs(logits, target).detach()
    opt = torch.optim.SGD([logits], lr=0.5)
    new = token_logprobs(logits, target)
    loss, _ = grpo_loss(new, before, torch.tensor([adv]), torch.ones(1, 1))
    loss.backward()
    opt.step()
    after = token_logprobs(logits, target).detach()
    assert sign * (after - before).item() > 0.1
