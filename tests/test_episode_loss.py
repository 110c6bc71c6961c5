"""An episode's observations are in the sequence the trainer reads but not in what it learns: with the loss
mask, the gradient at every position that predicts an observation token is exactly zero, whatever log-probs
stand there, under each aggregation and ratio level; the model's own turns still get a gradient."""

from __future__ import annotations

import pytest
import torch

from rljob_workers.trainer.grpo import grpo_loss, token_logprobs
from rljob_workers.trainer.microbatch import collate
from rljob_workers.trainer.samples import TrainSample

PROMPT = [1, 10, 11, 12]
# the model's call, the tool's answer (an observation), the model's copy and its end
TURN, OBSERVATION, ANSWER = [13, 14, 15], [20, 21, 22, 23], [16, 17, 2]


def episode(behaviour_at_observation: float) -> TrainSample:
    ids = TURN + OBSERVATION + ANSWER
    mask = [1] * len(TURN) + [0] * len(OBSERVATION) + [1] * len(ANSWER)
    behaviour = [-1.0] * len(TURN) + [behaviour_at_observation] * len(OBSERVATION) + [-1.5] * len(ANSWER)
    return TrainSample(PROMPT, ids, behaviour, 1.0, loss_mask=mask)


def loss_and_logit_grads(sample: TrainSample, aggregation: str, ratio_level: str) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    batch = collate([sample], pad_id=0, device=torch.device("cpu"))
    logits = torch.randn(1, batch["input_ids"].shape[1] - 1, 32, requires_grad=True)
    logprobs = token_logprobs(logits, batch["input_ids"][:, 1:])
    loss, _ = grpo_loss(
        logprobs,
        batch["behaviour"],
        batch["advantages"],
        batch["mask"],
        aggregation=aggregation,  # type: ignore[arg-type]
        ratio_level=ratio_level,  # type: ignore[arg-type]
        norm_tokens=8.0,
    )
    loss.backward()
    assert logits.grad is not None
    return float(loss.detach()), logits.grad[0]


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-mean", "token-sum-norm"])
def test_observation_tokens_contribute_nothing_to_the_loss(aggregation: str, ratio_level: str) -> None:
    loss, grads = loss_and_logit_grads(episode(-0.5), aggregation, ratio_level)
    # logits at t predict token t+1 of the sequence; the completion starts after the prompt's last token
    start = len(PROMPT) - 1
    observed = range(start + len(TURN), start + len(TURN) + len(OBSERVATION))
    model_turns = [*range(start, start + len(TURN)), *range(observed.stop, observed.stop + len(ANSWER))]
    assert all(torch.count_nonzero(grads[t]) == 0 for t in observed)
    assert all(torch.count_nonzero(grads[t]) > 0 for t in model_turns)
    # no log-prob is needed for them: any value there leaves the loss as it is
    assert loss_and_logit_grads(episode(-80.0), aggregation, ratio_level)[0] == pytest.approx(loss, rel=1e-6)
    # and the same sample without the mask does learn from them (the test could fail)
    unmasked = episode(-0.5)
    unmasked.loss_mask = None
    _, all_grads = loss_and_logit_grads(unmasked, aggregation, ratio_level)
    assert all(torch.count_nonzero(all_grads[t]) > 0 for t in observed)
