"""The vLLM engine adapter at work, run in vLLM's own runtime by tests/test_vllm.py (with runtimes/vllm.sh's
python and rljob's source folders on its path); prints one JSON object of what it measured.

    python tests/vllm_probe.py MODEL_DIR

This process plays the trainer too: it hosts the weight group's store, is its rank 0 and broadcasts with
rljob's own WeightPublisher; the engine's worker joins as rank 1. Every log-prob is compared with a
teacher-forced transformers forward of the weights the version should have.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines.base import FinishedSample, PromptInput, SamplingConfig, WeightGroupMembership
from rljob_workers.engines.vllm import VLLMEngine
from rljob_workers.weights.group import WeightGroup, host_store
from rljob_workers.weights.publisher import WeightPublisher

# Prompts longer than one KV block (16 tokens), so that the same prompt again hits vLLM's prefix cache.
PROMPTS = [PromptInput(f"p{i}", tuple(range(4 + i, 30 + i)), n=2) for i in range(3)]
SHORT = SamplingConfig(temperature=1.0, max_new_tokens=6, seed=7)
LONG = SamplingConfig(temperature=1.0, max_new_tokens=200, seed=11)
MANY = [PromptInput(p.prompt_id, p.token_ids, n=8) for p in PROMPTS]


class Policy:
    """Weights of the policy at one version, and the log-probs they give a sample (teacher-forced)."""

    def __init__(self, model_dir: str) -> None:
        self.model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def copy(self, model_dir: str) -> Policy:
        twin = Policy(model_dir)
        twin.model.load_state_dict(self.model.state_dict())
        return twin

    def weights(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, p.detach()) for name, p in self.model.named_parameters()]

    def next_version(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)

    def logprobs(self, sample: FinishedSample) -> torch.Tensor:
        ids = torch.tensor([list(sample.prompt_token_ids) + list(sample.token_ids)])
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, len(sample.prompt_token_ids) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sample.token_ids)[:, None])[:, 0]


class Trainer(Policy):
    """Rank 0 of the weight group: the policy, perturbed into each new version, and its buckets."""

    def __init__(self, model_dir: str) -> None:
        super().__init__(model_dir)
        self.publisher = WeightPublisher(64 * 1024)  # small buckets: several broadcasts a version
        self.publisher.publish(0, self.weights())  # the plan, as the trainer's first publish makes it
        self.store = host_store("127.0.0.1", 0)
        self.group: WeightGroup | None = None

    def membership(self, group_id: str, timeout: float) -> WeightGroupMembership:
        return WeightGroupMembership(group_id, "127.0.0.1", int(self.store.port), 1, 2, "gloo", timeout)

    def join(self, group_id: str, timeout: float) -> None:
        port = int(self.store.port)
        self.group = WeightGroup.create(group_id, "127.0.0.1", port, 0, 2, "gloo", timeout, store=self.store)


def gap(samples: Sequence[FinishedSample], reference: Policy) -> float:
    """Largest |engine log-prob - the reference's| over every token of `samples`."""
    return max(float((torch.tensor(s.logprobs) - reference.logprobs(s)).abs().max()) for s in samples)


async def generate(
    engine: VLLMEngine, prompts: Sequence[PromptInput], sampling: SamplingConfig
) -> list[FinishedSample]:
    return [sample async for sample in engine.generate(prompts, sampling)]


async def broadcast(engine: VLLMEngine, trainer: Trainer, version: int) -> int:
    """Publish `version` over the group while the engine receives it; the bytes the engine says it received."""
    sent = asyncio.to_thread(trainer.publisher.publish, version, trainer.weights(), trainer.group)
    received, _ = await asyncio.gather(engine.receive_broadcast(version, trainer.publisher.plan), sent)
    return received


async def under_way(engine: VLLMEngine, tokens: int = 3) -> AsyncIterator[None]:
    """A request of vLLM's own beside the adapter's (it never stops early): yields once it has `tokens`, then
    runs to its end. Requests in flight together advance a token a step, so the adapter's have theirs too."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=64, ignore_eos=True)
    told = False
    async for output in engine._engine.generate(TokensPrompt(prompt_token_ids=list(range(4, 30))), params, "sentinel"):
        if not told and len(output.outputs[0].token_ids) >= tokens:
            told = True
            yield


async def wait_for_version(engine: VLLMEngine, version: int) -> None:
    deadline = time.monotonic() + 60
    while engine.policy_version != version:
        assert time.monotonic() < deadline, f"still serving {engine.policy_version}, not {version}"
        await asyncio.sleep(0.05)


async def probe(model_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {"probe_pid": os.getpid()}
    config = RolloutWorkerConfig(
        model_path=model_dir, dtype="float32", engine="vllm", gpus=0, tensor_parallel_size=1,
        max_concurrent_prompts=64, gpu_memory_utilization=0.85, seed=0, weight_update="drain",
    )  # fmt: skip
    started = time.monotonic()
    engine = await asyncio.to_thread(VLLMEngine, config)
    out["engine_start_seconds"] = time.monotonic() - started
    trainer = Trainer(model_dir)
    try:
        out["weight_ranks"] = engine.weight_ranks
        out["gap_version_0"] = gap(await generate(engine, PROMPTS, SHORT), trainer)

        # version 1 through the group (drain): the worker receives it, loads it at the next safe point
        await asyncio.gather(
            engine.join_weight_group(trainer.membership("g1", 60)), asyncio.to_thread(trainer.join, "g1", 60)
        )
        old = trainer.copy(model_dir)
        trainer.next_version(1)
        out["bytes_sent"] = sum(plan.nbytes for plan in trainer.publisher.plan)
        out["bytes_received"] = await broadcast(engine, trainer, 1)
        await wait_for_version(engine, 1)
        again = await generate(engine, PROMPTS, SHORT)  # the same prompts: their KV was cached under version 0
        out["gap_version_1"], out["gap_to_version_0"] = gap(again, trainer), gap(again, old)
        out["versions_version_1"] = sorted({(s.policy_version, s.newest_version) for s in again})
        out["worker_counters"] = await engine.worker_counters()

        # version 2 pulled by the server process and handed over as a file (a replica that joined late)
        trainer.next_version(2)
        await engine.stage_weights(2, dict(trainer.weights()))
        out["gap_version_2"] = gap(await generate(engine, PROMPTS, SHORT), trainer)

        out.update(await update_in_flight(engine, trainer, model_dir))
        out.update(await superseded_while_draining(engine, trainer))
        out.update(await sync_that_never_comes(engine, trainer))
        out.update(await beyond_one_step(engine, trainer))
    finally:
        await engine.close()
    return out


async def update_in_flight(engine: VLLMEngine, trainer: Trainer, model_dir: str) -> dict[str, Any]:
    """Version 3 in flight: long samples running while it comes."""
    out: dict[str, Any] = {}
    engine.weight_update = "inflight"
    version_2 = trainer.copy(model_dir)
    trainer.next_version(3)
    running = asyncio.ensure_future(generate(engine, MANY, LONG))
    sentinel = under_way(engine)  # a request of the same batches: once it has tokens, so do the others
    await anext(sentinel)
    paused = time.monotonic()
    await broadcast(engine, trainer, 3)
    out["inflight_update_seconds"] = time.monotonic() - paused
    spanning = await running
    async for _ in sentinel:
        pass
    out["inflight_versions"] = sorted({(s.policy_version, s.newest_version) for s in spanning})
    out["inflight_split_gaps"] = [split_gap(s, version_2, trainer) for s in spanning]
    return out


async def superseded_while_draining(engine: VLLMEngine, trainer: Trainer) -> dict[str, Any]:
    """Under drain, versions 4 and 5 both arrive while samples run: the version served once they end is 5, with
    5's weights and under its own number (the worker holds one received version: 5 replaced 4)."""
    engine.weight_update = "drain"
    running = asyncio.ensure_future(generate(engine, MANY, LONG))
    while engine._gate._running == 0:  # the samples hold the gate: no version loads until they end
        await asyncio.sleep(0.01)
    for version in (4, 5):
        trainer.next_version(version)
        await broadcast(engine, trainer, version)
    drained = await running
    deadline = time.monotonic() + 20
    while engine.policy_version != 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    after = await generate(engine, PROMPTS, SHORT)
    return {
        "superseded_served": engine.policy_version,
        "superseded_running_versions": sorted({(s.policy_version, s.newest_version) for s in drained}),
        "superseded_versions": sorted({(s.policy_version, s.newest_version) for s in after}),
        "superseded_gap": gap(after, trainer),
    }


async def sync_that_never_comes(engine: VLLMEngine, trainer: Trainer) -> dict[str, Any]:
    """A sync whose trainer never sends fails within the group's timeout, naming nothing stuck."""
    out: dict[str, Any] = {}
    await asyncio.gather(
        engine.join_weight_group(trainer.membership("g2", 3)), asyncio.to_thread(trainer.join, "g2", 3)
    )
    stuck = time.monotonic()
    try:
        await engine.receive_broadcast(6, trainer.publisher.plan)
        out["timeout_error"] = None
    except Exception as exc:  # what reaches the rollout server (and from there the controller)
        out["timeout_error"] = f"{type(exc).__name__}: {exc}"[:300]
    out["timeout_seconds"] = time.monotonic() - stuck
    return out


async def beyond_one_step(engine: VLLMEngine, trainer: Trainer) -> dict[str, Any]:
    """A prompt longer than one engine step takes (vLLM's 2048 tokens on a CPU), sampled with a seed, as every
    rljob sample is: vLLM 0.32 on a CPU splits such a prefill over steps and then rewinds the sample's seeded
    generator, which a CPU generator cannot do (the engine died of it)."""
    vocab = int(trainer.model.config.vocab_size)
    prompt = PromptInput("long", tuple(4 + (j * 7) % (vocab - 4) for j in range(2100)), n=2)
    try:
        samples = await generate(engine, [prompt], SHORT)
    except Exception as exc:
        return {"beyond_one_step_error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"beyond_one_step_error": None, "beyond_one_step_samples": len(samples), "gap_beyond": gap(samples, trainer)}


def split_gap(sample: FinishedSample, before: Policy, after: Policy) -> float:
    """The smallest, over every split of the sample's tokens, of the largest gap of its log-probs to `before`'s
    on the tokens up to the split and to `after`'s from it on: ~0 when the version changed at one token."""
    first, second = (
        torch.tensor(sample.logprobs) - before.logprobs(sample),
        torch.tensor(sample.logprobs) - after.logprobs(sample),
    )
    n = len(sample.token_ids)
    return min(
        max([float(first[:k].abs().max()) if k else 0.0, float(second[k:].abs().max()) if k < n else 0.0])
        for k in range(n + 1)
    )


if __name__ == "__main__":
    print(json.dumps(asyncio.run(probe(sys.argv[1]))), flush=True)
