"""Packaging rules: the operator pulls in no torch or ray; workers pull in no kopf."""

from __future__ import annotations

import re
import subprocess
import sys

import tomllib

from conftest import REPO

HEAVY = ("torch", "ray", "transformers", "vllm", "sglang")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_operator_install_pulls_in_no_torch_or_ray():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    operator_deps = _names(project["dependencies"]) | _names(project["optional-dependencies"]["operator"])
    assert not operator_deps & set(HEAVY)


def test_workers_install_pulls_in_no_kopf():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    worker_deps = _names(project["dependencies"]) | _names(project["optional-dependencies"]["workers"])
    assert "kopf" not in worker_deps
    assert not worker_deps & {"vllm", "sglang"}


def test_importing_operator_imports_no_torch_or_ray():
    code = (
        "import sys, rljob_operator, rljob_api, rljob_api.crd;"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r});"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_operator_folder_does_not_shadow_the_stdlib():
    assert not (REPO / "operator" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert "python3" in out.stdout and str(REPO / "operator") not in out.stdout
