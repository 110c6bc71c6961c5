"""The SGLang adapter against a stand-in of the SGLang calls it makes, since SGLang itself cannot run here
(no CPU build; the GPU machine cannot install it). What this shows is only that the adapter calls SGLang
as SGLang documents: generation with log-probs, weights by CUDA IPC handle per tensor-parallel rank with
the KV cache flushed, and a switch at the safe point (drain) or paused in place (inflight)."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_helpers import collect, rollout_config, run

from rljob_workers.engines.base import PromptInput, SamplingConfig
from rljob_workers.engines.sglang import SGLangEngine

from tiny_models import char_llama


class FakeTokenizerManager:
    def __init__(self, calls: list[Any]) -> None:
        self.calls = calls

    async def pause_generation(self) -> None:
        self.calls.append("pause_generation")

    async def continue_generation(self) -> None:
        self.calls.append("continue_generation")

    async def update_weights_from_tensor(self, request: Any, raw: Any) -> tuple[bool, str]:
        self.calls.append(("update_weights_from_tensor", len(request.serialized_named_tensors), request.flush_cache))
        return True, ""


class FakeSGLang:
    """sglang.Engine as the adapter uses it: a sample takes `steps` of 10 ms, logging when it starts and ends."""

    def __init__(self, steps: int = 5) -> None:
        self.calls: list[Any] = []
        self.tokenizer_manager = FakeTokenizerManager(self.calls)
        self.steps = steps

    async def async_generate(self, input_ids: list[int], sampling_params: dict, return_logprob: bool) -> dict:
        self.calls.append(("generate", tuple(input_ids), sampling_params["top_k"], return_logprob))
        await asyncio.sleep(0.01 * self.steps)
        self.calls.append(("generated", tuple(input_ids)))
        return {
            "text": "ab",
            "meta_info": {
                "output_token_logprobs": [(-0.5, 7, "a"), (-1.25, 8, "b")],
                "finish_reason": {"type": "length"},
            },
        }

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture
def sglang_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two SGLang names the adapter imports to hand weights over, stood in for."""

    class Request:
        def __init__(self, serialized_named_tensors: list, load_format: Any, flush_cache: bool) -> None:
            self.serialized_named_tensors, self.flush_cache = serialized_named_tensors, flush_cache

    io_struct = types.SimpleNamespace(UpdateWeightsFromTensorReqInput=Request)
    utils = types.SimpleNamespace(MultiprocessingSerializer=types.SimpleNamespace(serialize=lambda named: list(named)))
    for name, module in {
        "sglang": types.SimpleNamespace(),
        "sglang.srt": types.SimpleNamespace(),
        "sglang.srt.managers": types.SimpleNamespace(),
        "sglang.srt.managers.io_struct": io_struct,
        "sglang.srt.utils": utils,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return char_llama(tmp_path_factory.mktemp("sglang-tokenizer"))


def engine_of(model_dir: Path, fake: FakeSGLang, update: str) -> SGLangEngine:
    config = rollout_config(model_dir).model_copy(
        update={"engine": "sglang", "gpus": 2, "tensor_parallel_size": 2, "weight_update": update}
    )
    return SGLangEngine(config, engine=fake)


def test_samples_carry_sglang_s_tokens_and_logprobs(model_dir: Path, sglang_modules: None) -> None:
    fake = FakeSGLang()

    async def body() -> list:
        return await collect(engine_of(model_dir, fake, "drain"), [PromptInput("p", (5, 6), n=2)], SamplingConfig())

    samples = run(body())
    assert [(s.token_ids, s.logprobs, s.policy_version, s.newest_version) for s in samples] == [
        ((7, 8), (-0.5, -1.25), 0, 0)
    ] * 2
    assert ("generate", (5, 6), -1, True) in fake.calls  # top-k 0 is SGLang's -1, log-probs asked for


def test_drain_loads_once_the_running_sample_ends(model_dir: Path, sglang_modules: None) -> None:
    fake = FakeSGLang()

    async def body() -> list:
        engine = engine_of(model_dir, fake, "drain")
        running = asyncio.ensure_future(collect(engine, [PromptInput("p", (5, 6))], SamplingConfig()))
        await asyncio.sleep(0.02)
        await engine.stage_weights(1, {"w": torch.zeros(2)})
        samples = await running
        await asyncio.sleep(0.05)
        assert engine.policy_version == 1
        return samples

    [sample] = run(body())
    assert (sample.policy_version, sample.newest_version) == (0, 0)
    load = ("update_weights_from_tensor", 2, True)  # one IPC handle list per tensor-parallel rank, KV flushed
    assert fake.calls.index(load) > fake.calls.index(("generated", (5, 6)))


def test_inflight_pauses_loads_and_continues_while_the_sample_runs(model_dir: Path, sglang_modules: None) -> None:
    fake = FakeSGLang(steps=10)

    async def body() -> list:
        engine = engine_of(model_dir, fake, "inflight")
        running = asyncio.ensure_future(collect(engine, [PromptInput("p", (5, 6))], SamplingConfig()))
        await asyncio.sleep(0.02)
        await engine.stage_weights(1, {"w": torch.zeros(2)})
        return await running

    [sample] = run(body())
    assert (sample.policy_version, sample.newest_version) == (0, 1)
    order = [c if isinstance(c, str) else c[0] for c in fake.calls]
    assert order == ["generate", "pause_generation", "update_weights_from_tensor", "continue_generation", "generated"]
