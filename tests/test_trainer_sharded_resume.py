"""An FSDP run resumes its optimizer (#53): every rank saves and loads its own shards of the AdamW state
with torch.distributed.checkpoint. Two sharded gloo ranks on CPU (spawned processes, as the trainer's Ray
actors are) are fed the same batches: one pair trains straight through, one is stopped after two steps
(its checkpoint committed, its processes gone) and a new pair resumes from it. Before, rank 0 alone wrote
`optimizer.pt` (only its own shards) and every rank loaded that file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_ranks import end_rank, join_group, spawn_two_ranks
from test_trainer import completion_tokens, config, samples_for

from rljob_workers.trainer import checkpoint
from rljob_workers.trainer.policy import PolicyTrainer
from rljob_workers.trainer.samples import TrainSample, combine_rank_metrics

from tiny_models import char_llama

pytestmark = pytest.mark.slow

TIMEOUT_SECONDS = 180.0
STEPS, STOP_AFTER = 5, 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def _trainer(model_dir: str, resume: str | None) -> PolicyTrainer:
    cfg = config(Path(model_dir), 1).model_copy(update={"strategy": "fsdp", "world_size": 2})
    model = str(Path(resume) / "model") if resume else None
    return PolicyTrainer(cfg, torch.device("cpu"), world_size=2, resume_from=model)


def _save(trainer: PolicyTrainer, rank: int, root: Path, step: int) -> None:
    """What TrainerActor.save_checkpoint does on each rank."""
    staging = checkpoint.begin(root, step) if rank == 0 else checkpoint.staging_dir(root, step)
    assert staging is not None
    weights = dict(trainer.master_weights())  # collective: no rank writes before rank 0 laid the folder out
    trainer.save_optimizer_shard(staging)
    if rank == 0:
        trainer.save(staging, weights)
        checkpoint.commit(root, staging, step, {"step": step}, keep=2)


def _rank_main(rank: int, port: int, model_dir: str, out: str, steps: list[int], mode: str) -> None:
    """Train `steps` (numbers of the batches to feed); `mode`: 'save' checkpoints after the last,
    'resume' starts from the checkpoint, 'fresh-optimizer' from its weights with a new optimizer."""
    join_group(rank, port)
    root = Path(out) / "ckpt"
    resume = str(checkpoint.latest(root)) if mode in ("resume", "fresh-optimizer") else None
    trainer = _trainer(model_dir, resume)
    if mode == "resume":
        trainer.load_optimizer(Path(str(resume)))
    batches: list[list[TrainSample]] = torch.load(Path(out).parent / "batches.pt", weights_only=False)
    losses = {}
    for step in steps:
        samples = batches[step - 1]
        metrics = trainer.train_step(samples[rank::2], len(samples), completion_tokens(samples))
        losses[step] = metrics
    if mode == "save":
        _save(trainer, rank, root, steps[-1])
    torch.save(losses, Path(out) / f"rank{rank}-{mode}.pt")
    end_rank()


def _two_ranks(model_dir: Path, out: Path, steps: list[int], mode: str) -> dict[int, dict[str, float]]:
    """Each step's policy loss and entropy over both ranks (combined as the launcher does)."""
    out.mkdir(parents=True, exist_ok=True)
    spawn_two_ranks(_rank_main, (str(model_dir), str(out), steps, mode), TIMEOUT_SECONDS)
    per_rank: list[dict[int, Any]] = [torch.load(out / f"rank{r}-{mode}.pt", weights_only=True) for r in (0, 1)]
    combined = {step: combine_rank_metrics([per_rank[0][step], per_rank[1][step]]) for step in steps}
    return {step: {k: combined[step][k] for k in ("policy_loss", "entropy")} for step in steps}


def test_a_resumed_sharded_trainer_steps_as_one_never_stopped(model_dir, tmp_path):
    reference = PolicyTrainer(config(model_dir), torch.device("cpu"))
    batches = [samples_for(reference, count=4, off_policy=0.05) for _ in range(STEPS)]
    torch.save(batches, tmp_path / "batches.pt")
    every = list(range(1, STEPS + 1))
    through = _two_ranks(model_dir, tmp_path / "through", every, "through")
    stopped = tmp_path / "stopped"
    _two_ranks(model_dir, stopped, every[:STOP_AFTER], "save")
    shards = sorted(p.name for p in (checkpoint.step_dir(stopped / "ckpt", STOP_AFTER) / "optimizer").iterdir())
    print(f"optimizer shards: {shards}")
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(shards), "each rank wrote its own shard"
    resumed = _two_ranks(model_dir, stopped, every[STOP_AFTER:], "resume")
    fresh = _two_ranks(model_dir, stopped, every[STOP_AFTER:], "fresh-optimizer")
    for step in every[STOP_AFTER:]:
        print(f"step {step}: through {through[step]}\n        resumed {resumed[step]}\n  fresh optimizer {fresh[step]}")
        assert resumed[step] == pytest.approx(through[step], abs=1e-5)
    # the check can fail: Adam's moments show from the second step after the resume on
    assert abs(fresh[STOP_AFTER + 2]["entropy"] - through[STOP_AFTER + 2]["entropy"]) > 1e-4
