"""Images and the chart from a registry with credentials, on the real node (e2e/README.md).

The shared fixture pushed the operator and worker-test images to the node's registry (TLS from the
cluster's CA, htpasswd authentication: e2e/node-registry.sh) with `e2e/images-push.sh`, pushed the chart
that `helm package` made as an OCI artifact, and installed the operator from it, its image pulled with the
chart's `imagePullSecrets`. Here: what runs is what was pulled, and a job whose pods pull without the
job's pull Secret says so: the kubelet's ErrImagePull / ImagePullBackOff (the registry's 401) reaches the
RLJob's status (the Degraded condition, the pool's, the message) and a Warning Event, naming the pod and
the image, within a minute of `kubectl apply`; not a silent Provisioning."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from e2e_cluster import Cluster, wait_for
from e2e_real import cluster_job, diagnose
from e2e_registry import PULL_SECRET, helm, project_version, pulled_images

if TYPE_CHECKING:  # pytest loads it, as a plugin, below
    from real_node_fixtures import RealCluster, RealOperator

pytest_plugins = ["real_node_fixtures"]
pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.serial, pytest.mark.timeout(600)]

NS = "rljob-e2e-images"
SHOWN_WITHIN = 60.0


POOL_CONDITIONS = ("RolloutReady", "TrainerReady", "RewardReady")


def _pull_events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    selector = f"involvedObject.kind=RLJob,involvedObject.name={name},reason=ImagePullFailed"
    found = cluster.kubectl("get", "events", "-n", NS, "-o", "json", "--field-selector", selector).stdout
    return list(json.loads(found)["items"])


def _pull_failure(status: dict[str, Any]) -> dict[str, Any] | None:
    """The status once it says ImagePullFailed both as the job's Degraded condition and as every pool's Ready
    condition. Degraded counts the head's and the driver's pods too, a pool's condition its own pods only:
    a poll can see the head's pull fail before a pool's (a CI run did), so the test waits for all of them."""
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    told = all(conditions.get(kind, {}).get("reason") == "ImagePullFailed" for kind in ("Degraded", *POOL_CONDITIONS))
    return status if told else None


def test_a_job_whose_image_cannot_be_pulled_says_so_within_a_minute(
    real_cluster: RealCluster, real_operator: RealOperator
) -> None:
    cluster = real_cluster.cluster
    unpullable = real_operator.worker_image  # there, but only for a client with the registry's credentials
    job = cluster_job(NS, unpullable)
    del job["spec"]["imagePullSecrets"]  # and no Secret in NS either
    job["spec"]["imagePullPolicy"] = "Always"  # the node may hold it already (pulled with the Secret)
    for part in ("model", "data", "checkpoint"):  # no claims: the pods are scheduled, then pull
        job["spec"][part].pop("volume", None)
    name = job["metadata"]["name"]
    cluster.kubectl("create", "namespace", NS)
    try:
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        try:
            status = wait_for(
                "Degraded and every pool's Ready condition: ImagePullFailed",
                lambda: _pull_failure((cluster.get("rlj", name, NS) or {}).get("status") or {}),
                timeout=SHOWN_WITHIN,
                every=1.0,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
        took = time.monotonic() - started
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert unpullable in degraded["message"] and "pod " in degraded["message"], degraded
        assert status["phase"] == "Provisioning" and unpullable in status["message"], status
        pools = [c for c in status["conditions"] if c["type"] in POOL_CONDITIONS]
        assert len(pools) == 3 and all(unpullable in c["message"] and c["status"] == "False" for c in pools), pools
        try:  # the operator posts the Event after it has written the status: a poll can see the status first
            events = wait_for("the ImagePullFailed Event", lambda: _pull_events(cluster, name), timeout=15, every=0.5)
        except AssertionError as exc:
            operator_log = cluster.kubectl(
                "logs", "-n", real_operator.namespace, "deploy/rljob-rljob-operator", check=False
            )
            raise AssertionError(f"{exc}\n{operator_log.stdout[-3000:]}") from None
        assert unpullable in events[0]["message"] and events[0]["type"] == "Warning", events
        described = cluster.kubectl("describe", "rlj", name, "-n", NS).stdout
        print(f"\nImagePullFailed {took:.1f}s after apply: {degraded['message']}\n{described[-1500:]}")
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", "--ignore-not-found", check=False)


def test_the_operator_runs_from_the_packaged_chart_and_the_registry(
    real_cluster: RealCluster, real_operator: RealOperator
) -> None:
    cluster, registry, chart = real_cluster.cluster, real_operator.registry, real_operator.chart
    version = project_version()
    # one version for the package, the app and the images (Chart.yaml, pyproject.toml, the pushed tags)
    assert chart.package.name == f"rljob-operator-{version}.tgz" and chart.version == version, chart
    listed = helm(cluster, chart.package.parent, "list", "-n", real_operator.namespace, "-o", "json")
    releases = [(r["name"], r["chart"], r["app_version"], r["status"]) for r in json.loads(listed)]
    assert releases == [("rljob", f"rljob-operator-{version}", version, "deployed")], releases
    pods = cluster.objects("pods", real_operator.namespace, "app.kubernetes.io/name=rljob-operator")
    operator_image = f"{registry.address}/rljob/rljob-operator:{version}"
    assert [c["image"] for pod in pods for c in pod["spec"]["containers"]] == [operator_image], pods
    assert [s["name"] for pod in pods for s in pod["spec"]["imagePullSecrets"]] == [PULL_SECRET]
    assert operator_image in pulled_images(cluster, registry)
    print(f"\ninstalled {chart.reference}:{chart.version}; the node pulled {pulled_images(cluster, registry)}")
