"""A job whose image the node cannot pull says so, on the real node (e2e/README.md): the kubelet's
ErrImagePull / ImagePullBackOff reaches the RLJob's status (the Degraded condition, the pool's, the message)
and a Warning Event, naming the pod and the image, within a minute of `kubectl apply`; not a silent
Provisioning. The registry here is one that does not answer, so the pull fails as it does without
credentials (a registry with authentication on the test network is not built yet)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_cluster import wait_for
from e2e_real import cluster_job, diagnose

if TYPE_CHECKING:  # pytest loads it, as a plugin, below
    from real_node_fixtures import RealCluster, RealOperator

pytest_plugins = ["real_node_fixtures"]
pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.serial, pytest.mark.timeout(600)]

NS = "rljob-e2e-images"
# Nothing listens there: the node's containerd is refused at once, and the kubelet backs off.
UNPULLABLE = "127.0.0.1:5999/rljob/rljob-worker:no-such-tag"
SHOWN_WITHIN = 60.0


def _pull_failure(status: dict[str, Any]) -> dict[str, Any] | None:
    degraded: dict[str, Any] = next((c for c in status.get("conditions") or () if c.get("type") == "Degraded"), {})
    return status if degraded.get("reason") == "ImagePullFailed" else None


def test_a_job_whose_image_cannot_be_pulled_says_so_within_a_minute(
    real_cluster: RealCluster, real_operator: RealOperator
) -> None:
    cluster = real_cluster.cluster
    job = cluster_job(NS, UNPULLABLE)
    job["spec"]["imagePullPolicy"] = "IfNotPresent"
    for part in ("model", "data", "checkpoint"):  # no claims: the pods are scheduled, then pull
        job["spec"][part].pop("volume", None)
    name = job["metadata"]["name"]
    cluster.kubectl("create", "namespace", NS)
    try:
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        try:
            status = wait_for(
                "Degraded: ImagePullFailed",
                lambda: _pull_failure((cluster.get("rlj", name, NS) or {}).get("status") or {}),
                timeout=SHOWN_WITHIN,
                every=1.0,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
        took = time.monotonic() - started
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert UNPULLABLE in degraded["message"] and "pod " in degraded["message"], degraded
        assert status["phase"] == "Provisioning" and UNPULLABLE in status["message"], status
        assert any(c["reason"] == "ImagePullFailed" for c in status["conditions"] if c["type"].endswith("Ready"))
        events = json.loads(
            cluster.kubectl(
                "get", "events", "-n", NS, "-o", "json",
                "--field-selector", f"involvedObject.kind=RLJob,involvedObject.name={name},reason=ImagePullFailed",
            ).stdout
        )["items"]  # fmt: skip
        assert events and UNPULLABLE in events[0]["message"] and events[0]["type"] == "Warning", events
        described = cluster.kubectl("describe", "rlj", name, "-n", NS).stdout
        print(f"\nImagePullFailed {took:.1f}s after apply: {degraded['message']}\n{described[-1500:]}")
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", "--ignore-not-found", check=False)
