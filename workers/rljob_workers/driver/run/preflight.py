"""Set-up checks that run before any pool starts: a job that cannot start fails here, in seconds,
with one line naming the field (and the file:line of a bad data row).

`rljob run` (and so the operator's driver pod) runs them before it starts Ray; `rljob validate
--deep` runs them alone. They check what the schema cannot: that the files exist and parse,
that the model folder loads, that every rule imports and takes the job's fields, that the
trainer's freeze patterns match the model's weights, that a named engine is installed, and that
the driver's ports are free.
"""

from __future__ import annotations

import inspect
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from rljob_api import RLJob
from rljob_api.reward import RewardFunction
from rljob_workers.common.chat import has_chat_template
from rljob_workers.common.field_values import short_name
from rljob_workers.common.freeze import frozen_names
from rljob_workers.driver.controller.data import DataError, check_rows
from rljob_workers.driver.errors import SetupError, first_line
from rljob_workers.driver.pools.environment import EnvironmentInfo
from rljob_workers.driver.run.environment_check import check_environment
from rljob_workers.driver.run.plan import RunPlan
from rljob_workers.driver.telemetry.trackers import TrackerError, check_installed
from rljob_workers.reward.base import RewardConfigError
from rljob_workers.reward.callables import load_function
from rljob_workers.reward.conventions import peer_arguments, resolve_signature
from rljob_workers.reward.functions import RESERVED_ARGS
from rljob_workers.reward.modelpool import declares

# Rows of the data the set-up checks convert as a draw would (the rest are checked as they are drawn, a bad
# one set aside): enough to catch a file's systematic fault, few enough for a million-row file's start.
CHECKED_ROWS = 10_000
# Engines that are optional extras: named by a job, they must be importable here and in the pools.
OPTIONAL_ENGINES = {"vllm": "vllm", "sglang": "sglang"}


def prepare(plan: RunPlan) -> EnvironmentInfo | None:
    """Every set-up check (`rljob validate --deep`, and `rljob run --cluster` before it joins Ray); what
    spec.environment's Info said. On a cluster the rollout engine is not looked for here: the rollout pods run
    an image of their own (spec.rollout.image); the driver's ports must be free instead."""
    check_quickly(plan)
    environment = check_environment(plan.job, cluster=plan.cluster)
    check_models(plan.job)
    if plan.cluster:
        check_ports_free({"control": plan.configs.ports.control, "metrics": plan.configs.ports.metrics})
    return environment


def check_quickly(plan: RunPlan) -> None:
    """The checks that take well under a second: the data rows, the engines (in the rollout pool's
    interpreter), the trackers, the rules, the model folders, the chat template, the frozen weights."""
    job = plan.job
    check_data(job)
    check_engines(job, plan.rollout_python, rollout=not plan.cluster)
    check_trackers(job)
    check_rewards(job)
    for path, field in _model_folders(job):
        check_model_folder(path, field)
    check_chat_template(job)
    check_freeze(job)


def check_models(job: RLJob, *, without_torch: bool = False) -> None:
    """Every model folder loads: the policy's and each reward model's (see `check_model`)."""
    for path, field in _model_folders(job):
        check_model(path, field, without_torch=without_torch)


def _model_folders(job: RLJob) -> Iterator[tuple[str, str]]:
    """Each model folder the job names, with the field that names it."""
    yield job.spec.model.path, "spec.model.path"
    for where, function in _indexed(job.spec.reward.functions):
        model = function.disrm or function.genrm
        if model is not None:
            yield model.model_path, f"{where}.{function.kind}.modelPath"


def _hint(path: str) -> str:
    return " (make the example's with `make model`)" if ".cache/" in path else ""


def check_model_folder(path: str, field: str) -> None:
    """A folder with a config.json (no import needed to tell)."""
    folder = Path(path)
    if not folder.exists():
        raise SetupError(f"{field}: {path} does not exist{_hint(path)}")
    if not folder.is_dir():
        raise SetupError(f"{field}: {path} is a file, not a model folder")
    if not (folder / "config.json").is_file():
        raise SetupError(f"{field}: {path} has no config.json: not a transformers model folder")


def check_model(path: str, field: str, *, without_torch: bool = False) -> None:
    """A transformers model folder whose config and tokenizer load with no network.

    `without_torch` (`rljob run`, whose pools start beside the driver on the same cores): a folder
    with a tokenizer.json (what fast tokenizers save) is read by `tokenizers` and its JSON files
    parsed. transformers would import torch, seconds of CPU taken from the pools' start; a
    model type it does not know is then told by the pools as they load it. Other tokenizer formats,
    and `rljob validate --deep`, load with transformers itself."""
    check_model_folder(path, field)
    folder = Path(path)
    try:
        if without_torch and (folder / "tokenizer.json").is_file():
            _load_without_torch(folder)
        else:
            from transformers import AutoConfig, AutoTokenizer

            AutoConfig.from_pretrained(folder, local_files_only=True)
            AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # any loader failure is this folder's fault; say which and why
        raise SetupError(f"{field}: {path} does not load: {type(exc).__name__}: {first_line(exc)}") from None


def _load_without_torch(folder: Path) -> None:
    """config.json names a model type, the other JSON files parse, tokenizer.json loads; an error
    names its file."""
    from tokenizers import Tokenizer

    config = _read(folder / "config.json", lambda path: json.loads(path.read_text()))
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError("config.json names no model_type")
    for name in ("tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (folder / name).is_file():
            _read(folder / name, lambda path: json.loads(path.read_text()))
    _read(folder / "tokenizer.json", lambda path: Tokenizer.from_file(str(path)))


def _read(path: Path, reader: Callable[[Path], object]) -> object:
    """`reader(path)`; its error as a ValueError that starts with the file's name."""
    try:
        return reader(path)
    except Exception as exc:
        raise ValueError(f"{path.name}: {first_line(exc)}") from None


def check_freeze(job: RLJob) -> None:
    """spec.trainer.freeze matches the policy's weights, by the names in the model folder's safetensors
    headers (no model load). Without safetensors files, the trainer checks it when it loads the model."""
    patterns = job.spec.trainer.freeze
    names = weight_names(Path(job.spec.model.path)) if patterns else None
    if names:
        try:
            frozen_names(patterns, names)
        except ValueError as exc:
            raise SetupError(str(exc)) from None


def weight_names(folder: Path) -> list[str] | None:
    """The weight names a transformers model folder holds; None when it has no safetensors files."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # a sharded checkpoint names every weight in its index
        return sorted(json.loads(index.read_text())["weight_map"])
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    names: list[str] = []
    for file in files:
        with safe_open(str(file), framework="numpy") as weights:
            names += weights.keys()
    return names


def check_data(job: RLJob) -> None:
    """The data file (and the eval file, where spec.data.eval is set) exists, is a file, and every row parses
    with the prompt and fields the spec names."""
    data = job.spec.data
    _check_rows(job, data.path, "spec.data.path", data.split)
    if data.eval is not None:
        _check_rows(job, data.eval.path, "spec.data.eval.path", data.eval.split)


def _check_rows(job: RLJob, file: str, field: str, split: str) -> None:
    data = job.spec.data
    path = Path(file)
    if not path.exists():
        raise SetupError(f"{field}: {file} does not exist{_hint(file)}")
    try:
        check_rows(path, data.prompt_field, list(data.fields), data.messages_field, split=split, rows=CHECKED_ROWS)
    except DataError as exc:
        raise SetupError(f"{field}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SetupError(f"{field}: {file}: not UTF-8 text ({exc.reason})") from None


def check_chat_template(job: RLJob) -> None:
    """Messages data and a system prompt go into the model's chat template: a model without one is refused."""
    data, model = job.spec.data, job.spec.model.path
    if data.chat_template == "off" or has_chat_template(model):
        return
    where = "tokenizer_config.json's chat_template or chat_template.jinja"
    if data.messages_field is not None:
        raise SetupError(
            f"spec.data.messagesField: the model {model} has no chat template to render messages with ({where})"
        )
    if data.system_prompt is not None:
        raise SetupError(f"spec.data.systemPrompt: the model {model} has no chat template to put it in ({where})")


def _indexed(functions: list[RewardFunction]) -> Iterator[tuple[str, RewardFunction]]:
    for index, function in enumerate(functions):
        yield f"spec.reward.functions[{index}]", function


def check_rewards(job: RLJob) -> None:
    """Every rule imports and accepts the job's fields (reward model folders: `check_models`)."""
    fields = [short_name(f) for f in job.spec.data.fields if short_name(f) not in RESERVED_ARGS]
    # messages data and episodes: the conversation too
    messages = job.spec.data.messages_field is not None or job.spec.environment is not None
    for where, function in _indexed(job.spec.reward.functions):
        if function.rule is not None:
            _check_rule(f"{where}.rule.function", function, fields, messages=messages)


def rule_conventions(job: RLJob) -> list[str]:
    """How each rule function is called and why (`rljob validate --deep` prints them), once they import."""
    lines = []
    for where, function in _indexed(job.spec.reward.functions):
        if function.rule is not None:
            fn = load_function(function.name, function.rule.function)
            convention, why = resolve_signature(fn, function.rule.signature)
            lines.append(f"{where} {function.name!r}: called as {convention} ({why})")
    return lines


def _check_rule(field: str, function: RewardFunction, fields: list[str], *, messages: bool = False) -> None:
    assert function.rule is not None
    ref = function.rule.function
    try:
        fn = load_function(function.name, ref)
    except RewardConfigError as exc:
        raise SetupError(f"{field}: {exc}") from None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable: nothing to check before it is called
    convention, why = resolve_signature(fn, function.rule.signature)
    if convention != "rljob":  # TRL's or verl's form: bound as its adapter will call it
        peer = peer_arguments(convention, "", "", None, dict.fromkeys(fields, ""))
        try:
            signature.bind(**peer)
        except TypeError as exc:
            called = f"called as {convention} ({why}) with {', '.join(peer)}"
            raise SetupError(f"{field}: {ref}{signature}, {called}: {exc}") from None
        return
    # What the reward pool passes besides the fields: `sample` and `judge` to a rule that declares them.
    extra: dict[str, object] = {name: None for name in ("sample", "judge") if declares(fn, name)}
    if messages:  # messages data: the conversation too
        extra["messages"] = []
    try:
        signature.bind(prompt="", completion="", **dict.fromkeys(fields, ""), **extra)
    except TypeError as exc:
        given = "prompt, completion" + (", messages (spec.data.messagesField)" if messages else "")
        raise SetupError(
            f"{field}: {ref}{signature} cannot be called with {given}"
            f"{''.join(', ' + f for f in fields)} (spec.data.fields): {exc}"
        ) from None


def check_engines(job: RLJob, rollout_python: str | None = None, *, rollout: bool = True) -> None:
    """An optional engine the job names is installed: the rollout pool's in its interpreter (`rollout_python`,
    None: this one; `rollout` False: not looked for), a genrm judge's in this one (the reward pool's)."""
    from rljob_workers.driver.placement.runtimes import RolloutRuntimeError, has_module

    named = [("spec.rollout.engine", job.spec.rollout.engine, rollout_python)] if rollout else []
    named += [
        (f"{where}.genrm.engine", f.genrm.engine, None) for where, f in _indexed(job.spec.reward.functions) if f.genrm
    ]
    for field, engine, python in named:
        module = OPTIONAL_ENGINES.get(engine)
        try:
            installed = module is None or has_module(python, module)
        except RolloutRuntimeError as exc:
            raise SetupError(f"{field}: {exc}") from None
        if installed:
            continue
        if python is not None:
            raise SetupError(f"{field}: engine {engine} is not installed in --rollout-python {python}")
        hint = f"pip install 'rljob[{engine}]'"
        if engine == "vllm" and field == "spec.rollout.engine":
            hint += ", or build its own runtime with runtimes/vllm.sh and pass its python as --rollout-python"
        raise SetupError(f"{field}: engine {engine} is not installed ({hint})")


def check_trackers(job: RLJob) -> None:
    """Every tracker spec.logging.trackers names is installed. Its folder and tracking URI are checked once the
    run's output is known (`trackers.check_startable`), before Ray starts too."""
    try:
        check_installed(job.spec.logging)
    except TrackerError as exc:
        raise SetupError(str(exc)) from None


def check_ports_free(ports: dict[str, int]) -> None:
    """The driver's listening ports are free on every interface."""
    for name, port in ports.items():
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError as exc:
                raise SetupError(f"ports.{name}: port {port} is taken ({exc.strerror})") from None
