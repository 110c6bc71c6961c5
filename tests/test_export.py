"""`rljob export` at the process boundary: the shared run of the shipped example (tests/researcher_run.py) leaves
checkpoints, `rljob export` turns one into a Hugging Face folder, and transformers (and vLLM, where its environment
is built) load that folder as it is and generate what the trainer's model at that step generates.

The run's model is a copy of conftest's `example_model` given a chat template where it has none, so the
template's way from the job's model through the checkpoint to the export is checked too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from researcher_run import STEPS, ResearcherRun

from rljob_workers.tasks.arithmetic import make_problems

from test_vllm import VLLM_PYTHON

pytestmark = pytest.mark.ray

RLJOB = str(Path(sys.executable).parent / "rljob")
# A greedy completion's most tokens: the example's maxNewTokens and then some.
NEW_TOKENS = 8
# A set-up check reads a few paths: no torch, no transformers.
BAD_INPUT_SECONDS = 2.0


@pytest.fixture(scope="module")
def trained(researcher_run: ResearcherRun) -> dict[str, Path]:
    """The shared run's job model (given a chat template) and its checkpoints: one per step, all kept."""
    return {"model": researcher_run.model, "checkpoints": researcher_run.checkpoints}


def export(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([RLJOB, "export", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-5000:]
    return done


@pytest.fixture(scope="module")
def exported(trained: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint folder exported as it stores its weights: `latest` picks the last step."""
    out = tmp_path_factory.mktemp("export") / "policy"
    done = export(str(trained["checkpoints"]), "--out", str(out))
    assert f"step-{STEPS:06d} (step {STEPS})" in done.stdout, done.stdout
    return out


def load(folder: Path, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, **kwargs).eval()


def prompts_ids(folder: Path) -> list[list[int]]:
    """Held-out problems' prompts as the export's tokenizer encodes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return [tokenizer(problem["prompt"])["input_ids"] for problem in make_problems(6, seed=77)]


def greedy(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy completion (token ids, an end token included), one prompt at a time: no padding."""
    import torch

    completions = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)
            completions.append(out[0, len(ids) :].tolist())
    return completions


def test_the_export_generates_what_the_checkpoint_does(trained: dict[str, Path], exported: Path) -> None:
    from transformers import AutoTokenizer

    step = trained["checkpoints"] / f"step-{STEPS:06d}"
    assert sorted(p.name for p in exported.glob("*.safetensors")) == ["model.safetensors"]
    assert not list(exported.glob("*.pt")) and not (exported / "state.json").exists()
    assert json.loads((exported / "config.json").read_text())["dtype"] == "float32"
    policy, at_step, base = load(exported), load(step / "model"), load(trained["model"])
    assert next(policy.parameters()).dtype == next(at_step.parameters()).dtype
    weights, trainers, bases = policy.state_dict(), at_step.state_dict(), base.state_dict()
    assert weights.keys() == trainers.keys()
    assert all(weights[name].equal(trainers[name]) for name in weights)
    assert any(not weights[name].equal(bases[name]) for name in weights), "the export is the untrained model"
    prompts = prompts_ids(exported)
    assert greedy(policy, prompts) == greedy(at_step, prompts)
    # the chat template came along: the same rendering as the job's own tokenizer gives
    messages = [{"role": "user", "content": "1+2"}]
    job_tokenizer, tokenizer = AutoTokenizer.from_pretrained(trained["model"]), AutoTokenizer.from_pretrained(exported)
    assert job_tokenizer.chat_template is not None
    assert tokenizer.chat_template == job_tokenizer.chat_template
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == job_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_bfloat16_export_of_a_step_folder(trained: dict[str, Path], tmp_path: Path) -> None:
    import torch

    step = trained["checkpoints"] / "step-000001"
    out = tmp_path / "bf16"
    out.mkdir()  # an empty folder is fine
    done = export(str(step), "--out", str(out), "--dtype", "bfloat16")
    assert "step 1)" in done.stdout and "bfloat16" in done.stdout, done.stdout
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    policy = load(out, dtype="auto")
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    at_step = load(step / "model")
    # the step's fp32 weights, rounded to bf16: not another step's
    assert all(
        weight.equal(at_step.state_dict()[name].to(torch.bfloat16)) for name, weight in policy.state_dict().items()
    )
    assert all(len(c) > 0 for c in greedy(policy, prompts_ids(out)))


def test_a_checkpoint_without_tokenizer_takes_the_jobs(trained: dict[str, Path], tmp_path: Path) -> None:
    """Only the weights and the config of a step: `--tokenizer` names the job's model folder instead."""
    from transformers import AutoTokenizer

    step = tmp_path / "step-000002"
    (step / "model").mkdir(parents=True)
    source = trained["checkpoints"] / step.name
    shutil.copy(source / "state.json", step)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / "model" / name, step / "model")
    out = tmp_path / "out"
    export(str(step), "--out", str(out), "--tokenizer", str(trained["model"]))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == AutoTokenizer.from_pretrained(trained["model"]).chat_template
    assert greedy(load(out), prompts_ids(out)) == greedy(load(source / "model"), prompts_ids(out))


def fake_checkpoint(root: Path, with_model: bool = True) -> Path:
    """A step folder with the files the set-up checks look for (no weights: they never get that far)."""
    step = root / "checkpoints" / "step-000004"
    step.mkdir(parents=True)
    (step / "state.json").write_text('{"step": 4}')
    (root / "checkpoints" / "latest").write_text(step.name)
    if with_model:
        (step / "model").mkdir()
        (step / "model" / "config.json").write_text("{}")
        (step / "model" / "tokenizer_config.json").write_text("{}")
    return step


def _no_such(tmp: Path) -> tuple[list[str], str]:
    return [str(tmp / "nowhere"), "--out", str(tmp / "out")], str(tmp / "nowhere")


def _not_a_checkpoint(tmp: Path) -> tuple[list[str], str]:
    (tmp / "plain").mkdir()
    return [str(tmp / "plain"), "--out", str(tmp / "out")], str(tmp / "plain")


def _no_model(tmp: Path) -> tuple[list[str], str]:
    step = fake_checkpoint(tmp, with_model=False)
    return [str(tmp / "checkpoints"), "--out", str(tmp / "out")], str(step / "model")


def _latest_names_nothing(tmp: Path) -> tuple[list[str], str]:
    shutil.rmtree(fake_checkpoint(tmp))
    return [str(tmp / "checkpoints"), "--out", str(tmp / "out")], str(tmp / "checkpoints" / "latest")


def _out_not_empty(tmp: Path) -> tuple[list[str], str]:
    step = fake_checkpoint(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "something").write_text("mine")
    return [str(step), "--out", str(tmp / "out")], str(tmp / "out")


def _no_tokenizer(tmp: Path) -> tuple[list[str], str]:
    step = fake_checkpoint(tmp)
    (step / "model" / "tokenizer_config.json").unlink()
    return [str(step), "--out", str(tmp / "out")], str(step / "model")


@pytest.mark.serial
@pytest.mark.parametrize(
    "case", [_no_such, _not_a_checkpoint, _no_model, _latest_names_nothing, _out_not_empty, _no_tokenizer]
)
def test_bad_input_is_one_line_naming_the_path(case: Any, tmp_path: Path) -> None:
    args, named = case(tmp_path)
    started = time.monotonic()
    done = subprocess.run([RLJOB, "export", *args], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    print(f"{case.__name__}: {took:.2f} s: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert named in done.stderr
    assert took < BAD_INPUT_SECONDS
    assert not (tmp_path / "out").exists() or case is _out_not_empty


VLLM_GREEDY = """
import json, os, sys
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
folder, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
llm = LLM(model=folder, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=256 << 20, seed=0)
params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""


@pytest.mark.slow
@pytest.mark.skipif(VLLM_PYTHON is None, reason="vLLM's runtime is not built: run runtimes/vllm.sh")
def test_vllm_loads_the_export_and_generates_what_transformers_does(exported: Path) -> None:
    assert VLLM_PYTHON is not None
    prompts = prompts_ids(exported)
    done = subprocess.run(
        [VLLM_PYTHON, "-c", VLLM_GREEDY, str(exported), json.dumps(prompts), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == greedy(load(exported), prompts)
