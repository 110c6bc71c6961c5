"""The real node's fixtures, one set-up for every module that runs pods for real: a pytest plugin, which a
module loads with `pytest_plugins = ["real_node_fixtures"]`.

- `real_cluster` (one per session): the e2e control plane with KubeRay and the real node (kubelet,
  containerd, kube-proxy, CoreDNS); `real_cluster.times` holds how long each part took to come up;
- `real_operator` (one per session): the operator and worker-test images pushed to the node's registry
  (TLS, authentication: e2e/node-registry.sh), which every pod pulls them from (none is imported: containerd
  1.6's CRI lost an imported name once the same image was pulled under another), the worker environment's
  mount policy, and the operator installed from the packaged chart, pulled from that
  registry as an OCI artifact, into a pod whose image the node pulls with a pull Secret.

A module that adds objects of its own to them (namespaces, volumes) deletes them when it ends, so the
next module finds the node as these fixtures left it. Both skip, naming what is missing, where the
machine cannot run containers or the images are not built.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from e2e_cluster import Cluster, missing_binaries, real_node_missing
from e2e_real import images_env, images_missing, install_operator, worker_env_policy
from e2e_registry import PULL_SECRET, PackagedChart, Registry, project_version, push_chart, push_images

# What every module that runs pods on the real node is: it needs the e2e cluster and containers, and the
# machine to itself. A module adds its own marks after these.
REAL_NODE_MARKS = [pytest.mark.cluster, pytest.mark.node, pytest.mark.serial]


@dataclass
class RealCluster:
    """The control plane with KubeRay and the real node, and how long each part took."""

    cluster: Cluster
    times: dict[str, float] = field(default_factory=dict)


@dataclass
class RealOperator:
    """The operator, installed by its chart on the real node, and the images it and the pools run."""

    images: dict[str, str]  # e2e/images.sh env: the images built here, the worker environment
    registry: Registry
    chart: PackagedChart
    worker_image: str  # the worker-test image in the registry, pulled with a PULL_SECRET Secret
    namespace: str = "rljob-system"


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    missing = missing_binaries() + real_node_missing()
    if missing:
        pytest.skip(f"cannot run a real node here: missing {'; '.join(missing)}")
    root = tmp_path_factory.mktemp("real-node")
    root.chmod(0o755)  # the pods' user reads the volumes below the session's folders
    real = RealCluster(Cluster(root / "state"))
    try:
        t0 = time.monotonic()
        real.cluster.start(kuberay=True)
        real.times["control plane + KubeRay"] = time.monotonic() - t0
        real.times["real node"] = real.cluster.start_node()
        yield real
    finally:
        real.cluster.script("clean")


@pytest.fixture(scope="session")
def real_operator(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> RealOperator:
    missing = images_missing()
    if missing:
        pytest.skip(f"cannot run the operator's pods here: missing {'; '.join(missing)}")
    cluster, times = real_cluster.cluster, real_cluster.times
    folder = tmp_path_factory.mktemp("registry-client")
    registry, images, version = Registry.of(cluster), images_env(), project_version()
    t0 = time.monotonic()
    push_images(registry, folder, "operator", "worker-test")
    chart = push_chart(cluster, registry, folder)
    times["images and chart pushed"] = time.monotonic() - t0
    repository = f"{registry.address}/rljob"
    operator = RealOperator(images, registry, chart, f"{repository}/rljob-worker-test:{version}")
    for doc in worker_env_policy(images["RLJOB_E2E_WORKER_ENV"], operator.worker_image):
        cluster.apply(doc)
    cluster.kubectl("create", "namespace", operator.namespace)
    cluster.apply(registry.pull_secret(operator.namespace))
    oci = [chart.reference, "--version", chart.version, "--ca-file", str(registry.ca)]
    times["helm install (operator Ready)"] = install_operator(
        cluster,
        f"{repository}/rljob-operator:{version}",
        [*oci, "--registry-config", str(folder / "helm.json")],
        PULL_SECRET,
        operator.namespace,
    )
    return operator
