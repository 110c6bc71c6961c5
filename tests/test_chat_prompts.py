"""Prompts as datasets hold them: plain text or chat messages, with a system prompt, rendered once by the model's
own chat template (spec.data messagesField, systemPrompt, chatTemplate).

Pure tests of the rendering and the data rows; the spec's rules; set-up refusals of `rljob run` and
`rljob validate --deep` (one line naming the field, before Ray starts); and real runs of
examples/arithmetic-chat.yaml: one where a probe inside the rollout replicas' interpreter (passed as
--rollout-python, no hook in rljob) records the token ids each Generate request brought, which must be the
template's rendering, and one that trains the example to the plain one's bar.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import PreTrainedTokenizerFast

from rljob.v1 import sample_pb2
from rljob_api import RLJobInvalid, parse_rljob
from rljob_api.spec import DataSpec
from rljob_workers.common.chat import conversation, has_chat_template, render
from rljob_workers.driver.controller.data import DataError, Prompt, chat_prompts, check_rows, load_prompts, open_rows
from rljob_workers.driver.controller.groups import Sample
from rljob_workers.driver.controller.messages import generate_request, reward_request
from rljob_workers.driver.telemetry.metrics import first_reaching, read_metrics
from rljob_workers.models.tiny import CHAT_TEMPLATE, char_tokenizer
from rljob_workers.reward.callables import WeightedFunction
from rljob_workers.reward.functions import RewardFunctionSet
from rljob_workers.tasks.arithmetic import SYSTEM_PROMPT, chat_row, make_problems, write_jsonl

from conftest import REPO, run_until_learned

pytestmark = pytest.mark.ray

RLJOB = str(Path(sys.executable).parent / "rljob")
SYSTEM = {"role": "system", "content": SYSTEM_PROMPT}
FAST_SECONDS = 5.0  # the set-up checks read files only; the time is printed


@pytest.fixture(scope="module")
def chat_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ---- pure: the conversation, the rendering, the rows ------------------------------------------------------------


def test_a_system_prompt_opens_the_conversation_unless_it_has_its_own() -> None:
    user = {"role": "user", "content": "23+58"}
    assert conversation("23+58=", None, None) == [{"role": "user", "content": "23+58="}]
    assert conversation(None, [user], SYSTEM_PROMPT) == [SYSTEM, user]
    own = {"role": "system", "content": "be brief."}
    assert conversation(None, [own, user], SYSTEM_PROMPT) == [own, user]


def test_render_is_the_template_with_its_generation_prompt_and_one_bos(chat_tokenizer) -> None:
    turns = [SYSTEM, {"role": "user", "content": "23+58"}]
    texts, ids = render(chat_tokenizer, [turns])
    assert texts == [f"<s>{SYSTEM_PROMPT}</s>23+58="]
    # transformers' own tokenising path of the template gives the same ids: no second <s> from the tokenizer
    assert ids == [chat_tokenizer.apply_chat_template(turns, add_generation_prompt=True)["input_ids"]]
    assert ids[0][:2] == [chat_tokenizer.bos_token_id, chat_tokenizer.convert_tokens_to_ids("a")]
    assert render(chat_tokenizer, []) == ([], [])


def test_a_template_is_found_in_either_file(tmp_path: Path, chat_tokenizer) -> None:
    assert not has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert not has_chat_template(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    assert has_chat_template(tmp_path)
    saved = tmp_path / "saved"
    chat_tokenizer.save_pretrained(saved)
    assert has_chat_template(saved)


def _lines(tmp_path: Path, rows: list[Any]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_messages_rows_are_read_and_bad_ones_named_by_line(tmp_path: Path) -> None:
    good = chat_row({"prompt": "23+58=", "answer": "81"})
    rows = open_rows(_lines(tmp_path, [good]), "prompt", ["answer"], "messages", cache_dir=tmp_path / "cache")
    assert rows[0].messages == ({"role": "user", "content": "23+58"},) and rows[0].fields == {"answer": "81"}
    bad = {
        "not a list": ({"messages": "23+58", "answer": "81"}, "field messages is a str, not a list"),
        "empty": ({"messages": [], "answer": "81"}, "field messages holds no messages"),
        "no content": ({"messages": [{"role": "user"}], "answer": "81"}, "messages[0] is not a {role, content}"),
        "missing": ({"answer": "81"}, "missing field(s) messages"),
    }
    for case, (row, expected) in bad.items():
        with pytest.raises(DataError) as info:
            check_rows(_lines(tmp_path, [good, row]), "prompt", ["answer"], "messages", split="train", rows=100)
        assert f"data.jsonl:2: {expected}" in str(info.value), case


def test_the_template_applies_where_the_model_has_one(tmp_path: Path, chat_tokenizer) -> None:
    plain, chat = tmp_path / "plain", tmp_path / "chat"
    char_tokenizer().save_pretrained(plain)
    chat_tokenizer.save_pretrained(chat)
    assert chat_prompts(str(plain), "auto", None, None) is None
    assert chat_prompts(str(chat), "off", None, None) is None
    assert chat_prompts(str(chat), "auto", "messages", SYSTEM_PROMPT) is not None
    with pytest.raises(DataError, match=r"spec\.data\.messagesField: .* has no chat template"):
        chat_prompts(str(plain), "auto", "messages", None)
    # plain text under the template: one user turn after the system prompt, rendered once, sent as ids
    path = write_jsonl(tmp_path / "plain.jsonl", make_problems(4, seed=1))
    chat_prompt = chat_prompts(str(chat), "auto", None, "hi.")
    source = load_prompts(path, "prompt", ["answer"], 0, False, chat=chat_prompt, cache_dir=tmp_path / "cache")
    prompt = source.next()
    assert prompt.text == f"<s>hi.</s>{make_problems(1, seed=1)[0]['prompt']}="
    assert list(prompt.token_ids) == chat_tokenizer(prompt.text, add_special_tokens=False)["input_ids"]


def test_a_rendered_prompt_goes_as_ids_and_its_messages_to_the_rewards() -> None:
    from rljob_api.workercfg import derive_worker_configs

    job = parse_rljob(yaml.safe_load((REPO / "examples" / "arithmetic-chat.yaml").read_text()))
    config = derive_worker_configs(job).controller
    messages = ({"role": "user", "content": "23+58"},)
    rendered = Prompt("e0-1", "<s>x</s>23+58=", {"answer": "81"}, messages, (1, 2, 3))
    request = generate_request(config, rendered, [0, 1]).prompts[0]
    assert list(request.token_ids) == [1, 2, 3] and request.text == ""
    plain = generate_request(config, Prompt("e0-2", "23+58=", {}), [0]).prompts[0]
    assert plain.text == "23+58=" and not plain.token_ids
    sample = Sample("s", "e0-1", 0, [1, 2, 3], [9], [-0.1], 1, "81")
    assert [(m.role, m.content) for m in reward_request(rendered, sample).messages] == [("user", "23+58")]
    assert not reward_request(Prompt("e0-2", "23+58=", {}), sample).messages


def test_rules_get_the_messages_where_the_data_has_them() -> None:
    seen: list[dict[str, Any]] = []

    def rule(prompt: str, completion: str, **kwargs: Any) -> float:
        seen.append(kwargs)
        return 1.0

    functions = RewardFunctionSet([WeightedFunction("r", rule)], 10.0)
    chat = sample_pb2.RewardSample(
        sample_id="a", prompt="<s>23+58=", completion="81", messages=[sample_pb2.ChatMessage(role="user", content="q")]
    )
    asyncio.run(functions.score(chat))
    asyncio.run(functions.score(sample_pb2.RewardSample(sample_id="b", prompt="23+58=", completion="81")))
    functions.close()
    assert seen == [{"messages": [{"role": "user", "content": "q"}]}, {}]


# ---- the spec ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"promptField": "q", "messagesField": "m"}, "spec.data.messagesField: set promptField (q) or messagesField"),
        ({"messagesField": "m", "chatTemplate": "off"}, "spec.data.messagesField: messages are rendered with the"),
        ({"systemPrompt": "s", "chatTemplate": "off"}, "spec.data.systemPrompt: goes into the chat template"),
    ],
)
def test_the_spec_refuses_prompts_it_cannot_render(example_doc: dict, data: dict, expected: str) -> None:
    doc = copy.deepcopy(example_doc)
    doc["spec"]["data"].update(data)
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    assert str(info.value.errors[0]).startswith(expected)


def test_each_rule_has_its_cel_twin() -> None:
    rules = [r["rule"] for r in DataSpec.model_json_schema()["x-kubernetes-validations"]]
    assert "!has(self.messagesField) || self.promptField == 'prompt'" in rules
    assert "!has(self.messagesField) || self.chatTemplate != 'off'" in rules
    assert "!has(self.systemPrompt) || self.chatTemplate != 'off'" in rules


# ---- set-up refusals at the process boundary ----------------------------------------------------------------------


def _chat_job(work: Path, example: dict[str, Path], **data: Any) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic-chat.yaml").read_text())
    doc["spec"]["model"]["path"], doc["spec"]["data"]["path"] = str(example["model"]), str(example["data"])
    doc["spec"]["checkpoint"]["dir"] = str(work / "checkpoints")
    doc["spec"]["data"].update(data)
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def _refused(args: list[str], cwd: Path) -> str:
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}  # rules in cwd
    done = subprocess.run([RLJOB, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    took = time.monotonic() - started
    print(f"{args[0]}: refused in {took:.2f}s: {done.stderr.strip()}")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert took < FAST_SECONDS
    assert not (cwd / "out").exists()  # nothing started: no run folder
    return lines[0]


def test_messages_for_a_model_without_a_template_are_refused_in_one_line(chat_example, tmp_path: Path) -> None:
    no_template = {**chat_example, "model": chat_example["plain_model"]}
    job = _chat_job(tmp_path, no_template)
    for args in (
        ["run", str(job), "--no-display", "--output", str(tmp_path / "out")],
        ["validate", "--deep", str(job)],
    ):
        line = _refused(args, tmp_path)
        assert line.startswith("spec.data.messagesField: the model ") and "has no chat template" in line
    job = _chat_job(tmp_path, {**no_template, "data": write_jsonl(tmp_path / "p.jsonl", make_problems(4, 1))})
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["data"].pop("messagesField")
    job.write_text(yaml.safe_dump(doc))
    assert _refused(["validate", "--deep", str(job)], tmp_path).startswith("spec.data.systemPrompt: the model ")


def test_a_bad_messages_row_and_a_rule_without_messages_are_refused(chat_example, tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(chat_example["data"].read_text().splitlines()[0] + "\n" + '{"messages": "hi", "answer": "1"}\n')
    job = _chat_job(tmp_path, {**chat_example, "data": data})
    line = _refused(["run", str(job), "--no-display", "--output", str(tmp_path / "out")], tmp_path)
    assert line.startswith(f"spec.data.path: {data}:2: field messages is a str")
    (tmp_path / "narrow_rule.py").write_text("def score(prompt, completion, answer):\n    return 0.0\n")
    job = _chat_job(tmp_path, chat_example)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["reward"]["functions"][0]["rule"]["function"] = "narrow_rule:score"
    job.write_text(yaml.safe_dump(doc))
    line = _refused(["validate", "--deep", str(job)], tmp_path)
    assert line.startswith("spec.reward.functions[0].rule.function: narrow_rule:score")
    assert "messages (spec.data.messagesField)" in line


# ---- real runs ------------------------------------------------------------------------------------------------------

# Runs in each rollout replica's interpreter (sitecustomize): appends the token ids of every prompt a Generate
# request brings, as the replica's RolloutService parses them, to $PROBE_FILE.
PROBE = """
import json, os
import rljob_workers.rollout.server as server

_parse = server.parse_prompts

def parse_prompts(request, tokenize):
    with open(os.environ["PROBE_FILE"], "a") as out:
        for prompt in request.prompts:
            out.write(json.dumps({"token_ids": list(prompt.token_ids), "text": prompt.text}) + "\\n")
    return _parse(request, tokenize)

server.parse_prompts = parse_prompts
"""


def _probed_python(folder: Path, received: Path) -> Path:
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(PROBE)
    python = folder / "python"
    python.write_text(
        f'#!/bin/sh\nexport PYTHONPATH="{folder}:$PYTHONPATH" PROBE_FILE="{received}"\nexec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    return python


def test_the_rollout_replica_receives_the_templated_token_ids(chat_example, tmp_path: Path) -> None:
    received = tmp_path / "received.jsonl"
    python = _probed_python(tmp_path / "probe", received)
    job = _chat_job(tmp_path, chat_example)
    command = [RLJOB, "run", str(job), "--no-display", "--output", str(tmp_path / "out"), "--steps", "2"]
    done = subprocess.run([*command, "--rollout-python", str(python)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    requests = [json.loads(line) for line in received.read_text().splitlines()]
    assert len(requests) >= 2 * 16  # every prompt of both steps
    tokenizer = PreTrainedTokenizerFast.from_pretrained(chat_example["model"])
    rows = {r["messages"][0]["content"] for r in map(json.loads, chat_example["data"].read_text().splitlines())}
    for request in requests:
        assert request["text"] == ""  # rendered by the controller, sent as ids
        text = tokenizer.decode(request["token_ids"])
        question = text.removeprefix(f"<s>{SYSTEM_PROMPT}</s>").removesuffix("=")
        assert question in rows, text
        turns = [SYSTEM, {"role": "user", "content": question}]
        assert request["token_ids"] == tokenizer.apply_chat_template(turns, add_generation_prompt=True)["input_ids"]


def test_the_chat_example_learns_like_the_plain_one(chat_example, tmp_path: Path) -> None:
    job = _chat_job(tmp_path, chat_example)
    metrics, log = tmp_path / "out" / "metrics.jsonl", tmp_path / "run.log"
    command = [RLJOB, "run", str(job), "--no-display", "--output", str(tmp_path / "out"), "--steps", "80"]
    rc = run_until_learned(command, log, metrics, 0.8, 5).returncode
    records = read_metrics(metrics)
    rewards = [r["reward_mean"] for r in records]
    print(f"chat example: {len(rewards)} steps, rewards {[round(r, 2) for r in rewards]}")
    assert rc in (0, 128 + signal.SIGINT), log.read_text()[-3000:]
    assert statistics.fmean(rewards[:2]) <= 0.2, rewards[:2]  # it starts weak
    assert first_reaching(records, 0.8, 5) is not None, f"last 5 steps' mean {statistics.fmean(rewards[-5:]):.2f}"
