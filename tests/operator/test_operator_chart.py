"""The Helm chart: `helm lint` and `helm template` with the real helm (from the e2e build), the values
schema, RBAC covering exactly what the operator does, and the dashboard's metric names."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api import derive_worker_configs, load_rljob
from rljob_operator.kube.client import KINDS
from rljob_operator.kube.rights import CLUSTER_RIGHTS, RIGHTS, verbs_by_resource
from rljob_operator.options import RenderOptions
from rljob_operator.reconcile.metrics import OperatorMetrics
from rljob_operator.render.manifests import render

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rljob-operator"
GPU_JOB = load_rljob(REPO / "examples" / "gpu-cluster.yaml")


def _helm() -> Path | None:
    try:
        out = subprocess.run(["bash", str(REPO / "e2e" / "build.sh"), "bin"], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    path = Path(out.stdout.strip()) / "helm"
    return path if out.returncode == 0 and path.is_file() else None


HELM = _helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not built: run e2e/build.sh (helm is built from Go modules)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    out = subprocess.run([str(HELM), *args], capture_output=True, text=True)
    if check and out.returncode:
        raise AssertionError(f"helm {' '.join(args)}:\n{out.stdout}\n{out.stderr}")
    return out


def template(*sets: str) -> list[dict[str, Any]]:
    args = ["template", "r", str(CHART), "--namespace", "ops"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


@needs_helm
@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["watch.scope=namespaces", "watch.namespaces={research,team-a}"],
        ["metrics.serviceMonitor.enabled=true", "dashboard.enabled=false", "livenessProbe.enabled=false"],
    ],
    ids=["defaults", "namespaced", "servicemonitor"],
)
def test_helm_lint(sets: list[str]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for s in sets:
        args += ["--set", s]
    assert "0 chart(s) failed" in helm(*args).stdout


@needs_helm
def test_template_cluster_mode() -> None:
    docs = template()
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/rljob/rljob-operator:0.1.0"
    assert container["command"] == ["python", "-m", "rljob_operator"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["RLJOB_OPERATOR_NAMESPACES"] == ""
    assert json.loads(env["RLJOB_OPERATOR_SYSTEM_NODE_SELECTOR"]) == {}
    assert {d["kind"] for d in docs} >= {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "ConfigMap"}
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "ServiceMonitor")]
    binding = one(docs, "ClusterRoleBinding", "r-rljob-operator")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "r-rljob-operator", "namespace": "ops"}]


@needs_helm
def test_template_namespaced_mode() -> None:
    docs = template("watch.scope=namespaces", "watch.namespaces={research,team-a}")
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["research", "team-a"]
    assert sorted(b["metadata"]["namespace"] for b in docs if b["kind"] == "RoleBinding") == ["research", "team-a"]
    # Only the read-only CRD role is cluster-wide.
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"] == ["r-rljob-operator-crds"]
    env = {e["name"]: e["value"] for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RLJOB_OPERATOR_NAMESPACES"] == "research,team-a"


@needs_helm
def test_template_service_monitors() -> None:
    docs = template("metrics.serviceMonitor.enabled=true")
    monitors = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"r-rljob-operator", "r-rljob-operator-jobs"}
    assert monitors["r-rljob-operator-jobs"]["selector"]["matchLabels"]["rljob.io/component"] == "metrics"


@needs_helm
@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("imagee.tag=x", "additional properties 'imagee' not allowed"),
        ("image.tagg=x", "additional properties 'tagg' not allowed"),
        ("metrics.serviceMonitor.enable=true", "additional properties 'enable' not allowed"),
        ("watch.scope=everywhere", "watch/scope"),
    ],
)
def test_values_schema_rejects_typos(value: str, complaint: str) -> None:
    out = helm("template", "r", str(CHART), "--set", value, check=False)
    assert out.returncode != 0 and complaint in out.stderr, out.stderr


@needs_helm
def test_namespaced_mode_needs_namespaces() -> None:
    out = helm("template", "r", str(CHART), "--set", "watch.scope=namespaces", check=False)
    assert out.returncode != 0 and "namespaces" in out.stderr, out.stderr


def test_values_file_matches_its_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    with pytest.raises(jsonschema.ValidationError, match="'imagee' was unexpected"):
        jsonschema.validate({**values, "imagee": {}}, schema)


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@needs_helm
@pytest.mark.parametrize("namespaced", [False, True], ids=["cluster", "namespaced"])
def test_rbac_grants_exactly_the_operators_rights(namespaced: bool) -> None:
    """Nothing granted that rights.py does not list, nothing listed that is not granted; namespaced
    rights in a Role per namespace in namespaced mode, the CRD watch cluster-wide in both."""
    sets = ["watch.scope=namespaces", "watch.namespaces={research,team-a}"] if namespaced else []
    docs = template(*sets)
    crds = one(docs, "ClusterRole", "r-rljob-operator-crds")["rules"]
    assert granted(crds) == verbs_by_resource(CLUSTER_RIGHTS)
    if namespaced:
        roles = [d for d in docs if d["kind"] == "Role"]
        assert sorted(r["metadata"]["namespace"] for r in roles) == ["research", "team-a"]
        assert not [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "r-rljob-operator"]
        for role in roles:
            assert granted(role["rules"]) == verbs_by_resource(RIGHTS)
    else:
        assert granted(one(docs, "ClusterRole", "r-rljob-operator")["rules"]) == verbs_by_resource(RIGHTS)
    # Every kind the operator renders is covered: read first (ownership.py), then applied (patch, and create
    # for the first apply).
    for doc in render(GPU_JOB, derive_worker_configs(GPU_JOB), RenderOptions()):
        prefix, plural = KINDS[doc["kind"]]
        group = "" if prefix == "api/v1" else prefix.split("/")[1]
        wanted = {(group, plural, verb) for verb in ("get", "patch", "create")}
        assert wanted <= verbs_by_resource(RIGHTS), doc["kind"]


def _known_metrics() -> set[str]:
    """What the operator, the driver and the reward replicas register (the registries themselves)."""
    from rljob_workers.driver.telemetry.metrics import RunMetrics
    from rljob_workers.reward.metrics import RewardMetrics

    registries = (OperatorMetrics().registry, RunMetrics("job").registry, RewardMetrics().registry)
    return {metric.name for registry in registries for metric in registry.collect()}


def test_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((CHART / "files" / "rljob-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {re.sub(r"_(total|bucket|sum|count)$", "", m) for e in exprs for m in re.findall(r"\brljob_\w+", e)}
    known = _known_metrics()
    assert used <= known, f"the dashboard queries metrics nobody exports: {sorted(used - known)}"
    for topic in (
        "rljob_operator_job_phase",
        "rljob_step",
        "rljob_reward_mean",
        "rljob_staleness_mean",
        "rljob_samples",
        "rljob_operator_pool_replicas",
        "rljob_operator_pool_idle_fraction",
        "rljob_operator_restarts",
        "rljob_reward_backlog",
        "rljob_reward_replicas",
        "rljob_weight_sync_seconds",
        "rljob_policy_loss",
        "rljob_kl",
        "rljob_clip_fraction",
        "rljob_grad_norm",
        "rljob_entropy",
        "rljob_response_length_tokens",
        "rljob_truncated_fraction",
        "rljob_reward_function_mean",
        "rljob_trained_tokens_per_second",
        "rljob_eval_reward",
        "rljob_eval_pass_at_k",
        "rljob_episodes",
        "rljob_episode_turns",
        "rljob_environment_step_seconds",
        "rljob_tool_calls",
        "rljob_environment_errors",
    ):
        assert topic in used, topic
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


@needs_helm
def test_chart_network_policy_values_reach_the_rendered_policy() -> None:
    """The Deployment's environment, parsed as the operator parses it, lets in the operator's own pods
    (its release namespace and labels) on the control port and the scrapers' namespace on metrics."""
    from rljob_operator.process.flags import parse_config

    deployment = one(template("networkPolicy.egress[0].ports[0].port=53"), "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    options = parse_config([], env).render
    (policy,) = [d for d in render(GPU_JOB, derive_worker_configs(GPU_JOB), options) if d["kind"] == "NetworkPolicy"]
    _own, operator, scrapers = policy["spec"]["ingress"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert operator["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": labels},
        }
    ]
    # the default admits Prometheus pods in any namespace (kube-prometheus-stack's, the prometheus chart's)
    assert scrapers["from"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"][1] == {"ports": [{"port": 53}]}
    off = one(template("networkPolicy.enabled=false"), "Deployment")
    env = {e["name"]: e["value"] for e in off["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not [
        d
        for d in render(GPU_JOB, derive_worker_configs(GPU_JOB), parse_config([], env).render)
        if d["kind"] == "NetworkPolicy"
    ]


def scraper_peers(*sets: str) -> list[dict[str, object]]:
    """The scrapers' peers of the jobs' NetworkPolicies, from the chart's Deployment environment."""
    from rljob_operator.process.flags import parse_config

    deployment = one(template(*sets), "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    return [dict(p) for p in parse_config([], env).render.scraper_peers]


@needs_helm
def test_scrape_selectors() -> None:
    prometheus = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    monitoring = {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert scraper_peers() == [{"namespaceSelector": {}, "podSelector": prometheus}]
    # every pod of one namespace (the chart's former default)
    assert scraper_peers(
        "networkPolicy.scrapePodSelector=null",
        "networkPolicy.scrapeNamespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    ) == [{"namespaceSelector": monitoring}]
    # another scraper's pods, anywhere
    alloy = "networkPolicy.scrapePodSelector.matchLabels.app\\.kubernetes\\.io/name=alloy"
    assert scraper_peers(alloy) == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "alloy"}}}
    ]
    assert scraper_peers("networkPolicy.scrapeNamespaceSelector=null") == [{"podSelector": prometheus}]
    assert scraper_peers("networkPolicy.scrapeNamespaceSelector=null", "networkPolicy.scrapePodSelector=null") == []


@needs_helm
def test_operator_image_pull_secrets() -> None:
    pod = one(template("imagePullSecrets[0].name=regcred"), "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert "imagePullSecrets" not in one(template(), "Deployment")["spec"]["template"]["spec"]


def test_notes_name_the_cluster_example() -> None:
    """A cluster user is pointed at the example whose paths are on claims, not the local one (.cache/)."""
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    applied = re.findall(r"kubectl apply -f (\S+)", notes)
    assert applied == ["examples/arithmetic-cluster.yaml"], applied
    assert (REPO / applied[0]).is_file()
