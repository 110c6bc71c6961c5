"""spec.logging.trackers: the shared run of the shipped example (tests/researcher_run.py) records each step in
TensorBoard, W&B (offline) and MLflow (a file store), each read back with the tracker's own reader and compared
with the run's metrics.jsonl and eval.jsonl; a tracker that cannot start is refused in one line naming it, before
Ray starts."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from researcher_run import GROUP, STEPS, WANDB_PROJECT, ResearcherRun

from rljob_api import RLJobInvalid, parse_rljob
from rljob_api.tracking import LoggingSpec
from rljob_workers.driver.telemetry.trackers.base import scalars
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO

pytestmark = pytest.mark.ray

RLJOB = str(Path(sys.executable).parent / "rljob")
# A refusal reads the job and looks for each tracker's library and folder: well under 2 s alone, given more
# beside another test on this shared machine (the time is printed).
REFUSAL_SECONDS = 5.0


EVAL_EVERY = 2


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trackers")
    return {
        "train": write_jsonl(root / "train.jsonl", make_problems(256, seed=10_000)),
        "eval": write_jsonl(root / "eval.jsonl", make_problems(16, seed=20_000)),
    }


def _job(work: Path, model: Path, data: dict[str, Path], logging: dict[str, Any]) -> Path:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(model), str(data["train"])
    spec["data"]["eval"] = {"path": str(data["eval"]), "everySteps": EVAL_EVERY}
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    spec["algorithm"]["totalSteps"] = STEPS
    spec["logging"] = logging
    work.mkdir(parents=True, exist_ok=True)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    return job


def _run(job: Path, out: Path, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    return done, time.monotonic() - started


# ---- the trackers record the run (tests/researcher_run.py: all three, W&B offline, MLflow's default store) -------


def test_tensorboard_has_every_step_of_metrics_jsonl(researcher_run: ResearcherRun) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(researcher_run.out / "tensorboard"))
    events.Reload()
    records = researcher_run.records
    for tag in ("reward_mean", "train_metrics/policy_loss", "counts/generated"):
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        expected = [(r["step"], pytest.approx(scalars(r)[tag], rel=1e-6)) for r in records]  # float32 in the file
        assert logged == expected, tag
    logged = [(e.step, e.value) for e in events.Scalars("eval/reward_mean")]
    assert logged == [(e["step"], pytest.approx(e["reward_mean"], rel=1e-6)) for e in researcher_run.evals]
    assert "eval/pass_at_k/1" in events.Tags()["scalars"]
    settings = events.Tensors("config")[0].tensor_proto.string_val[0].decode()
    assert "| `algorithm.learningRate` | `0.0001` |" in settings
    assert "| `algorithm.advantageEstimator` | `group-relative` |" in settings  # resolved from the preset


def _wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file, read with W&B's own protobuf: the file is a LevelDB-style log (a 7-byte
    header, then 32 KiB blocks of chunks, each with a 7-byte header: CRC, length, FULL/FIRST/MIDDLE/LAST)."""
    # re-exported from the module of the installed protobuf's major version, which mypy does not follow
    from wandb.proto.wandb_internal_pb2 import Record  # type: ignore[attr-defined]

    block, data = 32768, path.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    position, chunks = 7, []
    while position + 7 <= len(data):
        left = block - position % block
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left < 7 or (kind == 0 and length == 0):  # a block's padding
            position += left
            continue
        chunks.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record


def test_wandb_offline_run_has_every_step_and_the_config(researcher_run: ResearcherRun) -> None:
    folders = sorted((researcher_run.out / "wandb").glob("offline-run-*"))
    assert len(folders) == 1, "spec.logging.wandb.mode offline wins over WANDB_MODE=online"
    (log,) = folders[0].glob("*.wandb")
    records = list(_wandb_records(log))
    history = {
        int(r.history.step.num): {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    }
    assert sorted(history) == [0] + [r["step"] for r in researcher_run.records]  # 0: the eval before training
    for record in researcher_run.records:
        assert history[record["step"]]["reward_mean"] == pytest.approx(record["reward_mean"])
        assert history[record["step"]]["counts/generated"] == record["counts"]["generated"]
    for evaluation in researcher_run.evals:  # at the step it ran: in the row of that step's train numbers
        assert history[evaluation["step"]]["eval/reward_mean"] == pytest.approx(evaluation["reward_mean"])
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == (WANDB_PROJECT, "arithmetic")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["algorithm"]["learningRate"] == 0.0001 and config["algorithm"]["name"] == "grpo"
    (end,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert end.exit_code == 0


def test_mlflow_file_store_has_every_step_and_the_settings(
    researcher_run: ResearcherRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to read a file store
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(researcher_run.out / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("arithmetic")  # the job's name
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert (run.info.run_name, run.info.status) == ("arithmetic", "FINISHED")
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "reward_mean")]
    assert history == [(r["step"], pytest.approx(r["reward_mean"])) for r in researcher_run.records]
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/reward_mean")]
    assert history == [(e["step"], pytest.approx(e["reward_mean"])) for e in researcher_run.evals]
    params = run.data.params
    assert params["algorithm.name"] == "grpo" and params["algorithm.learningRate"] == "0.0001"
    assert params["algorithm.groupSize"] == str(GROUP) and params["algorithm.totalSteps"] == str(STEPS)
    assert params["algorithm.advantageEstimator"] == "group-relative"  # the preset's, as the run used it


def _sample_logs(researcher_run: ResearcherRun) -> dict[int, list[dict[str, Any]]]:
    """Each step's sample log (samples/step-NNNNNN.jsonl) as the rows a tracker's table should hold."""
    logs = {}
    for path in sorted((researcher_run.out / "samples").glob("step-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        logs[int(path.stem.removeprefix("step-"))] = [
            {**{k: line[k] for k in SAMPLE_COLUMNS}, **{f"score/{k}": v for k, v in line["scores"].items()}}
            for line in lines
        ]
    assert sorted(logs) == [r["step"] for r in researcher_run.records]
    return logs


SAMPLE_COLUMNS = ("prompt_id", "prompt", "completion", "reward", "advantage", "policy_version", "truncated")


def _table_rows(table: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]


def test_each_tracker_has_each_steps_samples_as_a_table(researcher_run: ResearcherRun) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = _sample_logs(researcher_run)
    # TensorBoard: a markdown table per step in the Text tab, one row per sample
    events = EventAccumulator(str(researcher_run.out / "tensorboard"))
    events.Reload()
    tables = {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors("samples")}
    assert sorted(tables) == sorted(logs)
    for step, rows in logs.items():
        lines = tables[step].splitlines()
        assert lines[0] == "| " + " | ".join(rows[0]) + " |" and len(lines) == 2 + len(rows), tables[step]
        assert all(str(row["advantage"]) in line for row, line in zip(rows, lines[2:], strict=True))
    # W&B: a wandb.Table per step, in the history row of that step, its file in the offline run's files/
    (folder,) = (researcher_run.out / "wandb").glob("offline-run-*")
    (log,) = folder.glob("*.wandb")
    logged = {  # the table's fields are nested keys of that step's history row: samples/_type, samples/path
        int(r.history.step.num): {"/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in _wandb_records(log)
        if r.WhichOneof("record_type") == "history"
    }
    rows_with_table = {step: row for step, row in logged.items() if row.get("samples/_type") == "table-file"}
    assert sorted(rows_with_table) == sorted(logs)
    for step, rows in logs.items():
        table = json.loads((folder / "files" / rows_with_table[step]["samples/path"]).read_text())
        assert _table_rows(table) == rows, step
    # MLflow: samples/step-NNNNNN.json artifacts, each the table as log_table writes it (columns, data)
    artifacts = _mlflow_artifacts(researcher_run.out / "mlruns")
    for step, rows in logs.items():
        assert _table_rows(json.loads((artifacts / "samples" / f"step-{step:06d}.json").read_text())) == rows


def _mlflow_artifacts(store: Path) -> Path:
    """The artifact folder of the one run in a file store (<experiment>/<run>/artifacts)."""
    (artifacts,) = [p for p in store.glob("*/*/artifacts") if p.is_dir()]
    return artifacts


def test_trackers_leave_the_terminal_to_the_run(researcher_run: ResearcherRun) -> None:
    assert "wandb:" not in researcher_run.output


# ---- set-up refusals ----------------------------------------------------------------------------------------------


def _hide_module(folder: Path, module: str) -> dict[str, str]:
    """An environment where `module` is not installed, as Python tells it: sys.modules[name] = None."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def _refusals(tmp_path: Path) -> dict[str, tuple[dict[str, Any], dict[str, str], str]]:
    """case -> (spec.logging, extra environment, the line expected)."""
    out = tmp_path / "out"
    return {
        "wandb not installed": (
            {"trackers": ["tensorboard", "wandb"], "wandb": {"mode": "offline"}},
            _hide_module(tmp_path / "site", "wandb"),
            "spec.logging.trackers[1]: wandb is not installed (pip install 'rljob[wandb]')",
        ),
        "tensorboard folder not writable": (
            {"trackers": ["tensorboard"]},
            {},
            f"spec.logging.trackers[0]: tensorboard cannot write to {out / 'tensorboard'}: it is a file, not a folder",
        ),
        "mlflow URI of no store": (
            {
                "trackers": ["wandb", "mlflow"],
                "wandb": {"mode": "offline"},
                "mlflow": {"trackingUri": "ftp://x.org/runs"},
            },
            {},
            "spec.logging.trackers[1]: mlflow: spec.logging.mlflow.trackingUri 'ftp://x.org/runs' is not a tracking "
            "URI MLflow takes",
        ),
        "mlflow file store not writable": (
            {"trackers": ["mlflow"], "mlflow": {"trackingUri": "file:///proc/rljob-mlruns"}},
            {},
            "spec.logging.trackers[0]: mlflow cannot write to /proc/rljob-mlruns: ",
        ),
    }


@pytest.mark.serial
@pytest.mark.parametrize(
    "case",
    [
        "wandb not installed",
        "tensorboard folder not writable",
        "mlflow URI of no store",
        "mlflow file store not writable",
    ],
)
def test_a_tracker_that_cannot_start_is_refused_in_one_line_before_ray(
    tmp_path: Path, example_model: Path, data: dict[str, Path], case: str
) -> None:
    logging, env, expected = _refusals(tmp_path)[case]
    if case == "tensorboard folder not writable":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "tensorboard").write_text("a file where the event files' folder would go\n")
    ray_dir = tmp_path / "ray"  # where Ray would put its session, had it started
    done, seconds = _run(
        _job(tmp_path, example_model, data, logging), tmp_path / "out", {**env, "RAY_TMPDIR": str(ray_dir)}
    )
    lines = done.stderr.strip().splitlines()
    print(f"{seconds:.1f}s: {done.stderr.strip()}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(expected)
    assert seconds < REFUSAL_SECONDS
    assert not ray_dir.exists(), "Ray started"


def test_validate_deep_refuses_a_tracker_that_is_not_installed(
    tmp_path: Path, example_model: Path, data: dict[str, Path]
) -> None:
    job = _job(tmp_path, example_model, data, {"trackers": ["mlflow"]})
    done = subprocess.run(
        [RLJOB, "validate", "--deep", str(job)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **_hide_module(tmp_path / "site", "mlflow")},
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "spec.logging.trackers[0]: mlflow is not installed (pip install 'rljob[mlflow]')"


# ---- the schema -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("logging", "expected"),
    [
        ({"trackers": ["tensorboard", "tensorboard"]}, "spec.logging.trackers[1]: tensorboard is named twice"),
        ({"trackers": ["tensorboard"], "wandb": {"project": "p"}}, "spec.logging.wandb: is set but wandb is not in"),
        ({"trackers": ["mlflow"], "mlflow": {"trackingUri": ""}}, "spec.logging.mlflow.trackingUri: String should"),
        ({"trackers": ["wandb"], "wandb": {"mode": "disabled"}}, "spec.logging.wandb.mode: 'disabled' is not one of"),
    ],
)
def test_the_spec_refuses_trackers_it_cannot_run(example_doc: dict, logging: dict, expected: str) -> None:
    example_doc["spec"]["logging"] = logging
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(example_doc)
    assert str(info.value.errors[0]).startswith(expected)


def test_each_logging_rule_has_its_cel_twin() -> None:
    messages = [r["message"] for r in LoggingSpec.model_json_schema()["x-kubernetes-validations"]]
    assert messages == [
        "trackers: each tracker at most once",
        "wandb settings need wandb in trackers",
        "mlflow settings need mlflow in trackers",
    ]


def test_a_metrics_line_becomes_its_numbers() -> None:
    line = {
        "step": 3,
        "reward_mean": 0.5,
        "counts": {"generated": 64},
        "train_metrics": {"policy_loss": -0.1},
        "prompt_ids": ["a", "b"],
        "checkpoint": None,
        "logprob_mismatch_mean": None,
        "flag": True,
        "bad": float("nan"),
    }
    assert scalars(line) == {"reward_mean": 0.5, "counts/generated": 64.0, "train_metrics/policy_loss": -0.1}
