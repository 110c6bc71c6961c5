"""The README's cluster quick start, word for word, on the e2e cluster's real node (`make e2e-quickstart`; not in
`make test`: it builds the 6 GB worker image and pushes it, more than CI's budget holds).

The test is the cluster's admin: the node takes any pod (its e2e taint lifted), the registry is the node's
(TLS from the cluster's CA, htpasswd authentication), and the default StorageClass hands out root-owned
`local` volumes (e2e/provisioner), as a cloud disk's fresh filesystem is root's. Then it is the user: in a
copy of the tree, `buildah login`, then the README's commands as the README prints them, in order, in bash,
with REGISTRY, REGISTRY_USER and REGISTRY_PASSWORD set; where the README points to docs/models-and-data.md to
fill the model's claim, that page's commands, with REGISTRY put in as the page says; `kubectl get rljobs -w`
is read until the job's line says Succeeded. Every pod must have run on the real node, pulling its image from
the registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_cluster import E2E, REPO, Cluster, wait_for
from e2e_real import NODE_SELECTOR, diagnose
from e2e_registry import Registry
from real_node_fixtures import REAL_NODE_MARKS, RealCluster

pytest_plugins = ["real_node_fixtures"]
pytestmark = [*REAL_NODE_MARKS, pytest.mark.quickstart, pytest.mark.timeout(3600)]

JOB, TAINT = "arithmetic", "rljob.io/e2e-real-node"
STORAGE_CLASS = "rljob-e2e-local"
NODE_LABELS = ",".join(f"{key}={value}" for key, value in NODE_SELECTOR.items())  # the real node's, for -l


def bash_block(markdown: Path, heading: str) -> str:
    """The first ```bash block after `heading` in `markdown`."""
    text = markdown.read_text()
    found = re.search(re.escape(heading) + r".*?```bash\n(.*?)```", text, re.S)
    assert found, f"no bash block after {heading!r} in {markdown.name}"
    return found.group(1)


@dataclass
class QuickStart:
    """The README's block cut where the user does something else: fill the claim (a pointer to another page),
    and watch (`-w` runs until interrupted)."""

    before_fill: str
    apply: str
    watch: str
    after_watch: str

    @classmethod
    def of(cls, block: str) -> QuickStart:
        lines = block.splitlines(keepends=True)
        fill = next(i for i, line in enumerate(lines) if line.startswith("# fill rljob-assets"))
        after_fill = next(i for i in range(fill, len(lines)) if not lines[i].startswith("#"))
        watch = next(i for i, line in enumerate(lines) if line.startswith("kubectl get rljobs -w"))
        return cls("".join(lines[:fill]), "".join(lines[after_fill:watch]), lines[watch], "".join(lines[watch + 1 :]))


@pytest.fixture(scope="module")
def admin(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The cluster as its admin left it for the user: the node untainted, a default StorageClass."""
    cluster = real_cluster.cluster
    root = tmp_path_factory.mktemp("volumes")
    built = subprocess.run(["bash", str(E2E / "build.sh"), "provisioner"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    log = (root / "provisioner.log").open("w")
    provisioner = subprocess.Popen(
        [built.stdout.strip(), "--kubeconfig", cluster.env["KUBECONFIG"], "--root", str(root / "volumes")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        cluster.kubectl("taint", "nodes", "-l", NODE_LABELS, f"{TAINT}-")
        cluster.apply({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "rljob.e2e/local-dir",
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        })  # fmt: skip
        yield cluster
    finally:
        for kind in ("rljob", "pod", "pvc"):
            cluster.kubectl("delete", kind, "--all", "-n", "default", "--wait=true", "--timeout=120s", check=False)
        cluster.kubectl("delete", "storageclass", STORAGE_CLASS, "--ignore-not-found", check=False)
        helm = Path(cluster.env["RLJOB_E2E_BIN"]) / "helm"
        subprocess.run([str(helm), "uninstall", "rljob-operator"], env=cluster.env, capture_output=True, check=False)
        cluster.kubectl("taint", "nodes", "-l", NODE_LABELS, f"{TAINT}=true:NoSchedule", "--overwrite", check=False)
        provisioner.send_signal(signal.SIGTERM)
        provisioner.wait(timeout=30)
        log.close()


def user_tree(folder: Path) -> Path:
    """A copy of the working tree's tracked files, where the user types the commands (helm package writes there)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source, target = REPO / name, folder / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return folder


def run(commands: str, env: dict[str, str], cwd: Path, timeout: float) -> str:
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"{commands}\nfailed (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def watch_until_succeeded(
    command: str, env: dict[str, str], cwd: Path, timeout: float, each_line: Callable[[str], None]
) -> list[str]:
    """`kubectl get rljobs -w`, as typed, read until the job's line says Succeeded (or Failed); its lines."""
    watch = subprocess.Popen(["bash", "-c", command], env=env, cwd=cwd, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        assert watch.stdout is not None
        for line in watch.stdout:
            lines.append(line.rstrip())
            each_line(line)
            if line.startswith(JOB) and re.search(r"\b(Succeeded|Failed)\b", line):
                break
            assert time.monotonic() < deadline, "\n".join(lines)
    finally:
        watch.terminate()
        watch.wait(timeout=30)
    return lines


def pods_seen(cluster: Cluster, seen: dict[str, tuple[str, tuple[str, ...]]]) -> None:
    """Each pod of the default namespace: its node and the images its containers run."""
    out = cluster.kubectl("get", "pods", "-n", "default", "-o", "json", check=False)
    for pod in json.loads(out.stdout or "{}").get("items", []):
        images = tuple(c.get("image", "") for c in pod.get("status", {}).get("containerStatuses", []))
        if images:
            seen[pod["metadata"]["name"]] = (pod["spec"].get("nodeName", ""), images)


def test_the_readme_quick_start_runs_as_written(admin: Cluster, registry_login: dict[str, str], tmp_path: Path) -> None:
    cluster, env = admin, registry_login
    steps = QuickStart.of(bash_block(REPO / "README.md", "### Quick start: the shipped example on a CPU node"))
    fill = bash_block(REPO / "docs" / "models-and-data.md", "## Filling a claim")
    tree = user_tree(tmp_path / "rljob")
    t0 = time.monotonic()
    run(steps.before_fill, env, tree, timeout=2400)  # images built and pushed, chart, secret, operator, claims
    pushed = time.monotonic() - t0
    # The page says: `REGISTRY` is where you pushed the images.
    run(fill.replace("REGISTRY/", env["REGISTRY"] + "/"), env, tree, timeout=900)
    run(steps.apply, env, tree, timeout=120)
    t1, seen = time.monotonic(), dict[str, tuple[str, tuple[str, ...]]]()
    try:
        lines = watch_until_succeeded(steps.watch, env, tree, 1200, lambda _: pods_seen(cluster, seen))
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(cluster, 'default')}") from None
    took = time.monotonic() - t1
    assert re.search(rf"^{JOB}\s+Succeeded\s+100\b", lines[-1]), "\n".join(lines)
    # Every pod (the operator's, the job's) ran on the real node, its image pulled from the registry.
    node = cluster.kubectl("get", "nodes", "-l", NODE_LABELS, "-o", "name")
    assert {where for where, _ in seen.values()} == {node.stdout.strip().removeprefix("node/")}, seen
    assert all(i.startswith(env["REGISTRY"] + "/") for _, images in seen.values() for i in images), seen
    assert any(name.startswith(f"{JOB}-") for name in seen), seen
    described_and_deleted = run(steps.after_watch, env, tree, timeout=300)
    assert "Succeeded" in described_and_deleted
    wait_for("the job's pods gone", lambda: not cluster.objects("pods", "default", f"rljob.io/job={JOB}"), 180)
    claims = cluster.kubectl("get", "pvc", "-n", "default", "-o", "name").stdout.split()
    assert sorted(claims) == ["persistentvolumeclaim/rljob-assets", "persistentvolumeclaim/rljob-runs"], claims
    print(f"\nimages built and pushed, operator and claims: {pushed:.0f}s; apply -> Succeeded: {took:.0f}s")
    print("\n".join(lines))
    print("\n".join(f"{name}: {where} {' '.join(images)}" for name, (where, images) in sorted(seen.items())))


@pytest.fixture
def registry_login(admin: Cluster, tmp_path: Path) -> dict[str, str]:
    """The user's shell: the cluster's kubectl and helm on PATH, REGISTRY and its credentials set, and `buildah
    login` done (its auth file in REGISTRY_AUTH_FILE; the registry's private CA given to buildah)."""
    registry = Registry.of(admin)
    env = {
        **admin.env,
        "REGISTRY": f"{registry.address}/rljob",
        "REGISTRY_USER": registry.user,
        "REGISTRY_PASSWORD": registry.password,
        "REGISTRY_AUTH_FILE": str(tmp_path / "auth.json"),
        "RLJOB_REGISTRY_CERT_DIR": str(registry.cert_dir),
    }
    login = ["buildah", "login", "--cert-dir", str(registry.cert_dir), "--username", registry.user]
    out = subprocess.run(
        [*login, "--password-stdin", registry.address], input=registry.password, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    os.chmod(tmp_path / "auth.json", 0o600)
    return env
