"""The fixtures the operator's e2e modules share: a pytest plugin, which a module loads with
`pytest_plugins = ["e2e_fixtures"]` (and does not import: its RLJob helpers are e2e_jobs.py's).

- `cluster` (one per module): a control plane from e2e/cluster.sh with three fake CPU nodes; a module
  that needs other nodes defines its own `cluster`, and the fixtures below use that one;
- `crd`: the RLJob CRD installed (RLJOB_TEST_CRD=path installs another file than
  crds/rljob.io_rljobs.yaml, to try a regenerated one before committing it);
- `control`, `fake`: a stand-in ControlService (see e2e_cluster.FakeControl);
- `operator`: `python -m rljob_operator` with the chart's ServiceAccount and RBAC, its log in pytest's
  temporary folder (the path is printed);
- `ns`: a fresh namespace per test, named after it (prefix: the module's NS_PREFIX, else "t").
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from e2e_cluster import (
    CRD,
    E2E,
    Cluster,
    FakeControl,
    OperatorProcess,
    fake_control,
    fresh_namespace,
    install_crd,
    start_operator,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("e2e-state"))
    try:
        c.start()
        pools = ["--pool", "cpu:3:0"]
        subprocess.run(
            [sys.executable, str(E2E / "nodes.py"), "apply", str(E2E / "pools.example.yaml"), *pools],
            env=c.env,
            check=True,
            capture_output=True,
        )
        yield c
    finally:
        c.script("clean")


@pytest.fixture(scope="module")
def crd(cluster: Cluster) -> str:
    return install_crd(cluster, os.environ.get("RLJOB_TEST_CRD", str(CRD)))


@pytest.fixture(scope="module")
def control() -> Iterator[tuple[FakeControl, int]]:
    with fake_control() as served:
        yield served


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster,
    crd: str,
    control: tuple[FakeControl, int],
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorProcess]:
    folder = tmp_path_factory.mktemp(f"operator-{request.module.__name__}")
    op = start_operator(cluster, control[1], folder / "operator.log")
    yield op
    op.stop()


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    with fresh_namespace(cluster, request.node.name, getattr(request.module, "NS_PREFIX", "t")) as name:
        yield name


@pytest.fixture
def fake(control: tuple[FakeControl, int]) -> Iterator[FakeControl]:
    control[0].status, control[0].delay = None, 0.0
    yield control[0]
    control[0].status, control[0].delay = None, 0.0
