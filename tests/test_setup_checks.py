"""Set-up errors fail `rljob run` in seconds, as one line naming the field: before Ray starts, but for
a model folder that is there and does not load, whose check runs while Ray starts.

Each case runs the real command on a broken copy of the shipped example and checks its exit
code, that stderr is one line naming the field (file:line for a bad data row), that no
traceback is printed, and how long it took. `rljob validate --deep` runs the same checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO
from tiny_models import char_llama

RLJOB = str(Path(sys.executable).parent / "rljob")
FAST_SECONDS = 5.0  # every check here is cheap (the model load, the slowest, comes last); the time is printed
# `validate --deep` imports transformers (and so torch: 3-4 s here alone, twice that on a slower CI machine)
# before it loads the folder; its bar is that import, timed in the same test, plus the cheap checks' bar.
RAY_AND_CHECK_SECONDS = 30.0  # a model load failing beside Ray's start or in a pool, and Ray's stop (5-7 s alone)
# The bars above are for a machine not shared with another test: these run with the serial tests.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("setup-assets")
    char_llama(root / "model")
    write_jsonl(root / "train.jsonl", make_problems(8, seed=1))
    (root / "empty-model").mkdir()
    (root / "broken_reward.py").write_text("import no_such_module_anywhere\n")
    (root / "narrow_reward.py").write_text("def score(prompt, completion):\n    return 0.0\n")
    (root / "sample_reward.py").write_text("def score(prompt, completion, answer, sample):\n    return 0.0\n")
    return root


def _job(assets: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["model"]["path"] = str(assets / "model")
    doc["spec"]["data"]["path"] = str(assets / "train.jsonl")
    del doc["spec"]["data"]["eval"]  # the example's split is relative to the repository; these run in assets/
    doc["spec"]["checkpoint"]["dir"] = str(tmp_path / "ckpt")
    edit(doc["spec"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _data(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _rule(ref: str) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        spec["reward"]["functions"][0]["rule"]["function"] = ref

    return edit


def _run(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([RLJOB, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=_env(cwd))
    return done, time.monotonic() - started


def _env(cwd: Path) -> dict[str, str]:
    # The test's reward modules live in the assets folder.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}


def _cases(assets: Path, tmp_path: Path) -> dict[str, tuple[Callable[[dict[str, Any]], None], str]]:
    good = (assets / "train.jsonl").read_text().splitlines()[0]
    bad_json = _data(tmp_path, "bad.jsonl", [good, good, '{"prompt": "1+1=", "answer": '])
    null_prompt = _data(tmp_path, "null.jsonl", [good, '{"prompt": null, "answer": "2"}'])
    return {
        "malformed JSON line": (
            lambda s: s["data"].update(path=bad_json),
            f"spec.data.path: {bad_json}:3: not valid JSON",
        ),
        "null prompt": (
            lambda s: s["data"].update(path=null_prompt),
            f"{null_prompt}:2: field prompt is null, not text",
        ),
        "directory without data": (
            lambda s: s["data"].update(path=str(assets / "empty-model")),
            f"{assets / 'empty-model'}: EmptyDatasetError: The directory at {assets / 'empty-model'} doesn't contain "
            "any data files",
        ),
        "empty model folder": (
            lambda s: s["model"].update(path=str(assets / "empty-model")),
            "spec.model.path: " + str(assets / "empty-model") + " has no config.json",
        ),
        "reward module that does not import": (
            _rule("broken_reward:score"),
            "spec.reward.functions[0].rule.function: reward function 'exact-match': "
            "cannot import module 'broken_reward'",
        ),
        "reward that does not take the data fields": (
            _rule("narrow_reward:score"),
            "spec.reward.functions[0].rule.function: narrow_reward:score(prompt, completion) cannot be called",
        ),
        "freeze pattern that matches no parameter": (
            lambda s: s["trainer"].update(freeze=["model.embed_tokens.*", "model.layer.0.*"]),
            "spec.trainer.freeze[1]: 'model.layer.0.*' matches no parameter of the model",
        ),
        "an environment's own image on one machine": (
            lambda s: s.update(environment={"kind": "image", "image": "ghcr.io/me/env:1"}),
            "spec.environment.kind: image runs the environment's own container in the pods of a cluster",
        ),
    }


CASES = [
    "malformed JSON line",
    "null prompt",
    "directory without data",
    "empty model folder",
    "reward module that does not import",
    "reward that does not take the data fields",
    "freeze pattern that matches no parameter",
    "an environment's own image on one machine",
]


def _assert_one_line(
    done: subprocess.CompletedProcess[str], seconds: float, expected: str, rc: int, within: float = FAST_SECONDS
) -> None:
    lines = done.stderr.strip().splitlines()
    print(f"{seconds:.1f}s: {done.stderr.strip()}")
    assert done.returncode == rc, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-2000:]
    assert expected in lines[0]
    assert seconds < within


@pytest.mark.parametrize("case", CASES)
def test_run_refuses_bad_set_up_in_one_line_before_ray(assets, tmp_path, case):
    edit, expected = _cases(assets, tmp_path)[case]
    job = _job(assets, tmp_path, edit)
    done, seconds = _run("run", str(job), "--no-display", "--output", str(tmp_path / "out"), cwd=assets)
    _assert_one_line(done, seconds, expected, rc=2)
    assert not (tmp_path / "out").exists(), "nothing of a run may start"


def test_a_job_asking_for_gpus_this_machine_lacks_is_one_line(assets, tmp_path):
    # Ray would book the actors' GPUs and wait for ever, without a word (the calculator example once did).
    job = _job(assets, tmp_path, lambda s: s["rollout"].update(gpusPerReplica=1))
    env_hidden = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # none visible, even on a machine with GPUs
    started = time.monotonic()
    args = [RLJOB, "run", str(job), "--no-display", "--output", str(tmp_path / "out")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=assets, env=env_hidden)
    expected = "spec.rollout.gpusPerReplica: the job asks for 1 GPU (rollout.replicas × gpusPerReplica + "
    _assert_one_line(done, time.monotonic() - started, expected, rc=2)
    assert "0 are visible here" in done.stderr
    assert not (tmp_path / "out").exists(), "nothing of a run may start"


@pytest.mark.parametrize("case", CASES)
def test_validate_deep_runs_the_same_checks(assets, tmp_path, case):
    edit, expected = _cases(assets, tmp_path)[case]
    job = _job(assets, tmp_path, edit)
    shallow, _ = _run("validate", str(job), cwd=assets)
    assert shallow.returncode == 0, "the schema alone cannot see these"
    done, seconds = _run("validate", "--deep", str(job), cwd=assets)
    _assert_one_line(done, seconds, expected, rc=1)


@pytest.mark.parametrize("rule", [None, "sample_reward:score"], ids=["example", "rule taking the sample"])
def test_validate_deep_passes_a_good_job(assets, tmp_path, rule):
    job = _job(assets, tmp_path, _rule(rule) if rule else lambda s: None)
    done, _ = _run("validate", "--deep", str(job), cwd=assets)
    assert done.returncode == 0 and "check out" in done.stdout, done.stderr


def test_a_missing_run_file_is_one_line(tmp_path):
    done, seconds = _run("run", "missing.yaml", cwd=tmp_path)
    _assert_one_line(done, seconds, "missing.yaml: No such file or directory", rc=2)


def test_negative_steps_are_refused(assets, tmp_path):
    job = _job(assets, tmp_path, lambda s: None)
    done, seconds = _run("run", str(job), "--steps", "-3", "--output", str(tmp_path / "out"), cwd=assets)
    _assert_one_line(done, seconds, "--steps: -3 is not a number of steps", rc=2)


def test_an_engine_that_is_not_installed_is_named(assets, tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here: the check has nothing to refuse")
    job = _job(assets, tmp_path, lambda s: s["rollout"].update(engine="vllm", gpusPerReplica=1))
    done, seconds = _run("run", str(job), "--output", str(tmp_path / "out"), cwd=assets)
    _assert_one_line(done, seconds, "spec.rollout.engine: engine vllm is not installed", rc=2)


def _processes_with(marker: str) -> list[str]:
    """Command lines of the live processes whose environment holds `marker` (what they inherited)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone, or not ours to read
    return found


@pytest.mark.ray
@pytest.mark.parametrize("tokenizer_json", [True, False], ids=["read-without-torch", "transformers-reads-it"])
def test_a_model_folder_that_does_not_load_is_one_line_and_stops_ray(assets, tmp_path, tokenizer_json):
    """The model folders load in a thread while Ray starts (see driver/run/command.py): their error is still
    one line, and the Ray node started beside the check is stopped, not left behind. A folder with a
    tokenizer.json is read with `tokenizers` and json; one without, by transformers."""
    broken = tmp_path / "broken-model"
    if tokenizer_json:
        shutil.copytree(assets / "model", broken)
    else:
        broken.mkdir()
    (broken / "config.json").write_text("{not json")
    stderr = _run_refused_beside_ray(assets, tmp_path, broken, "does not load")
    assert f"spec.model.path: {broken} does not load" in stderr
    assert ("ValueError: config.json: Expecting property name" in stderr) == tokenizer_json, stderr


@pytest.mark.ray
def test_a_model_type_transformers_does_not_know_is_one_line_from_the_pool(assets, tmp_path):
    """The driver reads the folder's files without transformers (it would import torch); a model type
    only transformers can refuse is refused by the pools loading it, still one line naming the field."""
    unknown = tmp_path / "unknown-model"
    shutil.copytree(assets / "model", unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    stderr = _run_refused_beside_ray(assets, tmp_path, unknown, "pool did not start")
    assert f"(spec.model.path: {unknown}): ValueError: " in stderr and "`no-such-model`" in stderr
    # `rljob validate --deep` starts no pool: it loads the folder with transformers, and refuses it itself
    done, seconds = _run("validate", "--deep", str(tmp_path / "job.yaml"), cwd=assets)
    importing = _seconds_to_import_transformers()
    print(f"importing transformers alone: {importing:.1f}s; validate --deep: {seconds:.1f}s")
    _assert_one_line(
        done, seconds, f"spec.model.path: {unknown} does not load: ValueError: ", rc=1, within=importing + FAST_SECONDS
    )


def _seconds_to_import_transformers() -> float:
    """What `validate --deep` cannot do without: a fresh interpreter importing the loaders it calls."""
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "from transformers import AutoConfig, AutoTokenizer"], check=True, timeout=120
    )
    return time.monotonic() - started


def _run_refused_beside_ray(assets: Path, tmp_path: Path, model: Path, expected: str) -> str:
    """`rljob run` of the example on `model`: refused in one line with `expected`, exit 2, within Ray's
    start and stop, and none of Ray's processes left. Its stderr."""
    job = _job(assets, tmp_path, lambda s: s["model"].update(path=str(model)))
    marker = f"rljob-setup-test-{os.getpid()}-{time.monotonic_ns()}"
    started = time.monotonic()
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=assets,
        env={**_env(assets), "RLJOB_SETUP_TEST_MARK": marker},
    )
    seconds = time.monotonic() - started
    # Ray's start and stop come on top of the check (and a pool's start on top of a pool's refusal): seconds still.
    _assert_one_line(done, seconds, expected, rc=2, within=RAY_AND_CHECK_SECONDS)
    assert not _processes_with(marker), "Ray's processes outlived the refused run"
    return done.stderr
