"""A verl or TRL user's data and reward function, unchanged, under the real `rljob run` (#54): a verl-format
parquet of the arithmetic task (chat-message prompts, data_source, reward_model.ground_truth, extra_info) scored
by a verl `compute_score` answering a dict, and a `datasets` save_to_disk folder scored by a TRL batched
function. Each learns to a 5-step mean of 0.8 as the shipped examples do (stopped once it has: the time is the
learning's). The reward functions are written as the peers' documentation shows them, in a file beside the
job."""

from __future__ import annotations

import json
import signal
import statistics
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest
import yaml

from rljob_workers.driver.telemetry.metrics import first_reaching, read_metrics

from conftest import REPO, run_until_learned

pytestmark = [pytest.mark.ray]

RLJOB = str(Path(sys.executable).parent / "rljob")

# verl's reward function as its documentation writes one (verl/utils/reward_score: compute_score with
# data_source, solution_str, ground_truth, extra_info), answering a dict whose `score` is the reward.
VERL_SCORE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.split("</s>")[0].strip()
    correct = answer == ground_truth
    return {"score": 1.0 if correct else 0.0, "acc": float(correct), "index_seen": float(extra_info["index"] >= 0)}
"""
# TRL's reward function as its documentation writes one: batched, the dataset's columns as lists in kwargs.
TRL_REWARD = """
from pathlib import Path

CALLS = Path(__file__).with_name("calls.txt")


def accuracy_reward(completions, answer, **kwargs):
    with CALLS.open("a") as calls:  # how many completions each call scored, for the test
        calls.write(f"{len(completions)} ")
    return [1.0 if c.split("</s>")[0].strip() == a else 0.0 for c, a in zip(completions, answer)]
"""


def learn(job: Path, out: Path, steps: int = 100) -> list[dict[str, Any]]:
    """`rljob run` the job until its 5-step mean reaches 0.8 (then SIGINT: a graceful stop); its metrics."""
    metrics, log = out / "metrics.jsonl", out.parent / "run.log"
    command = [RLJOB, "run", str(job), "--no-display", "--output", str(out), "--steps", str(steps)]
    rc = run_until_learned(command, log, metrics, 0.8, 5, cwd=job.parent).returncode
    assert rc in (0, 128 + signal.SIGINT), log.read_text()[-3000:]
    records = read_metrics(metrics)
    rewards = [r["reward_mean"] for r in records]
    print(f"{job.parent.name}: {len(rewards)} steps, rewards {[round(r, 2) for r in rewards]}")
    assert statistics.fmean(rewards[:2]) <= 0.2, rewards[:2]  # it starts weak
    assert first_reaching(records, 0.8, 5) is not None, f"last 5 steps' mean {statistics.fmean(rewards[-5:]):.2f}"
    return records


def _job(example: str, work: Path, model: Path, data: dict[str, Any], function: dict[str, Any]) -> Path:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(model)
    spec["data"] = {**{k: v for k, v in spec["data"].items() if k in ("systemPrompt",)}, **data}
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    spec["reward"]["functions"] = [function]
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def test_a_verl_parquet_and_compute_score_learn_unchanged(tmp_path: Path, chat_example: dict[str, Path]) -> None:
    model = chat_example["model"]
    chat = [json.loads(line) for line in chat_example["data"].read_text().splitlines()]
    rows = [  # verl's layout (its examples/data_preprocess): the prompt as messages, the answer in reward_model
        {
            "data_source": "arithmetic",
            "prompt": row["messages"],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"split": "train", "index": i},
        }
        for i, row in enumerate(chat)
    ]
    work = tmp_path / "verl"
    work.mkdir()
    datasets.Dataset.from_list(rows).to_parquet(str(work / "train.parquet"))
    (work / "my_rewards.py").write_text(VERL_SCORE)
    data = {
        "path": str(work / "train.parquet"),
        "messagesField": "prompt",
        "fields": ["data_source", "reward_model.ground_truth", "extra_info"],
    }
    function = {"name": "verl", "kind": "rule", "rule": {"function": "my_rewards:compute_score"}}
    records = learn(_job("arithmetic-chat.yaml", work, model, data, function), work / "out")
    assert records[-1]["reward_by_function"]["verl.index_seen"] == 1.0  # extra_info arrived as the object it is
    assert records[-1]["reward_by_function"]["verl.acc"] == pytest.approx(records[-1]["reward_by_function"]["verl"])


def test_a_saved_dataset_and_a_trl_batched_function_learn_unchanged(tmp_path: Path, example_model: Path) -> None:
    from rljob_workers.tasks.arithmetic import make_problems

    work = tmp_path / "trl"
    work.mkdir()
    saved = work / "arithmetic-dataset"
    table = datasets.Dataset.from_list(make_problems(2000, seed=0))
    datasets.DatasetDict({"train": table, "test": table.select(range(100))}).save_to_disk(str(saved))
    (work / "my_rewards.py").write_text(TRL_REWARD)
    data = {"path": str(saved), "split": "train", "fields": ["answer"]}
    function = {"name": "accuracy", "kind": "rule", "rule": {"function": "my_rewards:accuracy_reward"}}
    learn(_job("arithmetic.yaml", work, example_model, data, function), work / "out")
    sizes = [int(n) for n in (work / "calls.txt").read_text().split()]
    print(f"TRL calls: {len(sizes)} for {sum(sizes)} completions, the largest of {max(sizes)}")
    # called with a group's samples together (rule.batchSize unset: groupSize 8), not one by one
    assert max(sizes) == 8 and len(sizes) <= sum(sizes) / 4, sizes
