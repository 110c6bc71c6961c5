"""The real node's fixtures, one set-up for every module that runs pods for real: a pytest plugin, which a
module loads with `pytest_plugins = ["real_node_fixtures"]`.

- `real_cluster` (one per session): the e2e control plane with KubeRay and the real node (kubelet,
  containerd, kube-proxy, CoreDNS); `real_cluster.times` holds how long each part took to come up;
- `real_operator` (one per session): the operator and worker-test images in the node's containerd, the
  worker environment's mount policy, and the operator installed by its Helm chart into a pod there.

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
from e2e_real import images_env, images_missing, import_images, install_operator, worker_env_policy


@dataclass
class RealCluster:
    """The control plane with KubeRay and the real node, and how long each part took."""

    cluster: Cluster
    times: dict[str, float] = field(default_factory=dict)


@dataclass
class RealOperator:
    """The operator, installed by its chart on the real node, and the images it and the pools run."""

    images: dict[str, str]
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
def real_operator(real_cluster: RealCluster) -> RealOperator:
    missing = images_missing()
    if missing:
        pytest.skip(f"cannot run the operator's pods here: missing {'; '.join(missing)}")
    cluster, times = real_cluster.cluster, real_cluster.times
    operator = RealOperator(images_env())
    times["images import"] = import_images(cluster)
    images = operator.images
    for doc in worker_env_policy(images["RLJOB_E2E_WORKER_ENV"], images["RLJOB_E2E_WORKER_TEST_IMAGE"]):
        cluster.apply(doc)
    times["helm install (operator Ready)"] = install_operator(
        cluster, images["RLJOB_E2E_OPERATOR_IMAGE"], operator.namespace
    )
    return operator
