"""benchmarks/gpu/run.py: the CPU smoke run prints every row and holds its bars; a failed bar fails the
exit status; on a CUDA device the full check runs (skipped, with the reason, where torch sees none)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from conftest import REPO, load_script

SCRIPT = REPO / "benchmarks" / "gpu" / "run.py"
# check -> its status when it holds on a CPU: "info" rows are measured side by side with no bar
ROWS = {
    "trainer step": "info",
    "hf engine": "info",
    "weight sync": "pass",
    "fp32 masters, lr 1e-6": "pass",
    "behaviour log-probs": "pass",
}


def run_check(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def table_rows(stdout: str) -> dict[str, dict[str, str]]:
    """The printed table's rows by check, each as {column: cell}."""
    lines = [line for line in stdout.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in lines[1:]]
    return {row["check"]: row for row in rows}


def assert_every_row_holds(
    out: subprocess.CompletedProcess[str], expected: dict[str, str]
) -> dict[str, dict[str, str]]:
    assert out.returncode == 0, out.stdout + out.stderr
    rows = table_rows(out.stdout)
    assert {check: row["status"] for check, row in rows.items()} == expected, out.stdout
    for check in ("trainer step", "hf engine", "weight sync"):  # each measured against its baseline
        assert rows[check]["ratio"].startswith("speed "), rows[check]
        float(rows[check]["ratio"].split()[1].rstrip(","))
    return rows


def load_check() -> ModuleType:
    return load_script(SCRIPT, "gpu_check_run")


def test_quick_cpu_run_prints_every_row_and_holds_its_bars() -> None:
    out = run_check("--device", "cpu", "--quick", timeout=300)
    print(out.stdout)
    rows = assert_every_row_holds(out, ROWS)
    assert "CPU: peak RSS growth" in rows["hf engine"]["note"]  # says which memory a CPU run measures
    assert "gloo" in rows["weight sync"]["baseline"]


def test_a_failed_bar_fails_the_exit_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    check = load_check()
    rows = [check.Row("trainer step", "1 s/step"), check.Row("behaviour log-probs", "max abs diff 1", ok=False)]
    monkeypatch.setattr(check, "build_model", lambda out, size: tmp_path)
    monkeypatch.setattr(check, "return_freed_memory", lambda: None)
    monkeypatch.setattr(check, "run_checks", lambda *args: rows)
    assert check.main(["--device", "cpu", "--quick"]) == 1
    rows[1].ok = True
    assert check.main(["--device", "cpu", "--quick"]) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_asking_for_cuda_without_one_says_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_check().main(["--device", "cuda"]) == 77
    assert "SKIPPED: --device cuda needs a CUDA device" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_full_check_on_cuda() -> None:
    out = run_check("--device", "cuda", timeout=1500)
    print(out.stdout)
    rows = assert_every_row_holds(out, ROWS | {"hf engine": "pass"})  # on CUDA: speed >= 0.9, memory <= 1.3
    assert "max_memory_allocated" in rows["hf engine"]["note"]
