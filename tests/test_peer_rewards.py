"""Reward functions written as TRL and verl write them, in a file beside the job, under `rljob validate --deep`
and `rljob run`: each called in its own convention (decided from its parameters and printed), TRL's None leaving
a sample to the functions that apply, verl's dict answer a score with its other numbers logged beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO

pytestmark = [pytest.mark.ray]

RLJOB = str(Path(sys.executable).parent / "rljob")
PEER_REWARDS = '''
def _text(completion):
    return completion.split("</s>")[0].strip()


def exact(completions, answer, **kwargs):
    """TRL's form: a batch of completions, each dataset column a list."""
    return [1.0 if _text(c) == a.strip() else 0.0 for c, a in zip(completions, answer)]


def odd_only(prompts, completions, answer, **kwargs):
    """TRL's form; None where it does not apply (even answers)."""
    return [None if int(a) % 2 == 0 else 0.5 for a in answer]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's form: a dict with the score and metrics beside it."""
    correct = _text(solution_str) == ground_truth.strip()
    return {"score": 1.0 if correct else 0.0, "acc": float(correct), "source_is_arith": float(data_source == "arith")}
'''
FUNCTIONS: list[dict[str, Any]] = [
    {"name": "trl-exact", "kind": "rule", "rule": {"function": "peer_rewards:exact"}},
    {"name": "trl-odd", "kind": "rule", "weight": 2.0, "rule": {"function": "peer_rewards:odd_only"}},
    {"name": "verl", "kind": "rule", "weight": 0.5, "rule": {"function": "peer_rewards:compute_score"}},
]


def _project(assets: Path, work: Path, functions: list[dict[str, Any]]) -> Path:
    work.mkdir(parents=True)
    (work / "peer_rewards.py").write_text(PEER_REWARDS)
    rows = [json.loads(line) for line in (assets / "train.jsonl").read_text().splitlines()]
    data = work / "train.jsonl"
    data.write_text(
        "".join(json.dumps({**r, "ground_truth": r["answer"], "data_source": "arith"}) + "\n" for r in rows)
    )
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(assets / "model"), str(data)
    spec["data"].pop("eval")
    spec["data"]["fields"] = ["answer", "ground_truth", "data_source"]
    spec["reward"]["functions"] = functions
    spec["algorithm"].update(totalSteps=2, groupSize=4, promptsPerStep=4)
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    spec["logging"] = {"samples": 16}
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_trl_and_verl_functions_run_in_their_own_conventions(assets: Path, tmp_path: Path) -> None:
    job = _project(assets, tmp_path / "project", FUNCTIONS)
    checked = subprocess.run([RLJOB, "validate", "--deep", str(job)], capture_output=True, text=True, env=_env())
    assert checked.returncode == 0, checked.stderr
    assert "spec.reward.functions[0] 'trl-exact': called as trl (auto: it declares `completions`)" in checked.stdout
    assert "spec.reward.functions[2] 'verl': called as verl (auto: it declares `solution_str`)" in checked.stdout
    out = tmp_path / "out"
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [
        json.loads(line) for path in sorted((out / "samples").glob("*.jsonl")) for line in path.read_text().splitlines()
    ]
    assert len(logged) == 2 * 16
    for sample in logged:
        a, b = (int(x) for x in sample["prompt"].rstrip("=").split("+"))
        scores, odd = sample["scores"], (a + b) % 2 == 1
        assert ("trl-odd" in scores) == odd, sample  # None: not scored, not counted
        assert scores["verl.acc"] == scores["verl"] == scores["trl-exact"] and scores["verl.source_is_arith"] == 1.0
        expected = scores["trl-exact"] + 0.5 * scores["verl"] + (2.0 * 0.5 if odd else 0.0)
        assert sample["reward"] == pytest.approx(expected), sample


def test_a_trl_function_that_cannot_take_the_columns_is_refused_naming_it(assets: Path, tmp_path: Path) -> None:
    strict: list[dict[str, Any]] = [{"name": "strict", "kind": "rule", "rule": {"function": "peer_rewards:strict"}}]
    job = _project(assets, tmp_path / "project", strict)
    (job.parent / "peer_rewards.py").write_text("def strict(prompts, completions):\n    return [0.0]\n")
    checked = subprocess.run([RLJOB, "validate", "--deep", str(job)], capture_output=True, text=True, env=_env())
    assert checked.returncode == 1
    [line] = checked.stderr.strip().splitlines()
    assert line.startswith("spec.reward.functions[0].rule.function: peer_rewards:strict(prompts, completions), ")
    assert "called as trl (auto: it declares `completions`)" in line and "answer" in line


def test_a_trl_function_scores_a_batch_in_one_call_and_a_wrong_length_fails_each_sample_naming_it() -> None:
    """rule.batchSize: the samples that arrive together (a group) share one call of a sync TRL function;
    its list answer is split back, None leaving a sample to the other functions."""
    import asyncio

    from rljob.v1 import sample_pb2
    from rljob_workers.reward.callables import WeightedFunction
    from rljob_workers.reward.conventions import adapt
    from rljob_workers.reward.functions import RewardFunctionSet

    calls: list[int] = []

    def lengths(completions, answer, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(completions))
        return [float(len(c)) if a != "skip" else None for c, a in zip(completions, answer, strict=True)]

    def short(completions, **kwargs):  # type: ignore[no-untyped-def]
        return [1.0]

    def samples(n: int) -> list[sample_pb2.RewardSample]:
        answers = ["skip" if i == 3 else str(i) for i in range(n)]
        return [
            sample_pb2.RewardSample(sample_id=f"s{i}", completion="x" * i, fields={"answer": a})
            for i, a in enumerate(answers)
        ]

    async def score(fn, n: int) -> list[sample_pb2.SampleScore]:  # type: ignore[no-untyped-def]
        ones = WeightedFunction("one", lambda prompt, completion, **_: 1.0)
        functions = RewardFunctionSet([WeightedFunction("trl", adapt(fn, "trl", "trl", batch_size=8)), ones], 10.0)
        try:
            return list(await asyncio.gather(*(functions.score(s) for s in samples(n))))
        finally:
            functions.close()

    scored = asyncio.run(score(lengths, 8))
    assert calls == [8]
    assert [s.components.get("trl") for s in scored] == [0.0, 1.0, 2.0, None, 4.0, 5.0, 6.0, 7.0]
    assert scored[3].score == 1.0  # only `one` applies to the skipped sample
    wrong = asyncio.run(score(short, 4))
    assert all("'trl' (trl) returned 1 scores for 4 completions" in s.error.message for s in wrong)
