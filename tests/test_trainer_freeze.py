"""spec.trainer.freeze: frozen parameters keep the values the model folder gave them, and a weight sync
carries only what training changed. Real parts: the trainer, the checkpoint engine's publisher and its
WeightService over gRPC on loopback, and the hf engine loading what a replica pulls."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from test_trainer import assert_same_weights, completion_tokens, config, run_two_ranks, samples_for, with_plain_sgd

from rljob_workers.common.grpc_server import start_server
from rljob_workers.engines.hf import HFEngine
from rljob_workers.trainer.policy import PolicyTrainer
from rljob_workers.weights import WeightPublisher, WeightServicer, as_service, pull_weights

from tiny_models import char_llama

FROZEN = ["model.embed_tokens.*", "model.layers.0.*"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("policy"))


def _trained(model_dir: Path, freeze: list[str]) -> tuple[PolicyTrainer, dict[str, torch.Tensor]]:
    """A trainer after one step with `freeze`, and its parameters before that step."""
    trainer = PolicyTrainer(config(model_dir).model_copy(update={"freeze": freeze}), torch.device("cpu"))
    before = {name: weight.clone() for name, weight in trainer.master_weights()}
    trainer.train_step(samples_for(trainer), total_samples=2, total_tokens=7)
    return trainer, before


def test_frozen_parameters_keep_their_loaded_values_and_the_rest_trains(model_dir):
    trainer, before = _trained(model_dir, FROZEN)
    after = dict(trainer.master_weights())
    frozen = {n for n in after if n.startswith(("model.embed_tokens.", "model.layers.0."))}
    assert frozen and frozen < set(after)
    for name in frozen:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0, msg=name)
    assert all(not torch.equal(after[n], before[n]) for n in set(after) - frozen if "layers.1.self_attn" in n)
    assert set(after) == set(before)  # a checkpoint still keeps every parameter


def test_a_sync_carries_only_what_training_changed_and_a_replica_ends_up_equal(model_dir):
    """The trainer publishes; a replica that loaded the model folder pulls over gRPC and stages what it
    got: every weight then equals the trainer's, frozen ones included, for a fraction of the bytes."""
    full_trainer, _ = _trained(model_dir, [])
    trainer, _ = _trained(model_dir, FROZEN)
    full, partial = WeightPublisher(), WeightPublisher()
    full.publish(1, full_trainer.named_weights())
    partial.publish(1, trainer.named_weights())
    full_bytes = sum(plan.nbytes for plan in full.plan)
    sent_bytes = sum(plan.nbytes for plan in partial.plan)
    trainable = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.policy.parameters())
    print(f"one sync: {sent_bytes} bytes with {FROZEN} frozen, {full_bytes} without ({sent_bytes / full_bytes:.2f})")
    assert sent_bytes < 0.9 * full_bytes
    assert sent_bytes / full_bytes == pytest.approx(trainable / total, abs=0.01)

    async def replica() -> dict[str, torch.Tensor]:
        server = await start_server([as_service(WeightServicer(partial))])
        engine = HFEngine(str(model_dir), dtype="float32")
        try:
            version, tensors = await pull_weights(f"127.0.0.1:{server.port}", min_version=1)
            await engine.stage_weights(version, tensors)
            async with asyncio.timeout(30):  # an idle engine reaches its safe point at once
                while engine.policy_version != version:
                    await asyncio.sleep(0.01)
            return {name: t.clone() for name, t in engine.model.state_dict().items()}
        finally:
            await engine.close()
            await server.stop(None)

    served = asyncio.run(replica())
    for name, weight in trainer.master_weights():
        torch.testing.assert_close(served[name], weight, rtol=0, atol=0, msg=name)


def test_fsdp_over_two_ranks_trains_the_unfrozen_weights_as_one_process_does(model_dir, tmp_path):
    # fully_shard over parameters some of which need no gradient; the gathered weights leave them out
    cfg = config(model_dir, micro_batch_size=1).model_copy(update={"freeze": FROZEN})
    single = with_plain_sgd(PolicyTrainer(cfg, torch.device("cpu")))
    samples = samples_for(single, count=4, off_policy=0.3)
    single.train_step(samples, total_samples=4, total_tokens=completion_tokens(samples))
    fsdp = run_two_ranks(model_dir, tmp_path, count=4, micro=1, off_policy=0.3, strategy="fsdp", freeze=tuple(FROZEN))
    assert set(fsdp[0]["weights"]) == {name for name, _ in single.named_weights()}
    assert_same_weights(fsdp[:1], single)
    # Only what a sync sends is gathered: the frozen shards stay where they are.
    trained = sum(weight.numel() for _, weight in single.named_weights())
    assert [rank["gathered"] for rank in fsdp] == [trained, trained]


@pytest.mark.parametrize(
    ("freeze", "message"),
    [
        (["model.layers.0.*", "model.layer.1.*"], r"spec\.trainer\.freeze\[1\]: 'model\.layer\.1\.\*' matches no"),
        (["*"], r"spec\.trainer\.freeze: every parameter is frozen"),
    ],
)
def test_a_pattern_that_freezes_nothing_or_everything_is_refused(model_dir, freeze, message):
    with pytest.raises(ValueError, match=message):
        PolicyTrainer(config(model_dir).model_copy(update={"freeze": freeze}), torch.device("cpu"))
