"""Poison input is a sample's problem, not the run's (#53): one 200,000-character line in the data and one
request the engine fails. The run finishes; both prompts are in `failed.jsonl` with their line and reason,
and counted in the run's status and metrics.

The real `rljob run` on a tiny GPT-2 whose learned position embeddings end at 128: the 200,000-character line
is longer than data.maxPromptTokens and never reaches the engine; a 150-character line passes that limit
(set above the model's context on purpose) and the engine itself fails on it (an IndexError in the
position embedding), three times (rollout.retries 2), before it is set aside.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import read_metrics
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO

pytestmark = pytest.mark.ray

RLJOB = str(Path(sys.executable).parent / "rljob")
HUGE, ENGINE_FAILS = "1+1=" * 50_000, "2+2=" * 37 + "?"  # 200,000 characters; 149 (> 128 positions)


def _job(tmp_path: Path, **data: object) -> tuple[Path, Path]:
    from tiny_models import char_gpt2

    model = char_gpt2(tmp_path / "model")
    rows = make_problems(30, seed=3)
    rows[:0] = [{**rows[0], "prompt": HUGE}, {**rows[1], "prompt": ENGINE_FAILS}]  # data lines 1 and 2
    write_jsonl(tmp_path / "train.jsonl", rows)
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(model)
    spec["data"] = {**spec["data"], "path": str(tmp_path / "train.jsonl"), "shuffle": False, **data}
    spec["data"].pop("eval", None)
    spec["checkpoint"] = {"dir": str(tmp_path / "ckpt"), "everySteps": 100}
    spec["algorithm"].update(groupSize=2, promptsPerStep=2, totalSteps=4)
    spec["rollout"]["sampling"]["maxNewTokens"] = 4
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, tmp_path / "out"


def test_a_huge_prompt_and_one_the_engine_fails_are_set_aside_and_the_run_finishes(tmp_path):
    job_file, out = _job(tmp_path, maxPromptTokens=4096)
    command = [RLJOB, "run", str(job_file), "--no-display", "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420)
    print(done.stdout[-2500:], done.stderr[-4000:])
    assert done.returncode == 0
    failed = [json.loads(line) for line in (out / "failed.jsonl").read_text().splitlines()]
    print(json.dumps(failed, indent=1)[:2000])
    assert [(r["line"], r["prompt_id"]) for r in failed] == [(1, "e0-0"), (2, "e0-1")]
    assert failed[0]["reason"] == "prompt of 200000 tokens is longer than data.maxPromptTokens 4096"
    assert failed[0]["prompt_chars"] == 200_000
    assert failed[1]["reason"].startswith("the engine failed 2 sample(s), 3 tries; last on rollout-0: INTERNAL")
    assert done.stderr.count("failed prompt e0-1") == 2, "tried again rollout.retries (2) times"
    lines = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert lines[-1]["counts"]["failed_prompts"] == 2
    assert "failed prompts 2" in done.stdout


def test_past_max_failed_prompts_the_run_fails_naming_them(tmp_path):
    job_file, out = _job(tmp_path, maxPromptTokens=4096)
    doc = yaml.safe_load(job_file.read_text())
    doc["spec"]["algorithm"]["maxFailedPrompts"] = 1
    job_file.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [RLJOB, "run", str(job_file), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 1, done.stderr[-3000:]
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("run failed:")]
    print(failure)
    assert "2 prompts set aside, more than algorithm.maxFailedPrompts 1" in failure and "e0-0, e0-1" in failure


def test_prompt_too_long_fail_fails_the_run_naming_the_line(tmp_path):
    job_file, out = _job(tmp_path, promptTooLong="fail")  # the limit by default: 128 positions less 4 new tokens
    done = subprocess.run(
        [RLJOB, "run", str(job_file), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 1, done.stderr[-3000:]
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("run failed:")]
    assert "data line 1 (prompt e0-0): prompt of 200000 tokens is longer than data.maxPromptTokens 124" in failure


def test_a_prompt_the_engine_fails_does_not_fail_the_prompts_batched_with_it(tmp_path):
    """CI saw a good prompt (e0-4) set aside beside the bad one: the hf engine batches samples of several calls
    in one forward pass, and a failed batch failed every call in it. It now tries each prompt of a failed batch
    alone, so only the bad prompt's call fails."""
    import asyncio

    from rljob_workers.engines.base import PromptInput, SamplingConfig
    from rljob_workers.engines.hf import HFEngine

    from tiny_models import char_gpt2

    async def body() -> tuple[list[str], str]:
        engine = HFEngine(str(char_gpt2(tmp_path / "model")))
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
        try:
            good = PromptInput("good", tuple(engine.tokenize("1+1=")), n=2)
            bad = PromptInput("bad", tuple(engine.tokenize(ENGINE_FAILS)), n=2)

            async def call(prompt: PromptInput) -> list[str] | str:
                try:
                    return [s.prompt_id async for s in engine.generate([prompt], sampling)]
                except Exception as exc:  # the engine's failure, as the rollout server sees it
                    return f"failed: {type(exc).__name__}"

            done, failed = await asyncio.gather(call(good), call(bad))  # submitted together: one batch
            assert isinstance(done, list) and isinstance(failed, str)
            return done, failed
        finally:
            await engine.close()

    done, failed = asyncio.run(body())
    assert done == ["good", "good"] and failed == "failed: IndexError", (done, failed)
