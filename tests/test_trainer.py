"""The trainer rank: a GRPO step moves log-probs the right way, DDP equals one process, checkpoints round-trip."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
import torch

from rljob_api import AlgorithmSpec, CheckpointSpec, WeightSyncSpec
from rljob_api.workercfg import TrainerWorkerConfig
from rljob_workers.trainer import checkpoint
from rljob_workers.trainer.grpo import token_logprobs
from rljob_workers.trainer.policy import PolicyTrainer, TrainSample, collate

from tiny_models import char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def config(model_dir: Path, **algorithm: object) -> TrainerWorkerConfig:
    algo = AlgorithmSpec.model_validate({"learningRate": 1e-2, "promptsPerStep": 2, **algorithm})
    return TrainerWorkerConfig(
        model_path=str(model_dir),
        dtype="float32",
        algorithm=algo,
        temperature=1.0,
        strategy="ddp",
        world_size=1,
        gpus_per_node=0,
        micro_batch_size=2,
        gradient_checkpointing=False,
        checkpoint=CheckpointSpec(),
        weight_sync=WeightSyncSpec(),
    )


def samples_for(trainer: PolicyTrainer) -> list[TrainSample]:
    """Two completions of one prompt, with their true behaviour log-probs; the first is rewarded."""
    prompt = [1, 10, 11, 12]
    completions = [[13, 14, 2], [15, 16, 17, 2]]
    out = []
    for advantage, completion in zip((1.0, -1.0), completions, strict=True):
        sample = TrainSample(prompt, completion, [0.0] * len(completion), advantage)
        sample.behaviour_logprobs = sequence_logprobs(trainer, sample).tolist()
        out.append(sample)
    return out


def sequence_logprobs(trainer: PolicyTrainer, sample: TrainSample) -> torch.Tensor:
    batch = collate([sample], trainer.pad_id, torch.device("cpu"))
    with torch.no_grad():
        logits = trainer.policy(input_ids=batch["input_ids"]).logits
    per_token = token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])
    return per_token[batch["mask"] == 1]


def test_collate_aligns_completion_tokens_with_next_token_logits():
    samples = [TrainSample([5, 6], [7, 8, 2], [-1.0, -2.0, -3.0], 0.5), TrainSample([5], [9], [-4.0], -0.5)]
    batch = collate(samples, pad_id=0, device=torch.device("cpu"))
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 2], [5, 9, 0, 0, 0]]
    assert batch["mask"].tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]
    assert batch["behaviour"].tolist() == [[0, -1, -2, -3], [-4, 0, 0, 0]]
    # The target at each masked position is the completion token.
    targets = batch["input_ids"][:, 1:][batch["mask"] == 1].tolist()
    assert targets == [7, 8, 2, 9]


def test_step_raises_the_rewarded_and_lowers_the_punished_completion(model_dir):
    trainer = PolicyTrainer(config(model_dir), torch.device("cpu"))
    good, bad = samples_for(trainer)
    before = [sequence_logprobs(trainer, s).sum() for s in (good, bad)]
    metrics = trainer.train_step([good, bad], total_samples=2, total_tokens=7)
    after = [sequence_logprobs(trainer, s).sum() for s in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy: behaviour = current policy
    assert metrics["grad_norm"] > 0


def _ddp_rank(rank: int, model_dir: str, port: int, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    trainer = PolicyTrainer(config(Path(model_dir)), torch.device("cpu"), world_size=2)
    samples = samples_for(trainer)
    trainer.train_step(samples[rank::2], total_samples=2, total_tokens=7)
    if rank == 0:
        torch.save(dict(trainer.named_weights()), out)
    torch.distributed.destroy_process_group()


def test_ddp_over_two_ranks_equals_one_process(model_dir, tmp_path):
    single = PolicyTrainer(config(model_dir), torch.device("cpu"))
    single.train_step(samples_for(single), total_samples=2, total_tokens=7)
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "ddp.pt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_ddp_rank, args=(r, str(model_dir), port, str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ddp = torch.load(out, weights_only=True)
    for name, param in single.named_weights():
        torch.testing.assert_close(ddp[name], param, rtol=1e-4, atol=1e-6)


def test_checkpoint_round_trip_and_latest_pointer(model_dir, tmp_path):
    trainer = PolicyTrainer(config(model_dir), torch.device("cpu"))
    trainer.train_step(samples_for(trainer), total_samples=2, total_tokens=7)
    for step in (2, 4, 6):
        directory = checkpoint.step_dir(tmp_path, step)
        directory.mkdir()
        trainer.save(directory, dict(trainer.named_weights()))
        checkpoint.commit(tmp_path, directory, {"step": step, "policy_version": step}, keep=2)
    latest = checkpoint.latest(tmp_path)
    assert latest == checkpoint.step_dir(tmp_path, 6)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000004", "step-000006"]
    assert json.loads((latest / "state.json").read_text())["policy_version"] == 6
    restored = PolicyTrainer(config(model_dir), torch.device("cpu"), resume_from=str(latest / "model"))
    restored.load_optimizer(latest)
    for (name, a), (_, b) in zip(trainer.named_weights(), restored.named_weights(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    assert restored.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()


def test_keep_never_deletes_the_checkpoint_latest_names(tmp_path):
    # Newer-named folders left by an earlier run in the same place: pruning by name alone deleted
    # the checkpoint just committed, and `latest` named a folder that was gone.
    for step in (6, 8):
        checkpoint.step_dir(tmp_path, step).mkdir()
    directory = checkpoint.step_dir(tmp_path, 4)
    directory.mkdir()
    checkpoint.commit(tmp_path, directory, {"step": 4}, keep=2)
    assert checkpoint.latest(tmp_path) == directory
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000004", "step-000008"]


def test_latest_ignores_a_checkpoint_that_was_never_committed(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    (tmp_path / "step-000002").mkdir()  # killed while saving: no state.json, no pointer
    assert checkpoint.latest(tmp_path) is None
