"""The environments `make setup` and runtimes/vllm.sh build carry their packages' bytecode: a process importing what a
pool imports compiles none of their sources, even where PYTHONDONTWRITEBYTECODE keeps Python from writing .pyc
files itself (as on this project's machines). Without it every pool actor compiled torch's and transformers'
sources again: 15 s of CPU each, two thirds of a short `rljob run` (benchmarks/bytecode)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

# What a pool process imports, each module's source compiled in it (outside this repo's own folders) counted.
IMPORTS = r"""
import json, sys
import importlib._bootstrap_external as external

compiled = []
original = external.SourceLoader.source_to_code

def counting(self, data, path, *args, **kwargs):
    compiled.append(str(path))
    return original(self, data, path, *args, **kwargs)

external.SourceLoader.source_to_code = counting
for name in sys.argv[1:]:
    __import__(name)
print(json.dumps([p for p in compiled if "site-packages" in p]))
"""

MAIN = ["torch", "transformers", "transformers.models.llama.modeling_llama", "ray", "grpc"]
VLLM = ["torch", "transformers", "vllm", "vllm.v1.engine.async_llm"]


def compiled_sources(python: str, modules: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run([python, "-c", IMPORTS, *modules], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_the_project_environment_imports_the_pools_packages_without_compiling_them() -> None:
    compiled = compiled_sources(sys.executable, MAIN)
    assert not compiled, f"{len(compiled)} sources compiled at import (make setup's bytecode missing): {compiled[:5]}"


def test_the_vllm_environment_imports_vllm_without_compiling_it() -> None:
    built = subprocess.run(["bash", str(REPO / "runtimes" / "vllm.sh"), "check"]).returncode == 0
    if not built:
        pytest.skip("the vLLM environment is not built here (runtimes/vllm.sh; .ci/run builds it)")
    python = subprocess.run(["bash", str(REPO / "runtimes" / "vllm.sh"), "path"], capture_output=True, text=True)
    compiled = compiled_sources(python.stdout.strip(), VLLM)
    assert not compiled, (
        f"{len(compiled)} sources compiled at import (no bytecode from runtimes/vllm.sh): {compiled[:5]}"
    )


def test_an_environment_without_bytecode_is_caught(tmp_path: Path) -> None:
    """The check above on a package installed without bytecode, as uv installs by default: it counts it."""
    package = tmp_path / "site-packages" / "uncompiled"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site-packages"), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORTS, "uncompiled"], capture_output=True, text=True, env=env, timeout=60
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [str(package / "__init__.py")], done.stdout + done.stderr
