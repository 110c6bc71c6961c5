"""The job's own pods only, as rendered: its NetworkPolicy, the token in every pool pod and the driver,
locked-down security contexts and their overrides (the API server's acceptance of them is the e2e
suites': every rendered child is applied there)."""

from __future__ import annotations

from typing import Any

import pytest
from test_operator_render import OPERATOR_PEER, SCRAPER_PEER, by_kind, gpu_job, one, rendered

from rljob_api import derive_worker_configs
from rljob_operator.options import RenderOptions

# -- the job's own pods only: NetworkPolicy, token, security contexts -----------------------------


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template by role: head, each pool, driver."""
    cluster = one(docs, "RayCluster")["spec"]
    specs = {"head": cluster["headGroupSpec"]["template"]["spec"]}
    specs.update({g["groupName"]: g["template"]["spec"] for g in cluster["workerGroupSpecs"]})
    specs["driver"] = one(docs, "Job")["spec"]["template"]["spec"]
    return specs


def test_network_policy_admits_the_jobs_pods_the_operator_and_scrapers_only() -> None:
    job = gpu_job()
    ports = derive_worker_configs(job).ports
    policy = one(rendered(job), "NetworkPolicy")
    own = {"podSelector": {"matchLabels": {"rljob.io/job": "qwen-math-grpo"}}}
    assert policy["spec"]["podSelector"] == own["podSelector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open unless the chart restricts it
    assert policy["spec"]["ingress"] == [
        {"from": [own]},
        {"from": [OPERATOR_PEER], "ports": [{"protocol": "TCP", "port": ports.control}]},
        {"from": [SCRAPER_PEER], "ports": [{"protocol": "TCP", "port": ports.metrics}]},
    ]
    # Every pod of the job is selected by it: the head, the pools and the driver.
    cluster = one(rendered(job), "RayCluster")["spec"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    templates.append(one(rendered(job), "Job")["spec"]["template"])
    assert all(t["metadata"]["labels"]["rljob.io/job"] == "qwen-math-grpo" for t in templates)


def test_network_policy_egress_and_opt_out() -> None:
    dns = {"to": [{"namespaceSelector": {}}], "ports": [{"protocol": "UDP", "port": 53}]}
    restricted = one(rendered(gpu_job(), RenderOptions(egress=(dns,))), "NetworkPolicy")["spec"]
    assert restricted["policyTypes"] == ["Ingress", "Egress"]
    assert restricted["egress"] == [{"to": [{"podSelector": {"matchLabels": {"rljob.io/job": "qwen-math-grpo"}}}]}, dns]
    assert not by_kind(rendered(gpu_job(), RenderOptions(network_policy=False)), "NetworkPolicy")
    # Without peers the operator and scrapers are not let in: only the job's own pods are.
    assert one(rendered(gpu_job(), RenderOptions()), "NetworkPolicy")["spec"]["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"rljob.io/job": "qwen-math-grpo"}}}]}
    ]


def test_pool_pods_and_driver_get_the_token_the_head_does_not() -> None:
    for role, spec in pod_specs(rendered(gpu_job())).items():
        (main,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in main["env"]}
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert mounts["/tmp"]["name"] in volumes and "emptyDir" in volumes[mounts["/tmp"]["name"]], role
        if role == "head":
            assert "RLJOB_TOKEN_FILE" not in env and "/var/run/rljob" not in mounts
            continue
        assert env["RLJOB_TOKEN_FILE"] == "/var/run/rljob/token", role
        assert mounts["/var/run/rljob"]["readOnly"] is True, role
        secret = volumes[mounts["/var/run/rljob"]["name"]]["secret"]
        assert secret == {"secretName": "qwen-math-grpo-token", "items": [{"key": "token", "path": "token"}]}, role


LOCKED_POD = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "runAsGroup": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
    # the pods write a fresh claim (root's): its group is theirs, set once, not walked at each start
    "fsGroup": 1000,
    "fsGroupChangePolicy": "OnRootMismatch",
}
LOCKED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def test_pods_are_locked_down_by_default() -> None:
    for role, spec in pod_specs(rendered(gpu_job())).items():
        assert spec["securityContext"] == LOCKED_POD, role
        assert spec["containers"][0]["securityContext"] == LOCKED_CONTAINER, role


def test_security_context_overridden_per_pool_and_for_the_job() -> None:
    job = gpu_job(**{"rollout.securityContext": {"capabilitiesAdd": ["IPC_LOCK"], "readOnlyRootFilesystem": False}})
    specs = pod_specs(rendered(job))
    rollout = specs["rollout"]["containers"][0]["securityContext"]
    assert rollout == {
        **LOCKED_CONTAINER,
        "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    assert specs["trainer"]["containers"][0]["securityContext"] == LOCKED_CONTAINER
    job = gpu_job(securityContext={"runAsUser": 2000, "fsGroup": 3000})
    for role, spec in pod_specs(rendered(job)).items():
        assert spec["securityContext"] == {**LOCKED_POD, "runAsUser": 2000, "fsGroup": 3000}, role
    with pytest.raises(Exception, match=r"spec.securityContext.runAsUser: is 0 \(root\) but runAsNonRoot is true"):
        gpu_job(securityContext={"runAsUser": 0})
