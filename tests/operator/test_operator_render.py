"""Rendering an RLJob into its children: golden files for the examples, and the rules one by one.

Regenerate the golden files after an intended change with
`RLJOB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/operator/test_operator_render.py` and review the diff.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api import CheckpointVolumeSource, RLJob, derive_worker_configs, load_rljob, parse_rljob
from rljob_operator.options import ElasticGroup, ElasticGroups, Owner, RenderOptions
from rljob_operator.render.driver import DRIVER_COMMAND, driver_command, run_output_dir
from rljob_operator.render.dump import dump_all
from rljob_operator.render.manifests import absent_kinds, render
from rljob_workers.driver.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
OWNER_UID = "00000000-0000-0000-0000-000000000001"


# What the chart's defaults pass the operator (see charts/rljob-operator/templates/_helpers.tpl).
OPERATOR_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "rljob-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rljob-operator"}},
}
SCRAPER_PEER = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
CHART_OPTIONS = RenderOptions(operator_peers=(OPERATOR_PEER,), scraper_peers=(SCRAPER_PEER,))


def rendered(job: RLJob, options: RenderOptions = CHART_OPTIONS, **kwargs: Any) -> list[dict[str, Any]]:
    return render(job, derive_worker_configs(job), options, owner=Owner(job.metadata.name, OWNER_UID), **kwargs)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = by_kind(docs, kind)
    return doc


def groups(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in one(docs, "RayCluster")["spec"]["workerGroupSpecs"]}


def gpu_job(**spec_changes: Any) -> RLJob:
    doc = yaml.safe_load((REPO / "examples" / "gpu-cluster.yaml").read_text())
    for path, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return parse_rljob(doc)


@pytest.mark.parametrize(
    "example", ["arithmetic", "arithmetic-cluster", "gpu-cluster", "calculator-cluster", "agent-gpu-cluster"]
)
def test_golden(example: str) -> None:
    text = dump_all(rendered(load_rljob(REPO / "examples" / f"{example}.yaml")))
    golden = GOLDEN / f"{example}.yaml"
    if os.environ.get("RLJOB_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"no golden file {golden}: run with RLJOB_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden.name} differs: if intended, regenerate with RLJOB_UPDATE_GOLDEN=1"


def test_render_is_deterministic() -> None:
    job = load_rljob(REPO / "examples" / "gpu-cluster.yaml")
    assert dump_all(rendered(job)) == dump_all(rendered(job))


def test_children_rendered() -> None:
    kinds = [d["kind"] for d in rendered(load_rljob(REPO / "examples" / "arithmetic.yaml"))]
    assert kinds == [
        "NetworkPolicy",
        "ServiceAccount",
        "ConfigMap",
        "Service",
        "Service",
        "Service",
        "RayCluster",
        "Job",
    ]


def test_every_child_is_owned_and_labelled() -> None:
    job = gpu_job()
    for doc in rendered(job):
        meta = doc["metadata"]
        assert meta["namespace"] == "research"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "rljob.io/v1alpha1",
                "kind": "RLJob",
                "name": "qwen-math-grpo",
                "uid": OWNER_UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], doc["kind"]
        labels = meta["labels"]
        assert labels["rljob.io/job"] == "qwen-math-grpo"
        assert labels["app.kubernetes.io/managed-by"] == "rljob-operator"
        assert labels["team"] == "post-training"


def test_job_labels_cannot_override_ours() -> None:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["metadata"]["labels"] = {"rljob.io/job": "other", "app.kubernetes.io/managed-by": "me"}
    for child in rendered(parse_rljob(doc)):
        assert child["metadata"]["labels"]["rljob.io/job"] == "arithmetic"
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rljob-operator"


def test_no_owner_when_none_given() -> None:
    job = load_rljob(REPO / "examples" / "arithmetic.yaml")
    docs = render(job, derive_worker_configs(job), RenderOptions())
    assert all("ownerReferences" not in d["metadata"] for d in docs)


def test_pool_placement() -> None:
    g = groups(rendered(gpu_job()))
    assert g["rollout"]["template"]["spec"]["nodeSelector"] == {"rljob.io/pool": "rollout"}
    assert g["trainer"]["template"]["spec"]["nodeSelector"] == {"rljob.io/pool": "trainer"}
    assert g["reward"]["template"]["spec"]["nodeSelector"] == {"rljob.io/pool": "reward"}
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert g["rollout"]["template"]["spec"]["tolerations"] == gpu_toleration
    assert g["trainer"]["template"]["spec"]["tolerations"] == gpu_toleration
    assert "tolerations" not in g["reward"]["template"]["spec"]
    for pool, group in g.items():
        assert group["template"]["metadata"]["labels"]["rljob.io/pool"] == pool


def test_gpu_requests_per_pool() -> None:
    g = groups(rendered(gpu_job(**{"reward.gpusPerReplica": 1})))

    def res(pool: str) -> dict[str, Any]:
        return dict(g[pool]["template"]["spec"]["containers"][0]["resources"])

    assert res("rollout")["requests"]["nvidia.com/gpu"] == "8"  # gpusPerReplica
    assert res("rollout")["limits"]["nvidia.com/gpu"] == "8"
    assert res("trainer")["requests"]["nvidia.com/gpu"] == "8"  # gpusPerNode
    assert res("reward")["limits"]["nvidia.com/gpu"] == "1"  # gpusPerReplica
    assert g["rollout"]["rayStartParams"]["num-gpus"] == "8"
    # The spec's extra requests are kept: cpu 32 and memory for rollout.
    assert res("rollout")["requests"]["cpu"] == "32"
    assert res("rollout")["requests"]["memory"] == "256Gi"
    assert g["rollout"]["rayStartParams"]["num-cpus"] == "32"


def test_cpu_pools_request_no_gpus() -> None:
    g = groups(rendered(load_rljob(REPO / "examples" / "arithmetic.yaml")))
    for group in g.values():
        resources = group["template"]["spec"]["containers"][0]["resources"]
        assert "nvidia.com/gpu" not in resources["requests"]
        assert "limits" not in resources
        assert group["rayStartParams"]["num-gpus"] == "0"


def kuberay_reads(resources: str) -> dict[str, float]:
    """What KubeRay v1.6's getResourcesMap makes of rayStartParams.resources."""
    return dict(json.loads(resources.strip("'\"` ")))


def test_replicas_and_pool_resources() -> None:
    g = groups(rendered(gpu_job()))
    assert (g["rollout"]["replicas"], g["rollout"]["minReplicas"], g["rollout"]["maxReplicas"]) == (4, 4, 4)
    assert g["trainer"]["replicas"] == 2
    assert (g["reward"]["replicas"], g["reward"]["minReplicas"], g["reward"]["maxReplicas"]) == (2, 2, 16)
    # One trainer rank per GPU. KubeRay passes the value to `ray start --resources` inside `bash -lc`, and
    # reads it itself (to add accelerators) by trimming quotes and parsing JSON, as here: JSON in single
    # quotes serves both. Escaped JSON in double quotes reached Ray intact but failed KubeRay's own
    # reading ("failed to add accelerator resources to rayStartParams", on every worker pod it built).
    assert kuberay_reads(g["rollout"]["rayStartParams"]["resources"]) == {"rljob.io/rollout": 1}
    assert kuberay_reads(g["trainer"]["rayStartParams"]["resources"]) == {"rljob.io/trainer": 8}
    assert kuberay_reads(g["reward"]["rayStartParams"]["resources"]) == {"rljob.io/reward": 1}
    assert shlex.split(f"ray start --resources={g['reward']['rayStartParams']['resources']}")[-1] == (
        '--resources={"rljob.io/reward": 1}'
    )
    # 8 ranks of 1 CPU each on a trainer node.
    assert g["trainer"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "8"


@pytest.mark.parametrize(("wanted", "expected"), [(None, 2), (0, 2), (1, 2), (5, 5), (16, 16), (40, 16)])
def test_reward_replicas_clamped_to_min_max(wanted: int | None, expected: int) -> None:
    g = groups(rendered(gpu_job(), groups=ElasticGroups(ElasticGroup(replicas=wanted))))
    assert g["reward"]["replicas"] == expected


def test_workers_to_delete_rendered() -> None:
    g = groups(rendered(gpu_job(), groups=ElasticGroups(ElasticGroup(replicas=3, workers_to_delete=("a", "b")))))
    assert g["reward"]["scaleStrategy"] == {"workersToDelete": ["a", "b"]}
    assert "scaleStrategy" not in g["rollout"]


def test_suspend_renders_no_pools_and_no_driver() -> None:
    docs = rendered(gpu_job(suspend=True))
    kinds = {d["kind"] for d in docs}
    assert "RayCluster" not in kinds and "Job" not in kinds
    assert "ConfigMap" in kinds  # the config (and the checkpoint it names) stays
    assert set(absent_kinds(gpu_job(suspend=True))) == {"RayCluster", "Job"}
    assert absent_kinds(gpu_job()) == ()


def test_finished_releases_pools_keeps_driver() -> None:
    kinds = {d["kind"] for d in rendered(gpu_job(), finished=True)}
    assert "RayCluster" not in kinds and "Job" in kinds
    assert absent_kinds(gpu_job(), finished=True) == ("RayCluster",)


def test_config_map_holds_the_job_as_the_driver_reads_it() -> None:
    job = gpu_job()
    data = one(rendered(job), "ConfigMap")["data"]
    assert parse_rljob(yaml.safe_load(data["rljob.yaml"])) == job.model_copy(
        update={"metadata": job.metadata.model_copy(update={"annotations": {}})}
    )
    assert list(data) == ["rljob.yaml"]  # the driver derives its workers' configs from it


def test_driver_runs_the_controller_against_the_cluster() -> None:
    job = gpu_job()
    driver = one(rendered(job), "Job")
    pod = driver["spec"]["template"]["spec"]
    script = pod["containers"][0]["command"][2]
    assert script.endswith("exec " + " ".join(driver_command(job)) + "\n")
    assert DRIVER_COMMAND[:6] == ["rljob", "run", "/etc/rljob/rljob.yaml", "--cluster", "--resume", "--no-display"]
    # The CLI takes the command as rendered, and a deleted pod's SIGTERM has time to leave a checkpoint.
    args = build_parser().parse_args(driver_command(job)[1:])
    assert args.cluster and args.resume and pod["terminationGracePeriodSeconds"] > args.stop_timeout
    assert str(args.output) == "/checkpoints"  # metrics.jsonl beside the checkpoints, on their volume
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["RAY_ADDRESS"] == "qwen-math-grpo-ray-head-svc.research.svc:6379"
    assert pod["restartPolicy"] == "Never"
    assert driver["spec"]["template"]["metadata"]["labels"]["rljob.io/component"] == "driver"
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert {"/etc/rljob", "/models", "/data", "/checkpoints", "/var/run/secrets/rljob/style-judge"} <= mounts


def test_the_driver_alone_takes_the_trackers_credentials_from_their_secret() -> None:
    def env_from(job: RLJob) -> dict[str, list[Any]]:
        pods = [d["spec"]["template"]["spec"] for d in rendered(job) if d["kind"] == "Job"]
        head = one(rendered(job), "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
        groups = [g["template"]["spec"] for g in one(rendered(job), "RayCluster")["spec"]["workerGroupSpecs"]]
        return {
            c["name"]: c.get("envFrom", [])
            for pod in [*pods, head, *groups]
            for c in [*pod["containers"], *pod.get("initContainers", [])]
        }

    with_secret = env_from(gpu_job(logging={"trackers": ["wandb"], "secretName": "tracker-keys"}))
    assert with_secret.pop("driver") == [{"secretRef": {"name": "tracker-keys"}}]
    assert not any(with_secret.values()), with_secret  # the pools' and the head's pods never see the keys
    assert not any(env_from(gpu_job()).values())


def test_services_select_the_driver_and_reward_pods() -> None:
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(rendered(gpu_job()), "Service")}
    control = services["qwen-math-grpo-control"]
    assert control["selector"] == {"rljob.io/job": "qwen-math-grpo", "rljob.io/component": "driver"}
    assert control["ports"][0]["port"] == 50051
    assert services["qwen-math-grpo-metrics"]["ports"][0]["port"] == 9400
    reward = services["qwen-math-grpo-reward"]
    assert reward["selector"] == {"rljob.io/job": "qwen-math-grpo", "rljob.io/pool": "reward"}
    assert services["qwen-math-grpo-reward"]["clusterIP"] == "None"


def test_the_driver_holds_no_rights_and_mounts_no_token() -> None:
    # No driver code calls the Kubernetes API (its ConfigMap is a volume), and it imports the user's reward
    # modules: it gets no Role, and no token of its account is mounted for that code to take.
    docs = rendered(gpu_job())
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    driver = one(docs, "Job")["spec"]["template"]["spec"]
    assert driver["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == "qwen-math-grpo-rljob"
    assert driver["automountServiceAccountToken"] is False
    # Pool pods never talk to the API server and use no account of ours.
    for group in groups(docs).values():
        assert group["template"]["spec"]["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in group["template"]["spec"]


def test_own_service_account_is_bound_not_created() -> None:
    docs = rendered(gpu_job(serviceAccountName="research-runner"))
    assert not by_kind(docs, "ServiceAccount") and not by_kind(docs, "RoleBinding")
    assert one(docs, "Job")["spec"]["template"]["spec"]["serviceAccountName"] == "research-runner"
    for group in groups(docs).values():  # the spec's account is the pods' identity (e.g. for storage)
        assert group["template"]["spec"]["serviceAccountName"] == "research-runner"


def test_long_names_stay_within_63_characters() -> None:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["metadata"]["name"] = "a" * 63
    for child in rendered(parse_rljob(doc)):
        assert len(child["metadata"]["name"]) <= 63
        if child["kind"] == "RayCluster":
            assert len(child["metadata"]["name"] + "-head-svc") <= 63


def test_system_placement_option() -> None:
    options = RenderOptions(
        system_node_selector={"pool": "cpu"},
        system_tolerations=({"key": "cpu-only", "operator": "Exists"},),
    )
    docs = render(gpu_job(), derive_worker_configs(gpu_job()), options)
    head = one(docs, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
    driver = one(docs, "Job")["spec"]["template"]["spec"]
    for pod in (head, driver):
        assert pod["nodeSelector"] == {"pool": "cpu"}
        assert pod["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]


@pytest.mark.parametrize(
    ("folder", "mount", "output"),
    [
        ("/runs/job/checkpoints", "/runs", "/runs/job"),
        ("/runs/job", "/runs/", "/runs"),
        ("/runs", "/runs", None),  # the parent is off the volume: the pod's own folder
        ("/runsx/job", "/runs", None),
        ("checkpoints", "/runs", None),
    ],
)
def test_driver_writes_metrics_beside_the_checkpoints_on_their_volume(
    folder: str, mount: str, output: str | None
) -> None:
    job = gpu_job()
    spec = job.spec.model_copy(
        update={
            "checkpoint": job.spec.checkpoint.model_copy(
                update={"dir": folder, "volume": CheckpointVolumeSource(claim_name="runs", mount_path=mount)}
            )
        }
    )
    assert run_output_dir(job.model_copy(update={"spec": spec})) == output
    assert (
        run_output_dir(
            job.model_copy(
                update={
                    "spec": spec.model_copy(update={"checkpoint": spec.checkpoint.model_copy(update={"volume": None})})
                }
            )
        )
        is None
    )


def test_a_python_environment_is_a_worker_group_of_its_own_and_a_remote_one_is_not() -> None:
    """kind python: an `environment` group with the spec's placement, bounds, the pool's Ray resource and
    the drained pods to delete; no reward group when no function scores samples. kind remote: no group."""
    doc = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    doc["spec"]["environment"].update(nodeSelector={"pool": "sandboxes"}, resources={"limits": {"memory": "3Gi"}})
    sized = ElasticGroups(environment=ElasticGroup(3, ("calc-env-1",)))
    g = groups(rendered(parse_rljob(doc), groups=sized))
    assert set(g) == {"rollout", "trainer", "environment"}
    env = g["environment"]
    assert (env["replicas"], env["minReplicas"], env["maxReplicas"]) == (3, 1, 4)
    assert env["scaleStrategy"] == {"workersToDelete": ["calc-env-1"]}
    assert json.loads(env["rayStartParams"]["resources"].strip("'")) == {"rljob.io/environment": 1}
    pod = env["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "sandboxes"}
    assert pod["containers"][0]["resources"]["limits"]["memory"] == "3Gi"
    assert env["template"]["metadata"]["labels"]["rljob.io/pool"] == "environment"
    doc["spec"]["environment"] = {"kind": "remote", "remote": {"endpoints": ["calculator.envs:50055"]}}
    assert set(groups(rendered(parse_rljob(doc)))) == {"rollout", "trainer"}
