"""Mixed precision as the field does it: fp32 master weights and optimizer state, the spec's dtype for
compute and for the weights published to the rollout engines, fp32 masters in the checkpoint.

At a GRPO learning rate (1e-6) a bf16 parameter cannot take the update (bf16 keeps 8 bits of mantissa:
a weight of 0.02 moves in steps of about 1e-4), so a trainer that steps bf16 parameters learns
almost nothing; on CPU the same arithmetic shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_trainer import completion_tokens, config, samples_for

from rljob_workers.trainer.policy import PolicyTrainer

from tiny_models import char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def trainer_in(model_dir: Path, dtype: str, **load: str) -> PolicyTrainer:
    cfg = config(model_dir, learningRate=1e-6).model_copy(update={"dtype": dtype})
    return PolicyTrainer(cfg, torch.device("cpu"), **load)  # type: ignore[arg-type]


def moved_by_one_step(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    """Which elements of each parameter one train step changed."""
    before = {n: p.detach().float().clone() for n, p in trainer.policy.named_parameters()}
    torch.manual_seed(0)
    samples = samples_for(trainer, 2)
    trainer.train_step(samples, len(samples), completion_tokens(samples))
    return {n: p.detach().float() != before[n] for n, p in trainer.policy.named_parameters()}


def test_bf16_compute_steps_fp32_masters_that_take_an_update_of_lr_1e_6(model_dir: Path) -> None:
    reference = moved_by_one_step(trainer_in(model_dir, "float32"))  # what the update touches at all
    trainer = trainer_in(model_dir, "bfloat16")
    moved = moved_by_one_step(trainer)
    touched = sum(int(m.sum()) for m in reference.values())
    kept = sum(int((moved[n] & m).sum()) for n, m in reference.items())
    assert touched > 0 and kept / touched >= 0.99, f"{kept}/{touched} of the updated weights moved in bf16"
    assert {p.dtype for p in trainer.policy.parameters()} == {torch.float32}  # the masters
    assert {t.dtype for _, t in trainer.named_weights()} == {torch.bfloat16}  # what the rollout engines load


def test_the_checkpoint_holds_and_restores_the_fp32_masters(model_dir: Path, tmp_path: Path) -> None:
    trainer = trainer_in(model_dir, "bfloat16")
    moved_by_one_step(trainer)
    masters = dict(trainer.master_weights())
    trainer.save(tmp_path, masters)
    resumed = trainer_in(model_dir, "bfloat16", resume_from=str(tmp_path / "model"))
    for name, param in resumed.policy.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param.detach(), masters[name]), name
