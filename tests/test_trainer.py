"""The trainer rank: a GRPO step moves log-probs the right way, DDP equals one process (metrics and
unequal shards too), checkpoints round-trip."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gloo_ranks import end_rank, join_group, spawn_two_ranks

from rljob_api import AlgorithmSpec, CheckpointSpec, WeightSyncSpec, resolve_algorithm
from rljob_api.workercfg import TrainerWorkerConfig
from rljob_workers.trainer import checkpoint
from rljob_workers.trainer.grpo import token_logprobs
from rljob_workers.trainer.microbatch import collate
from rljob_workers.trainer.policy import PolicyTrainer, largest_part_sizes
from rljob_workers.trainer.samples import TrainSample, combine_rank_metrics

from tiny_models import char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def config(model_dir: Path, micro_batch_size: int = 2, **algorithm: object) -> TrainerWorkerConfig:
    spec = AlgorithmSpec.model_validate({"learningRate": 1e-2, "promptsPerStep": 2, **algorithm})
    algo = resolve_algorithm(spec, max_new_tokens=8)
    return TrainerWorkerConfig(
        model_path=str(model_dir),
        dtype="float32",
        algorithm=algo,
        temperature=1.0,
        strategy="ddp",
        world_size=1,
        gpus_per_node=0,
        micro_batch_size=micro_batch_size,
        gradient_checkpointing=False,
        checkpoint=CheckpointSpec(),
        weight_sync=WeightSyncSpec(),
    )


COMPLETIONS = [[13, 14, 2], [15, 16, 17, 2], [18, 19, 20, 21, 2], [22, 2], [23, 24, 25, 2]]
ADVANTAGES = [1.0, -1.0, 0.5, -0.5, 1.5]


def samples_for(trainer: PolicyTrainer, count: int = 2, off_policy: float = 0.0) -> list[TrainSample]:
    """`count` completions of one prompt, the first rewarded, the second punished; their behaviour
    log-probs are the policy's own, each token shifted by +-`off_policy` in turn (so some ratios clip)."""
    prompt = [1, 10, 11, 12]
    out = []
    for advantage, completion in zip(ADVANTAGES[:count], COMPLETIONS[:count], strict=True):
        sample = TrainSample(prompt, completion, [0.0] * len(completion), advantage)
        own = sequence_logprobs(trainer, sample).tolist()
        sample.behaviour_logprobs = [lp + off_policy * (-1) ** i for i, lp in enumerate(own)]
        out.append(sample)
    return out


def completion_tokens(samples: list[TrainSample]) -> int:
    return sum(len(s.token_ids) for s in samples)


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


RANKS_TIMEOUT_SECONDS = 150.0


@contextlib.contextmanager
def counting_gathers() -> Iterator[list[int]]:
    """The elements of each sharded (FSDP) parameter gathered in the block: DTensor.redistribute,
    through which torch's full state dict gathers them, is wrapped to count them."""
    from torch.distributed.tensor import DTensor

    gathered: list[int] = []
    redistribute = DTensor.redistribute

    def counted(self: DTensor, *args: Any, **kwargs: Any) -> DTensor:
        gathered.append(self.numel())
        return redistribute(self, *args, **kwargs)

    DTensor.redistribute = counted  # type: ignore[method-assign]
    try:
        yield gathered
    finally:
        DTensor.redistribute = redistribute  # type: ignore[method-assign]


def _rank_main(
    rank: int,
    port: int,
    model_dir: str,
    out: str,
    count: int,
    micro: int,
    off_policy: float,
    strategy: str,
    freeze: tuple[str, ...] = (),
) -> None:
    join_group(rank, port)
    cfg = config(Path(model_dir), micro).model_copy(update={"strategy": strategy, "freeze": list(freeze)})
    trainer = with_plain_sgd(PolicyTrainer(cfg, torch.device("cpu"), world_size=2))
    samples = samples_for(trainer, count, off_policy)
    metrics = trainer.train_step(samples[rank::2], total_samples=count, total_tokens=completion_tokens(samples))
    with counting_gathers() as gathered:
        weights = dict(trainer.named_weights())
    torch.save({"metrics": metrics, "weights": weights, "gathered": sum(gathered)}, f"{out}/rank{rank}.pt")
    end_rank()  # ranks live on after a step, as Ray actors do: one short of collectives waits at the barrier


def run_two_ranks(
    model_dir: Path,
    out: Path,
    count: int,
    micro: int = 2,
    off_policy: float = 0.0,
    strategy: str = "ddp",
    freeze: tuple[str, ...] = (),
) -> list[dict]:
    """One train step of `count` samples sharded over 2 gloo ranks (spawned processes): each rank's
    metrics and weights. A rank still running after the timeout fails the test rather than blocking it."""
    out.mkdir(parents=True, exist_ok=True)
    args = (str(model_dir), str(out), count, micro, off_policy, strategy, freeze)
    spawn_two_ranks(_rank_main, args, RANKS_TIMEOUT_SECONDS)
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


def with_plain_sgd(trainer: PolicyTrainer) -> PolicyTrainer:
    """The trainer with SGD in place of AdamW, for comparing weights after a step. Adam's first step
    moves a weight by lr * g / (|g| + 1e-8): a gradient near zero (4e-8 in a down_proj) moves it by
    anything up to lr, and its rounding, which differs with DDP's summation order and the CPU, flips
    that (CI: off by more than 1e-3). SGD moves each weight by lr * g, so only g's rounding shows."""
    trainer.optimizer = torch.optim.SGD(trainer.model.parameters(), lr=1.0)
    return trainer


def assert_same_weights(ranks: list[dict], single: PolicyTrainer) -> None:
    # Both took one plain SGD step of lr 1: a gradient's rounding moves a weight by ~1e-9; a missed,
    # unpaired or wrongly averaged step is off by about a gradient (median 3e-4 to 6e-3 here).
    for name, param in single.named_weights():
        for rank, result in enumerate(ranks):
            torch.testing.assert_close(result["weights"][name], param, rtol=1e-5, atol=1e-5, msg=f"rank {rank}: {name}")


def test_ddp_over_two_ranks_equals_one_process(model_dir, tmp_path):
    single = with_plain_sgd(PolicyTrainer(config(model_dir), torch.device("cpu")))
    single.train_step(samples_for(single), total_samples=2, total_tokens=7)
    assert_same_weights(run_two_ranks(model_dir, tmp_path, count=2), single)


def test_fsdp_over_two_ranks_equals_ddp_and_one_process(model_dir, tmp_path):
    # Sharded parameters (fully_shard per decoder layer and the whole model), reduce-scattered
    # gradients, the full weights gathered for publishing: the same step as DDP and one process.
    single = with_plain_sgd(PolicyTrainer(config(model_dir, micro_batch_size=1), torch.device("cpu")))
    samples = samples_for(single, count=4, off_policy=0.3)
    expected = single.train_step(samples, total_samples=4, total_tokens=completion_tokens(samples))
    fsdp = run_two_ranks(model_dir, tmp_path / "fsdp", count=4, micro=1, off_policy=0.3, strategy="fsdp")
    ddp = run_two_ranks(model_dir, tmp_path / "ddp", count=4, micro=1, off_policy=0.3)
    # the full weights are gathered onto rank 0, which publishes and checkpoints them
    assert len(fsdp[0]["weights"]) == len(dict(single.named_weights()))
    assert_same_weights(fsdp[:1], single)
    assert_same_weights(ddp[:1], single)
    for name, weight in ddp[0]["weights"].items():
        torch.testing.assert_close(fsdp[0]["weights"][name], weight, rtol=1e-5, atol=1e-5, msg=name)
    for result in (fsdp, ddp):
        assert combine_rank_metrics([r["metrics"] for r in result]) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_metrics_combined_over_two_ranks_equal_one_process(model_dir, tmp_path):
    # Each rank weights its micro-batches by the whole batch's tokens, so rank 0's figures alone
    # were about half the truth.
    single = with_plain_sgd(PolicyTrainer(config(model_dir, micro_batch_size=1), torch.device("cpu")))
    samples = samples_for(single, count=4, off_policy=0.3)
    expected = single.train_step(samples, total_samples=4, total_tokens=completion_tokens(samples))
    ranks = run_two_ranks(model_dir, tmp_path, count=4, micro=1, off_policy=0.3)
    combined = combine_rank_metrics([r["metrics"] for r in ranks])
    assert 0 < expected["clip_fraction"] < 1 and expected["ratio_mean"] != pytest.approx(1.0)
    assert combined == pytest.approx(expected, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("count", [5, 1], ids=["uneven-shards", "a-rank-without-samples"])
def test_unequal_shards_finish_and_equal_one_process(model_dir, tmp_path, count):
    # Ranks with fewer samples ran fewer micro-batches, so their DDP all-reduces did not pair up.
    single = with_plain_sgd(PolicyTrainer(config(model_dir, micro_batch_size=1), torch.device("cpu")))
    samples = samples_for(single, count)
    expected = single.train_step(samples, total_samples=count, total_tokens=completion_tokens(samples))
    ranks = run_two_ranks(model_dir, tmp_path, count=count, micro=1)
    assert_same_weights(ranks, single)
    assert combine_rank_metrics([r["metrics"] for r in ranks]) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_every_rank_runs_as_many_micro_batches_as_the_largest_share():
    # Shards samples[rank::2], mini-batches shard[m::minis]: rank 0's share is the largest.
    assert largest_part_sizes(5, world_size=2, mini_batches=1) == [3]
    assert largest_part_sizes(5, world_size=2, mini_batches=2) == [2, 1]
    assert largest_part_sizes(1, world_size=2, mini_batches=2) == [1, 0]
    assert largest_part_sizes(8, world_size=4, mini_batches=3) == [1, 1, 0]


def test_a_share_larger_than_the_batch_allows_is_refused(model_dir):
    # Its extra micro-batches would have no partner on the other ranks: a hang, not an error.
    trainer = PolicyTrainer(config(model_dir), torch.device("cpu"))
    with pytest.raises(ValueError, match="2 samples on one rank"):
        trainer.train_step(samples_for(trainer), total_samples=1, total_tokens=7)


def test_checkpoint_round_trip_and_latest_pointer(model_dir, tmp_path):
    trainer = PolicyTrainer(config(model_dir), torch.device("cpu"))
    trainer.train_step(samples_for(trainer), total_samples=2, total_tokens=7)
    for step in (2, 4, 6):
        staging = checkpoint.begin(tmp_path, step)
        assert staging is not None
        trainer.save(staging, dict(trainer.named_weights()))
        checkpoint.commit(tmp_path, staging, step, {"step": step, "policy_version": step}, keep=2)
    assert checkpoint.begin(tmp_path, 6) is None, "a committed step is never written again"
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
        staging = checkpoint.begin(tmp_path, step)
        assert staging is not None
        checkpoint.commit(tmp_path, staging, step, {"step": step}, keep=3)
    checkpoint.step_dir(tmp_path, 10).mkdir()  # and an incomplete one, which never counts toward keep
    staging = checkpoint.begin(tmp_path, 4)
    assert staging is not None
    directory = checkpoint.commit(tmp_path, staging, 4, {"step": 4}, keep=2)
    assert checkpoint.latest(tmp_path) == directory == checkpoint.step_dir(tmp_path, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-000004", "step-000008"]


def test_latest_ignores_a_checkpoint_that_was_never_committed(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    (tmp_path / "step-000002").mkdir()  # killed while saving: no state.json, no pointer
    assert checkpoint.latest(tmp_path) is None
