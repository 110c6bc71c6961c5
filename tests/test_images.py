"""The images e2e/images.sh builds from docker/*.Dockerfile, checked at the process boundary.

No kubelet and no registry: the operator image is built (cached per content hash; about 1.5 min
cold here, a second when cached), its OCI archive is read for the image config, and it is imported
into a private containerd and run there with runc (`e2e/images.sh smoke`). The worker-test image
with its mounted environment is checked the same way when it has been built (`e2e/images.sh
worker-test`, about 6 GB; not built by this test). Skips name what the machine lacks.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO

IMAGES = REPO / "e2e" / "images.sh"
HEAVY = ("torch", "ray", "transformers")
pytestmark = [pytest.mark.timeout(1800), pytest.mark.node, pytest.mark.serial, pytest.mark.slow]
# command -> the Debian package that has it
TOOLS = {
    "buildah": "buildah",
    "mmdebstrap": "mmdebstrap",
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
}


def _lacking() -> str:
    if os.name != "posix" or not Path("/proc/mounts").exists():
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (buildah chroot isolation, containerd)"
    missing = sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd) is None})
    return f"needs the Debian packages {', '.join(missing)} (apt-get install {' '.join(missing)})" if missing else ""


needs_builder = pytest.mark.skipif(bool(_lacking()), reason=_lacking() or "-")


def _images(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(IMAGES), *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO)


def _env(tree: Path = REPO, **env: str) -> dict[str, str]:
    """`images.sh env` of the tree `tree` (the repository's by default), with `env` added to the environment."""
    out = subprocess.run(
        ["bash", str(tree / "e2e" / "images.sh"), "env"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tree, env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None, name
    return member.read()


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    return _member(tar, "blobs/sha256/" + digest.removeprefix("sha256:"))


def _read_archive(path: Path) -> tuple[dict, dict, list[str]]:
    """(index, image config, every path in the layers) of a one-image OCI archive."""
    with tarfile.open(path) as tar:
        index = json.loads(_member(tar, "index.json"))
        manifest = json.loads(_blob(tar, index["manifests"][0]["digest"]))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        names: list[str] = []
        for layer in manifest["layers"]:
            data = _blob(tar, layer["digest"])
            if layer["mediaType"].endswith("+gzip"):
                data = gzip.decompress(data)
            with tarfile.open(fileobj=io.BytesIO(data)) as lt:
                names += lt.getnames()
    return index, config, names


@pytest.fixture(scope="module")
def operator_archive() -> tuple[str, Path]:
    out = _images("operator")
    assert out.returncode == 0, out.stdout + out.stderr
    env = _env()
    return env["RLJOB_E2E_OPERATOR_IMAGE"], Path(env["RLJOB_E2E_OPERATOR_ARCHIVE"])


def test_env_names_one_image_per_content_hash():
    env = _env()
    assert env["RLJOB_E2E_OPERATOR_IMAGE"].startswith("rljob.e2e/rljob-operator:")
    assert env["RLJOB_E2E_WORKER_TEST_IMAGE"].startswith("rljob.e2e/rljob-worker-test:")
    assert env["RLJOB_E2E_WORKER_ENV_MOUNT"] == "/opt/rljob/venv"
    tag = env["RLJOB_E2E_OPERATOR_IMAGE"].rsplit(":", 1)[1]
    assert Path(env["RLJOB_E2E_OPERATOR_ARCHIVE"]).parent.name == f"src-{tag}"


def test_the_environment_is_rebuilt_for_a_dependency_not_for_a_tool_setting(tmp_path: Path) -> None:
    """The worker environment (about 6 GB) is keyed by pyproject.toml's dependency tables: a pytest setting
    changes the rljob package's hash (the operator image's tag) only; a dependency changes both."""
    tree = tmp_path / "repo"
    for name in ("e2e", "docker", "api", "operator", "workers", "proto/gen"):
        shutil.copytree(REPO / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "constraints.txt", ".dockerignore", "README.md"):
        shutil.copy(REPO / name, tree / name)

    def tags() -> tuple[str, str]:
        env = _env(tree, RLJOB_E2E_CACHE=str(tmp_path / "cache"))
        return env["RLJOB_E2E_WORKER_TEST_IMAGE"], env["RLJOB_E2E_OPERATOR_IMAGE"]

    pyproject = tree / "pyproject.toml"
    before = tags()
    pyproject.write_text(pyproject.read_text().replace('addopts = "-ra"', 'addopts = "-ra -q"'))
    after_setting = tags()
    assert after_setting[0] == before[0] and after_setting[1] != before[1], (before, after_setting)
    pyproject.write_text(pyproject.read_text().replace('"pyyaml>=6"', '"pyyaml>=6.0.1"'))
    after_dependency = tags()
    assert after_dependency[0] != before[0] and after_dependency[1] != after_setting[1], (before, after_dependency)


def test_worker_dockerfile_has_the_test_target():
    text = (REPO / "docker" / "worker.Dockerfile").read_text()
    assert "AS runtime" in text and "FROM runtime AS worker-test" in text
    # the full image is the last stage: `docker build` with no --target still builds it
    assert text.rstrip().splitlines()[-1] == 'CMD ["rljob", "--help"]'
    assert text.rindex("FROM runtime\n") > text.index("AS worker-test")


@needs_builder
def test_operator_image_config_and_contents(operator_archive):
    image, archive = operator_archive
    index, config, names = _read_archive(archive)
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == image
    assert config["config"]["Entrypoint"] == ["python", "-m", "rljob_operator"]
    assert config["config"]["User"] == "65532:65532"
    assert {"8080/tcp", "8081/tcp"} <= set(config["config"]["ExposedPorts"])
    packages = {n.split("-packages/")[1].split("/")[0] for n in names if "-packages/" in n}
    assert {"rljob_operator", "rljob_api", "kopf", "kubernetes"} <= packages
    assert not packages & set(HEAVY)


@needs_builder
def test_operator_image_runs_in_containerd(operator_archive):
    _, archive = operator_archive
    check = (
        "import sys, rljob_operator.process.handlers;"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r});"
        "print('heavy:', bad)"
    )
    script = f'python -m rljob_operator --help && python -c "{check}" && id -u'
    # read-only root file system, as the chart runs it
    out = _images("smoke", "--read-only", str(archive), "sh", "-c", script, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "usage: python -m rljob_operator" in out.stdout
    assert "heavy: []" in out.stdout
    assert out.stdout.split()[-1] == "65532"


@needs_builder
def test_worker_test_image_runs_rljob_from_the_mounted_environment():
    if _images("check", timeout=60).returncode != 0:
        pytest.skip("worker-test image and environment not built: e2e/images.sh worker-test (about 6 GB)")
    env = _env()
    mount = f"{env['RLJOB_E2E_WORKER_ENV']}:{env['RLJOB_E2E_WORKER_ENV_MOUNT']}"
    script = "command -v rljob ray wget bash && rljob --help && id -u"
    out = _images("smoke", "--mount", mount, env["RLJOB_E2E_WORKER_TEST_ARCHIVE"], "sh", "-c", script, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "/opt/rljob/venv/bin/rljob" in out.stdout
    assert out.stdout.split()[-1] == "1000"
