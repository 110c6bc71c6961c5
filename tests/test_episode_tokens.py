"""Token-exact episodes at the process boundary: `rljob run` of a model with a BPE tokenizer, where decoding and
encoding again changes ids. What the run trained on (the sample log's token sequence and loss mask) is, turn
for turn, the ids the environment's process received as sampled, and each observation's ids as it was encoded
once; re-tokenizing the same conversation would have given other ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import groupby
from pathlib import Path
from typing import Any

import pytest
import yaml
from env_classes import TokenRecorder
from transformers import AutoTokenizer

from conftest import REPO
from tiny_models import bpe_llama

RLJOB = str(Path(sys.executable).parent / "rljob")


def _runs(ids: list[int], mask: list[int]) -> list[tuple[int, list[int]]]:
    """The sequence cut where the mask changes: (mask value, ids) in order."""
    pairs = list(zip(mask, ids, strict=True))
    return [(flag, [i for _, i in run]) for flag, run in groupby(pairs, key=lambda p: p[0])]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One short run against TokenRecorder: its logged episodes, what the environment received, the tokenizer."""
    root = tmp_path_factory.mktemp("bpe")
    model = bpe_llama(root / "model")
    data = root / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{a}+{a + 1}=", "answer": str(2 * a + 1)}) + "\n" for a in range(40))
    )
    doc = yaml.safe_load((REPO / "examples" / "calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data)
    spec["data"].pop("eval")
    spec["environment"] = {
        "kind": "python",
        "class": "env_classes:TokenRecorder",
        "maxTurns": 2,
        "maxEpisodeTokens": 64,
    }
    spec["algorithm"].update(totalSteps=2, groupSize=4, promptsPerStep=4)
    spec["rollout"]["sampling"]["maxNewTokens"] = 8
    spec["checkpoint"]["dir"] = str(root / "checkpoints")
    spec["logging"]["samples"] = 16  # every episode of a step
    job = root / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    received = root / "received.jsonl"
    env = {
        **os.environ,
        "RLJOB_TEST_TOKENS": str(received),
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    out = root / "out"
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [
        json.loads(line) for path in sorted((out / "samples").glob("*.jsonl")) for line in path.read_text().splitlines()
    ]
    turns = [json.loads(line) for line in received.read_text().splitlines()]
    return {"logged": logged, "received": turns, "tokenizer": AutoTokenizer.from_pretrained(model)}


def test_each_trained_turn_is_the_ids_as_sampled_and_each_observation_is_encoded_once(trained: dict[str, Any]) -> None:
    tokenizer, logged = trained["tokenizer"], trained["logged"]
    received = {(turn["text"], tuple(turn["token_ids"])) for turn in trained["received"]}
    observation = tokenizer(TokenRecorder.observation, add_special_tokens=False)["input_ids"]
    assert len(logged) == 2 * 16, "every episode of both steps is in the sample log"
    for episode in logged:
        runs = _runs(episode["token_ids"], episode["loss_mask"])
        assert [flag for flag, _ in runs] == [1, 0, 1], "turn, observation, turn"
        said = [m["content"] for m in episode["messages"] if m["role"] == "assistant"]
        for text, (_, ids) in zip(said, runs[::2], strict=True):
            assert (text, tuple(ids)) in received, f"trained ids {ids} of turn {text!r} are not what was sampled"
        assert runs[1][1] == observation, "the observation's ids, encoded once, alone"


def test_re_tokenizing_the_same_episodes_would_have_changed_their_ids(trained: dict[str, Any]) -> None:
    """The test above would pass for any tokenizer if no string drifted; with this one, most episodes do."""
    tokenizer = trained["tokenizer"]
    drifted = 0
    for episode in trained["logged"]:
        ids = episode["prompt_token_ids"] + episode["token_ids"]
        text = tokenizer.decode(ids, skip_special_tokens=False)
        drifted += tokenizer(text, add_special_tokens=False)["input_ids"] != ids
    assert drifted >= len(trained["logged"]) // 2, f"only {drifted} of {len(trained['logged'])} episodes drift"
