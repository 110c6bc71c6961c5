"""The real node's registry (e2e/node-registry.sh: CNCF distribution, TLS from the cluster's CA, htpasswd
authentication), used as a cluster user uses theirs: the images pushed there by `e2e/images-push.sh` (what
`make images REGISTRY=... PUSH=1` runs), the chart packaged by `helm package` and pushed as an OCI artifact,
and a `kubernetes.io/dockerconfigjson` Secret that the pods pull with."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e_cluster import CHART, E2E, REPO, Cluster

PULL_SECRET = "rljob-registry"


@dataclass(frozen=True)
class Registry:
    address: str  # host:port
    user: str
    password: str
    ca: Path  # the cluster's CA, which signed the registry's certificate
    cert_dir: Path  # ca.crt alone, for buildah's --cert-dir

    @classmethod
    def of(cls, cluster: Cluster) -> Registry:
        """The registry of the running node, from what e2e/node.sh wrote for its clients."""
        lines = (cluster.state / "node" / "registry" / "registry.env").read_text().splitlines()
        env = dict(line.split("=", 1) for line in lines if "=" in line)
        return cls(
            env["RLJOB_E2E_REGISTRY"],
            env["RLJOB_E2E_REGISTRY_USER"],
            env["RLJOB_E2E_REGISTRY_PASSWORD"],
            Path(env["RLJOB_E2E_REGISTRY_CA"]),
            Path(env["RLJOB_E2E_REGISTRY_CERT_DIR"]),
        )

    def docker_config(self) -> str:
        """~/.docker/config.json's form (buildah's auth.json and a pull Secret's .dockerconfigjson alike)."""
        auth = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.address: {"auth": auth}}})

    def pull_secret(self, namespace: str, name: str = PULL_SECRET) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": self.docker_config()},
        }


def project_version() -> str:
    """The version every image, the chart and the CRD's default worker image are tagged with."""
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


def push_images(registry: Registry, folder: Path, *images: str) -> dict[str, str]:
    """`e2e/images-push.sh <registry>/rljob IMAGE...` with the registry's credentials in an auth file and its
    CA; returns each pushed reference's digest."""
    auth = folder / "auth.json"
    auth.write_text(registry.docker_config())
    auth.chmod(0o600)
    env = {"REGISTRY_AUTH_FILE": str(auth), "RLJOB_REGISTRY_CERT_DIR": str(registry.cert_dir)}
    out = subprocess.run(
        ["bash", str(E2E / "images-push.sh"), f"{registry.address}/rljob", *images],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if out.returncode:
        raise AssertionError(f"images-push.sh failed:\n{out.stderr[-3000:]}")
    return dict(line.split() for line in out.stdout.splitlines() if line.strip())


@dataclass(frozen=True)
class PackagedChart:
    reference: str  # oci://host:port/charts/rljob-operator
    version: str
    package: Path  # the .tgz `helm package` wrote


def push_chart(cluster: Cluster, registry: Registry, folder: Path) -> PackagedChart:
    """`helm package` of the chart, `helm registry login`, `helm push` to oci://<registry>/charts."""
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    helm(cluster, folder, "package", str(CHART), "--destination", str(folder))
    package = folder / f"{meta['name']}-{meta['version']}.tgz"
    helm(
        cluster, folder, "registry", "login", registry.address, "--username", registry.user,
        "--password-stdin", "--ca-file", str(registry.ca), input=registry.password,
    )  # fmt: skip
    helm(cluster, folder, "push", str(package), f"oci://{registry.address}/charts", "--ca-file", str(registry.ca))
    return PackagedChart(f"oci://{registry.address}/charts/{meta['name']}", str(meta["version"]), package)


def helm(cluster: Cluster, folder: Path, *args: str, input: str | None = None, timeout: float = 120) -> str:
    """helm with this session's registry login (its own registry config, not the machine user's)."""
    out = subprocess.run(
        [str(Path(cluster.env["RLJOB_E2E_BIN"]) / "helm"), *args, "--registry-config", str(folder / "helm.json")],
        env=cluster.env, input=input, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if out.returncode:
        raise AssertionError(f"helm {' '.join(args[:2])} failed: {out.stderr[-2000:]}")
    return out.stdout


def pulled_images(cluster: Cluster, registry: Registry) -> list[str]:
    """The images of this registry that the node's containerd holds (it pulled them: none is imported)."""
    sock = cluster.state / "node" / "containerd" / "containerd.sock"
    out = subprocess.run(
        ["ctr", "--address", str(sock), "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return sorted(ref for ref in out.stdout.split() if ref.startswith(f"{registry.address}/"))
