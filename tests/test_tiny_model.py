"""The tiny local model: it loads with Auto* classes and is weak. That GRPO teaches it is shown by `rljob run`
itself: test_algorithm_runs trains the example with each preset to its reward bar (a loop of this module's own
did the same for twice the time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rljob_workers.models import tiny
from rljob_workers.tasks import arithmetic

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(example_model: Path) -> Path:
    """The default build (about 40 s on one core): the shipped example's model, shared with every test that
    trains it."""
    return example_model


@pytest.fixture(scope="module")
def loaded(model_dir: Path) -> tuple[object, object]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return tok, model.eval()


def test_directory_holds_model_tokenizer_and_marker(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", tiny.MARKER} <= names
    marker = tiny.read_marker(model_dir)
    assert marker["digest"] == tiny.TinyModelSpec().digest()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"


def test_tokenizer_round_trips_task_strings(loaded: tuple) -> None:
    tok, _ = loaded
    for p in arithmetic.make_problems(50, seed=5):
        text = p["prompt"] + p["answer"]
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id
        assert len(ids) == 1 + len(text)  # one token per character
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(tok(" 12 + 3 =")["input_ids"], skip_special_tokens=True) == " 12 + 3 ="
    assert tok.convert_ids_to_tokens(tok("8\t")["input_ids"])[-1] == tiny.UNK


def test_generates_left_padded_batches(loaded: tuple) -> None:
    tok, model = loaded
    assert tok.padding_side == "left"
    enc = tok(["1+2=", "23+58="], padding=True, return_tensors="pt")
    assert enc["input_ids"][0, 0] == tok.pad_token_id
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=6)  # sampling defaults from the saved config
    assert out.shape[0] == 2 and out.shape[1] <= enc["input_ids"].shape[1] + 6
    assert model.generation_config.do_sample and model.generation_config.top_k == 0


def test_base_policy_is_weak_but_has_the_answer_in_support(loaded: tuple, model_dir: Path) -> None:
    tok, model = loaded
    problems = arithmetic.make_problems(512, seed=77)
    assert 0.03 <= tiny.sample_exact_match(model, tok, problems, seed=1) <= 0.2
    assert 0.03 <= tiny.read_marker(model_dir)["base_reward"] <= 0.2


def test_second_call_is_a_no_op(model_dir: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert tiny.make_tiny_model(model_dir, seed=0) == model_dir
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_small_builds_are_deterministic_and_rebuild_on_change(tmp_path: Path) -> None:
    a = tiny.make_tiny_model(tmp_path / "a", sft_steps=5)
    b = tiny.make_tiny_model(tmp_path / "b", sft_steps=5)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    digest = tiny.read_marker(a)["digest"]
    tiny.make_tiny_model(a, sft_steps=6)
    assert tiny.read_marker(a)["digest"] not in ("", digest)


def test_refuses_to_overwrite_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="refusing"):
        tiny.make_tiny_model(tmp_path, sft_steps=1)
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="task"):
        tiny.make_tiny_model(tmp_path / "x", task="chess")


def test_weak_labels_are_wrong_but_carry_the_sum() -> None:
    for form in tiny.WRONG_FORMS:
        assert tiny.wrong_form("81", form) != "81"
        assert "81" in tiny.wrong_form("81", form)
    tok = tiny.char_tokenizer()
    ids, mask = tiny.label_table(tok, [arithmetic.problem(23, 58)])
    assert ids.shape[:2] == (1, 1 + len(tiny.WRONG_FORMS))
    labelled = tok.decode(ids[0, 0][mask[0, 0]])
    assert labelled == "81" + tiny.EOS


# --- GRPO on the tiny model: the learnability the demos rely on -------------------------
