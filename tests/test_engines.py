"""The inference engines: the hf engine's samples and log-probs, safe-point weight switches, the version gate,
and the heavy engines where installed."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from rollout_helpers import PausedEngine, collect, perturbed, recompute, reference, rollout_config, run
from transformers import PreTrainedTokenizerFast

from rljob_workers.engines.base import (
    FinishedSample,
    FinishReason,
    PromptInput,
    SamplingConfig,
    VersionGate,
    cut_at_stop,
)
from rljob_workers.engines.hf import HFEngine

from tiny_models import EOS, char_llama


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~80K-parameter Llama with a character tokenizer; EOS is made likely (~5% a step) so samples end both ways."""
    return char_llama(tmp_path_factory.mktemp("tiny-llama"))


def test_logprobs_equal_a_forward_pass_of_the_same_model(model_dir: Path) -> None:
    """The key contract: behaviour log-probs are log_softmax(raw_logits / T), not the top-p/top-k-processed ones."""
    sampling = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16, seed=11)

    async def body() -> list[FinishedSample]:
        engine = HFEngine(str(model_dir))
        ids = [engine.tokenize(t) for t in ("12+3=", "7*8=", "what is 123*456 ?")]  # lengths differ: left padding
        try:
            return await collect(engine, [PromptInput(f"p{i}", tuple(x), n=2) for i, x in enumerate(ids)], sampling)
        finally:
            await engine.close()

    samples = run(body())
    model = reference(model_dir)
    assert len(samples) == 6
    for sample in samples:
        assert len(sample.logprobs) == len(sample.token_ids) > 0
        torch.testing.assert_close(torch.tensor(sample.logprobs), recompute(model, sample, 0.7), atol=1e-4, rtol=1e-4)


def test_n_samples_per_prompt_with_their_indices(model_dir: Path) -> None:
    async def body() -> list[FinishedSample]:
        engine = HFEngine(str(model_dir), seed=1)
        try:
            prompts = [PromptInput("a", (5, 6, 7), n=3, first_index=4), PromptInput("b", (8, 9), n=2)]
            return await collect(engine, prompts, SamplingConfig(max_new_tokens=4))
        finally:
            await engine.close()

    samples = run(body())
    assert sorted(s.sample_id for s in samples) == ["a/4", "a/5", "a/6", "b/0", "b/1"]
    assert {s.prompt_token_ids for s in samples if s.prompt_id == "a"} == {(5, 6, 7)}
    assert all(s.policy_version == 0 for s in samples)


def test_eos_ends_a_sample_and_the_padding_after_it_is_cut(model_dir: Path) -> None:
    async def body() -> list[FinishedSample]:
        engine = HFEngine(str(model_dir), seed=5)
        try:
            return await collect(engine, [PromptInput("p", (5, 6, 7), n=16)], SamplingConfig(max_new_tokens=24))
        finally:
            await engine.close()

    samples = run(body())
    stopped = [s for s in samples if s.finish_reason is FinishReason.STOP]
    capped = [s for s in samples if s.finish_reason is FinishReason.LENGTH]
    assert stopped and capped, "the fixture's EOS rate should end some samples early and not others"
    for sample in stopped:
        assert sample.token_ids[-1] == EOS and EOS not in sample.token_ids[:-1]
        assert len(sample.logprobs) == len(sample.token_ids) <= 24
    for sample in capped:
        assert len(sample.token_ids) == 24 and EOS not in sample.token_ids


def test_stop_strings_cut_the_completion() -> None:
    def decode(ids: Sequence[int]) -> str:
        return "".join("abcdef"[i] for i in ids)

    tokens = [0, 1, 2, 3, 4, 5]
    assert cut_at_stop(tokens, decode, ["cd", "f"]) == ([0, 1, 2, 3], "ab", True)
    assert cut_at_stop(tokens, decode, ["x"]) == (tokens, "abcdef", False)
    assert cut_at_stop(tokens, decode, ["b", "a"]) == ([0], "", True)


def test_engine_stops_at_stop_strings(model_dir: Path) -> None:
    """Seeded: the same request with a stop string taken from its own completion stops there."""

    async def body() -> tuple[FinishedSample, FinishedSample, str]:
        engine = HFEngine(str(model_dir))
        prompt = [PromptInput("p", (5, 6), n=8)]
        try:
            free = max(
                await collect(engine, prompt, SamplingConfig(max_new_tokens=24, seed=9)), key=lambda s: len(s.text)
            )
            stop = free.text[len(free.text) // 2 :][:2]
            again = await collect(engine, prompt, SamplingConfig(max_new_tokens=24, seed=9, stop=(stop,)))
            return free, next(s for s in again if s.index == free.index), stop
        finally:
            await engine.close()

    free, cut, stop = run(body())
    assert len(free.text) >= 4, "the seeded completion should be long enough to take a stop string from"
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == free.text[: free.text.index(stop)]
    assert free.token_ids[: len(cut.token_ids)] == cut.token_ids  # the token completing the stop string is kept
    assert stop in engine_text(model_dir, cut.token_ids) and cut.logprobs == free.logprobs[: len(cut.token_ids)]


def engine_text(model_dir: Path, tokens: tuple[int, ...]) -> str:
    return str(PreTrainedTokenizerFast.from_pretrained(model_dir).decode(list(tokens), skip_special_tokens=True))


def test_concurrent_generate_calls_share_a_batch(model_dir: Path) -> None:
    async def body() -> tuple[list[int], list[int]]:
        engine = HFEngine(str(model_dir), max_batch_sequences=4)
        sampling = SamplingConfig(max_new_tokens=3)
        try:
            calls = [collect(engine, [PromptInput(f"p{i}", (5 + i, 6), n=1)], sampling) for i in range(3)]
            await asyncio.gather(*calls)
            together = list(engine.batch_sizes)
            engine.batch_sizes.clear()
            await asyncio.gather(collect(engine, [PromptInput("q", (5,), n=6)], sampling))
            return together, list(engine.batch_sizes)
        finally:
            await engine.close()

    together, split = run(body())
    assert together == [3]  # three RPCs, one model.generate
    assert split == [4, 2]  # capped at max_batch_sequences


def test_staged_weights_switch_between_batches(model_dir: Path) -> None:
    """A batch in flight finishes with the old version; the next batch runs on, and reports, the new one."""
    new_state = perturbed(model_dir)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)

    async def body() -> tuple[list[FinishedSample], int, list[FinishedSample]]:
        engine = PausedEngine(str(model_dir))
        try:
            first = asyncio.create_task(collect(engine, [PromptInput("old", (5, 6, 7), n=2)], sampling))
            assert await asyncio.to_thread(engine.started.wait, 10)
            await engine.stage_weights(1, new_state)
            version_while_running = engine.policy_version
            engine.release.set()
            old = await first
            new = await collect(engine, [PromptInput("new", (5, 6, 7), n=2)], sampling)
            return old, version_while_running, new
        finally:
            await engine.close()

    old, version_while_running, new = run(body())
    assert version_while_running == 0
    assert {s.policy_version for s in old} == {0} and {s.policy_version for s in new} == {1}
    old_model, new_model = reference(model_dir), reference(model_dir, new_state)
    for sample in old:
        torch.testing.assert_close(torch.tensor(sample.logprobs), recompute(old_model, sample, 1.0), atol=1e-4, rtol=0)
    for sample in new:
        torch.testing.assert_close(torch.tensor(sample.logprobs), recompute(new_model, sample, 1.0), atol=1e-4, rtol=0)


def test_staging_refuses_unknown_or_misshapen_weights(model_dir: Path) -> None:
    async def body() -> None:
        engine = HFEngine(str(model_dir))
        try:
            with pytest.raises(ValueError, match="not a parameter"):
                await engine.stage_weights(1, {"nope.weight": torch.zeros(2)})
            with pytest.raises(ValueError, match=r"lm_head\.weight.*shape"):
                await engine.stage_weights(1, {"lm_head.weight": torch.zeros(2, 2)})
            assert engine.policy_version == 0
        finally:
            await engine.close()

    run(body())


def test_version_gate_switches_only_when_no_request_runs() -> None:
    async def body() -> None:
        gate = VersionGate()
        loaded: list[int] = []

        async def load() -> None:
            loaded.append(gate.version)

        async with gate.request() as version:
            gate.stage(1, load)
            await asyncio.sleep(0.01)
            assert version == 0 and gate.version == 0 and loaded == []
            later = asyncio.create_task(gate.request().__aenter__())
            await asyncio.sleep(0.01)
            assert not later.done()  # held back while the switch waits
        assert await later == 1 and loaded == [0]

    run(body())


def test_version_gate_serves_the_version_its_load_made_current() -> None:
    """An engine with one slot for received weights: version 2 replaced 1 there before 1's switch loaded, so
    that switch loads 2 and says so; 2's own switch finds nothing new. Every request after runs as 2."""

    async def body() -> None:
        gate = VersionGate()
        slot: list[int] = []
        serving_at_load: list[int] = []

        async def load() -> int | None:
            serving_at_load.append(gate.version)
            return slot.pop() if slot else gate.version

        async with gate.request():
            slot.append(1)
            gate.stage(1, load)
            await asyncio.sleep(0.01)  # 1's switch now waits for the request to end
            slot[:] = [2]
            gate.stage(2, load)
        async with gate.request() as version:
            assert version == 2 and gate.version == 2
        await asyncio.sleep(0.01)
        assert serving_at_load == [0, 2] and gate.version == 2 and not slot  # 2 served as 2 from its load on

    run(body())


# --- the gRPC server ------------------------------------------------------------------------


def test_heavy_engine_modules_import_without_their_packages() -> None:
    """Importing the adapters imports neither engine, and each adapter has every Engine member."""
    from rljob_workers.engines.sglang import SGLangEngine
    from rljob_workers.engines.vllm import VLLMEngine

    assert "vllm" not in sys.modules and "sglang" not in sys.modules
    for cls in (HFEngine, VLLMEngine, SGLangEngine):
        for member in ("name", "policy_version", "eos_token_id", "weights_device", "tokenize"):
            assert hasattr(cls, member), (cls.__name__, member)
        assert inspect.isasyncgenfunction(cls.generate)
        assert inspect.iscoroutinefunction(cls.stage_weights) and inspect.iscoroutinefunction(cls.close)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_heavy_engine_logprobs_match_the_forward_pass(model_dir: Path, engine: str) -> None:
    pytest.importorskip(engine, reason=f"{engine} is not installed (the optional extra rljob[{engine}])")
    if not torch.cuda.is_available():
        pytest.skip(f"{engine} needs a CUDA device")
    from rljob_workers.engines import make_engine

    config = rollout_config(model_dir).model_copy(update={"engine": engine, "gpus": 1, "dtype": "float32"})

    async def body() -> list[FinishedSample]:
        replica = await asyncio.to_thread(make_engine, config)
        try:
            return await collect(replica, [PromptInput("p", (5, 6, 7), n=4)], SamplingConfig(max_new_tokens=8))
        finally:
            await replica.close()

    samples = run(body())
    model = reference(model_dir)
    assert sorted(s.index for s in samples) == [0, 1, 2, 3]
    for sample in samples:
        torch.testing.assert_close(torch.tensor(sample.logprobs), recompute(model, sample, 1.0), atol=2e-3, rtol=0)
