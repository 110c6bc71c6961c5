"""A `kind: image` environment on a cluster (#56): examples/agent-gpu-cluster.yaml renders its environment pool as a
worker group whose pods run the environment's own image beside the Ray worker (the image contract: port, token
file, health as readiness, the spec's resources), placed where the spec says, reached only by the job's pods."""

from __future__ import annotations

import json
from typing import Any

import yaml
from test_operator_render import REPO, by_kind, groups, one, rendered

from rljob_api import derive_worker_configs, parse_rljob


def agent_job() -> Any:
    return parse_rljob(yaml.safe_load((REPO / "examples" / "agent-gpu-cluster.yaml").read_text()))


def test_the_environment_group_runs_the_environments_image_beside_the_ray_worker() -> None:
    job = agent_job()
    docs = rendered(job)
    pools = groups(docs)
    assert set(pools) == {"rollout", "trainer", "environment"}  # the environment gives the reward: no reward pool
    environment = pools["environment"]
    assert (environment["replicas"], environment["minReplicas"], environment["maxReplicas"]) == (2, 2, 16)
    pod = environment["template"]["spec"]
    assert pod["nodeSelector"] == {"rljob.io/pool": "cpu"}
    ray, own = pod["containers"]  # KubeRay's Ray container first
    assert ray["name"] == "ray-worker" and ray["image"] == job.spec.image
    assert ray["resources"] == {"requests": {"cpu": "500m"}}  # the supervising actor's CPU only
    assert own["name"] == "environment" and own["image"] == "ghcr.io/rljob/calculator-environment-ts:0.1.0"
    env = {e["name"]: e["value"] for e in own["env"]}
    assert env == {
        "RLJOB_TOKEN_FILE": "/var/run/rljob/token",
        "RLJOB_ENVIRONMENT_PORT": "50055",
        "RLJOB_STEP_LATENCY_SECONDS": "0",
    }
    assert own["ports"] == [{"name": "environment", "containerPort": 50055}]
    assert own["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    assert own["readinessProbe"]["grpc"] == {"port": 50055}
    assert {m["mountPath"] for m in own["volumeMounts"]} == {"/tmp", "/var/run/rljob"}
    assert pod["securityContext"]["runAsNonRoot"] is True  # the pod's user, for both containers
    assert own["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    resources = json.loads(environment["rayStartParams"]["resources"].strip("'"))
    assert resources == {"rljob.io/environment": 1}
    # the actor in the pod stands for the container: it waits for the container's port, serves nothing itself
    config = derive_worker_configs(job).environment
    assert config is not None and (config.class_ref, config.container_port) == (None, 50055)


def test_only_the_jobs_own_pods_reach_the_environment_port() -> None:
    policy = one(rendered(agent_job()), "NetworkPolicy")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"rljob.io/job": "qwen-tool-agent"}}
    open_to_all_ports = [rule for rule in policy["ingress"] if "ports" not in rule]
    assert open_to_all_ports == [{"from": [{"podSelector": {"matchLabels": {"rljob.io/job": "qwen-tool-agent"}}}]}]
    others = [rule for rule in policy["ingress"] if "ports" in rule]
    assert all(50055 not in [p["port"] for p in rule["ports"]] for rule in others)


def test_a_python_environment_has_one_container_and_no_image_of_its_own() -> None:
    doc = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    pod = groups(rendered(parse_rljob(doc)))["environment"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["ray-worker"]
    assert by_kind(rendered(parse_rljob(doc)), "RayCluster")


def test_an_environment_container_that_keeps_crashing_is_degraded_naming_the_pool() -> None:
    from datetime import datetime, timezone

    from rljob_api.workercfg import Pool
    from rljob_operator.status.compute import compute_status
    from rljob_operator.status.observe import DriverInfo, Observed, PodInfo, pod_info

    crashing = pod_info(
        {
            "metadata": {"name": "qwen-tool-agent-environment-x"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "ray-worker", "image": "w", "state": {"running": {}}},
                    {
                        "name": "environment",
                        "image": "ghcr.io/rljob/calculator-environment-ts:0.1.0",
                        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
                    },
                ],
            },
        }
    )
    ready = PodInfo("p", "Running", True)
    pods: dict[Pool, tuple[PodInfo, ...]] = {"rollout": (ready,), "trainer": (ready,), "environment": (crashing,)}
    observed = Observed(ray_cluster=True, head=ready, pods=pods, driver=DriverInfo(pod=ready))
    status = compute_status(agent_job(), observed, None, now=datetime(2026, 1, 1, tzinfo=timezone.utc))
    [degraded] = [c for c in status.conditions if c.type == "Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "CrashLoopBackOff")
    assert degraded.message.startswith("pods of pool environment keep crashing; pod qwen-tool-agent-environment-x: ")
    assert (
        "container environment (ghcr.io/rljob/calculator-environment-ts:0.1.0) keeps exiting (exit code 1, Error)"
        in (degraded.message)
    )


def test_kind_image_needs_its_image_and_nothing_of_the_other_kinds() -> None:
    import pytest

    from rljob_api import RLJobInvalid

    doc = yaml.safe_load((REPO / "examples" / "agent-gpu-cluster.yaml").read_text())
    del doc["spec"]["environment"]["image"]
    with pytest.raises(RLJobInvalid, match=r"spec\.environment\.image: must be set exactly when kind is image"):
        parse_rljob(doc)
    doc = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    doc["spec"]["environment"]["command"] = ["node", "server.js"]
    with pytest.raises(RLJobInvalid, match=r"spec\.environment\.command: applies to kind image, not python"):
        parse_rljob(doc)
