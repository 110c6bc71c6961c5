"""Shared fixtures: repository paths and the shipped example."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
import yaml

from rljob_api.workercfg import RAY_LOCAL_NODE_ENV
from rljob_workers.common.grpc_env import use_grpc_process_env

# This process forks Ray's daemons beside the gRPC servers and channels its tests leave running.
use_grpc_process_env()
# Every Ray this process starts, Ray's own `ray.init` baselines too, as the local node does: no metric
# exporter thread outlives its ray.shutdown() to crash this process as it exits.
for _name, _value in RAY_LOCAL_NODE_ENV.items():
    os.environ.setdefault(_name, _value)

# tests/leftovers.py: the session fails, naming it, when a test leaves something running.
# tests/researcher_run.py: the one run of the example that several modules read back.
pytest_plugins = ("leftovers", "researcher_run")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


# Each module's seconds in a full run (`.ci/slowest.py --write-durations`); a module not in it counts as this.
DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_MODULE_SECONDS = 30.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs pytest-xdist with --dist loadscope: a module's tests stay on one worker (its module
    fixtures run once). Each worker takes the modules longest first (--no-loadscope-reorder keeps this order;
    xdist's own puts the modules with the most tests first, and so a module of two or three long runs last,
    one worker idle)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], UNKNOWN_MODULE_SECONDS))


def load_script(path: Path, name: str) -> ModuleType:
    """A benchmark or check script imported as module `name` (registered: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny model (EOS likely) and 64 arithmetic prompts: for whole runs that test plumbing, not learning."""
    from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

    from tiny_models import char_llama

    root = tmp_path_factory.mktemp("assets")
    char_llama(root / "model", eos_bias=3.0)
    write_jsonl(root / "train.jsonl", make_problems(64, seed=1))
    return root


def actor_processes(driver_pid: int, actor_class: str) -> list[Any]:
    """The processes of one Ray actor class (its proctitle "ray::<Class>...") under a `rljob run` driver."""
    import psutil

    found = []
    for child in psutil.Process(driver_pid).children(recursive=True):
        try:
            if actor_class in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def kill_process_tree(pid: int) -> None:
    """SIGKILL a process and every process under it, and reap them. The tree is read before the kill: a
    driver killed alone leaves the Ray daemons and actors it started running on (Ray's agents for about a
    minute), no longer its children and so out of reach."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(tree, timeout=30)


class LearningRun(NamedTuple):
    returncode: int
    steps_when_signalled: int | None  # steps in metrics.jsonl when the SIGINT went; None if it never did


def run_until_learned(
    command: list[str], log: Path, metrics: Path, target: float, window: int, cwd: Path | None = None
) -> LearningRun:
    """Run `command` (an `rljob run`) until metrics.jsonl shows a `window`-step reward mean of `target`, then
    SIGINT it (a graceful stop); killed with its tree if still running after 600 s."""
    from rljob_workers.driver.telemetry.metrics import first_reaching, read_metrics

    with log.open("w") as sink:
        run = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd)
        signalled, deadline = None, time.monotonic() + 600
        while run.poll() is None and time.monotonic() < deadline:
            if signalled is None and first_reaching(records := read_metrics(metrics), target, window) is not None:
                run.send_signal(signal.SIGINT)
                signalled = len(records)
            time.sleep(0.1)
        if run.poll() is None:
            kill_process_tree(run.pid)
        return LearningRun(run.wait(), signalled)


# Tiny models built once per recipe on this machine, outside the clone: `.ci/run` starts from a fresh clone,
# where the example's model is about 45 s of CPU to build and the chat model 4-5 minutes.
MODEL_CACHE = Path(os.environ.get("RLJOB_MODEL_CACHE", Path.home() / ".cache" / "rljob" / "models"))


def cached_tiny_model(folder: Path, task: str = "arithmetic") -> Path:
    """`make_tiny_model(folder, task)`, copied from MODEL_CACHE/<task>-<recipe digest> (built there first when
    missing); under file locks, so that every session and pytest-xdist worker may ask at once."""
    from filelock import FileLock

    from rljob_workers.models.tiny import TASKS, TinyModelSpec, make_tiny_model, read_marker

    digest = TinyModelSpec(task=task, **TASKS[task]).digest()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{folder}.lock"):
        if read_marker(folder).get("digest") != digest:
            cached = MODEL_CACHE / f"{task}-{digest}"
            MODEL_CACHE.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{cached}.lock"):
                make_tiny_model(cached, task=task)
            part = folder.parent / f".{folder.name}.copy-{os.getpid()}"
            shutil.rmtree(part, ignore_errors=True)
            shutil.copytree(cached, part)
            shutil.rmtree(folder, ignore_errors=True)
            part.rename(folder)
    return folder


def built_ts_example(example: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TypeScript example of examples/ copied out of the repository, installed from its lock file with npm ci
    and compiled; skips, saying so, where node and npm are missing."""
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip(f"node and npm are needed to build {example.name} (node: {node}, npm: {npm})")
    root = tmp_path_factory.mktemp("ts") / example.name
    shutil.copytree(example, root, ignore=shutil.ignore_patterns("node_modules", "dist"))
    for command in (["ci", "--no-audit", "--no-fund"], ["run", "build"]):
        done = subprocess.run([npm, *command], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"npm {' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert (root / "dist" / "server.js").is_file()
    return root


@pytest.fixture(scope="session")
def calculator(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tool example's model, from the machine's model cache, and its data and held-out split as
    `rljob make-model` writes them (the command finds the model built and writes the data)."""
    from filelock import FileLock

    root = tmp_path_factory.mktemp("calculator")
    model = cached_tiny_model(REPO / ".cache" / "models" / "tiny-calculator", "calculator")
    data, held_out = root / "train.jsonl", root / "eval.jsonl"
    rljob = str(Path(sys.executable).parent / "rljob")
    with FileLock(f"{model}.lock"):
        args = [rljob, "make-model", "--task", "calculator", "--out", str(model), "--data", str(data)]
        done = subprocess.run([*args, "--eval-data", str(held_out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"model": model, "data": data, "eval": held_out}


@pytest.fixture(scope="session")
def chat_example(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, Path]:
    """The chat example's model, from the machine's model cache, and its data as `rljob make-model --task
    arithmetic-chat` writes them; and the plain example's model (no chat template)."""
    from filelock import FileLock

    data = tmp_path_factory.mktemp("chat") / "chat.jsonl"
    model = cached_tiny_model(REPO / ".cache" / "models" / "tiny-arith-chat", "arithmetic-chat")
    rljob = str(Path(sys.executable).parent / "rljob")
    with FileLock(f"{model}.lock"):
        args = [rljob, "make-model", "--task", "arithmetic-chat", "--out", str(model), "--data", str(data)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return {"model": model, "data": data, "plain_model": example_model}


@pytest.fixture(scope="session")
def example_model() -> Path:
    """The shipped example's tiny model, where `make model` builds it (.cache/models/tiny-arith): from the
    machine's model cache (`cached_tiny_model`), found there at once after the first build."""
    return cached_tiny_model(REPO / ".cache" / "models" / "tiny-arith")


@pytest.fixture(scope="session", autouse=True)
def example_eval_split() -> Path:
    """The shipped example's held-out eval split where the example names it (.cache/data/arithmetic-eval.jsonl,
    relative to the repository, where tests run), as `make model` writes it: a run of the example finds it,
    whatever data it trains on. Written once, whole (under a file lock, then renamed into place)."""
    from filelock import FileLock

    from rljob_workers.tasks.arithmetic import held_out_problems, make_problems, write_jsonl

    path = REPO / yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())["spec"]["data"]["eval"]["path"]
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not path.exists():  # `rljob make-model --eval-data`'s split, with its default seed and sizes
            held_out = held_out_problems(100, seed=20_000, train=make_problems(4096, seed=10_000))
            os.replace(write_jsonl(path.with_suffix(".part"), held_out), path)
    return path


@pytest.fixture
def example_doc() -> dict:
    """The shipped example as a plain document, for tests to break."""
    return yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())


# A local Ray cluster stays on 127.0.0.1 (read when ray is first imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Ray workers import test reward functions (`reward_fns:...`) from this folder.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p
)


# How long a raylet took to reach the object store it had just started, from its own log (raylet.out):
# the same reading for a local node and for a Ray pod.
RAYLET_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*"
# The raylet logs the first as it starts its store, the second once its object manager, which first
# connects to that store, serves.
RAYLET_MARKS = ("Starting object store", "ObjectManager server started")


def store_connect_seconds(log: str) -> float:
    """Seconds from the raylet starting its object store to serving its object manager."""
    found = [re.search(RAYLET_STAMP + line, log, re.M) for line in RAYLET_MARKS]
    if not all(found):
        raise AssertionError("raylet.out no longer says when its object store started and was reached:\n" + log)
    started, serving = (datetime.strptime(mark[1], "%Y-%m-%d %H:%M:%S,%f") for mark in found if mark)
    return (serving - started).total_seconds()
