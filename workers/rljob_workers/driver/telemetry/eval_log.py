"""Where each held-out eval round goes: a line of the run's eval.jsonl (its own file, so that no reader of
metrics.jsonl's train steps meets one) and the eval gauges of the run's metrics."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rljob_workers.driver.controller.eval_report import EvalReport
from rljob_workers.driver.telemetry.files import EVAL_JSONL
from rljob_workers.driver.telemetry.metrics import RunMetrics
from rljob_workers.driver.telemetry.trackers import Trackers


def eval_record(report: EvalReport) -> dict[str, Any]:
    """One JSON-able line of eval.jsonl (JSON's keys are text: pass@k's k too)."""
    record = asdict(report)
    record["pass_at_k"] = {str(k): v for k, v in report.pass_at_k.items()}
    return record


def read_evals(path: Path) -> list[dict[str, Any]]:
    """The rounds of an eval.jsonl, perhaps still being written: its complete lines only."""
    if not path.exists():
        return []
    *complete, _ = path.read_text().split("\n")
    return [json.loads(line) for line in complete if line.strip()]


class EvalLog:
    """Records each round: appended to <output>/eval.jsonl in one write, and set on the eval gauges."""

    def __init__(self, output: Path, metrics: RunMetrics, trackers: Trackers | None = None) -> None:
        self.path = output / EVAL_JSONL
        self.metrics = metrics
        self.trackers = trackers or Trackers()  # spec.logging.trackers: each round's numbers as eval/..., at its step

    def record(self, report: EvalReport) -> None:
        record = eval_record(report)
        line = (json.dumps(record) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)
        self.metrics.update_eval(report)
        self.trackers.log(report.step, {"eval": {k: v for k, v in record.items() if k != "step"}})
