"""Render an RLJob into the Kubernetes objects that run it. Pure: everything it needs is an argument.

Children: the NetworkPolicy (ingress from the job's own pods, the operator and the scrapers),
ServiceAccount, Role, RoleBinding (what the driver may read), the ConfigMap (`rljob.yaml`: the job as the
driver reads it and derives its workers' configs from), the control, metrics and reward Services, the
pools (the RayCluster, raycluster.py) and the driver (a batch Job, driver.py). The job's token Secret is rendered apart
(`render_token_secret`): it is made once, with a random token, never applied again. The writer applies
them in dependency waves (writer.write_children). A suspended job has no pools and no driver; a finished
one keeps its driver Job (the record of how it ended) but releases its pools.
"""

from __future__ import annotations

from typing import Any

import yaml

from rljob_api import RLJob
from rljob_api.workercfg import Ports, WorkerConfigs
from rljob_operator.names import (
    JOB_TOKEN_KEY,
    LABEL_JOB,
    RAY_TOKEN_KEY,
    RLJOB_FILE,
    child_meta,
    config_name,
    control_service_name,
    driver_selector,
    job_labels,
    metrics_service_name,
    network_policy_name,
    pool_selector,
    reward_service_name,
    service_account_name,
    token_secret_name,
)
from rljob_operator.options import ElasticGroups, Owner, RenderOptions
from rljob_operator.render.driver import render_driver
from rljob_operator.render.raycluster import render_ray_cluster

# The children that hold GPUs (the pools) and the driver: what suspend deletes.
POOL_KINDS = ("RayCluster",)
DRIVER_KINDS = ("Job",)


def rljob_document(job: RLJob) -> str:
    """The RLJob as the workers read it: apiVersion, kind, name/namespace/labels and the full spec."""
    metadata: dict[str, Any] = {"name": job.metadata.name, "namespace": job.metadata.namespace}
    if job.metadata.labels:
        metadata["labels"] = dict(job.metadata.labels)
    document = {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "metadata": metadata,
        "spec": job.spec.to_wire(),
    }
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)


def render_config_map(job: RLJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_meta(job, config_name(job), "config"),
        "data": {RLJOB_FILE: rljob_document(job)},
    }


def render_service_account(job: RLJob) -> list[dict[str, Any]]:
    """The driver's own account, unless the spec names one. It holds no Role: no driver code calls the
    Kubernetes API (its ConfigMap is a volume), and its token is not mounted."""
    if job.spec.service_account_name:
        return []
    name = service_account_name(job)
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_meta(job, name, "account")}]


def render_services(job: RLJob, ports: Ports) -> list[dict[str, Any]]:
    """ControlService and metrics of the driver; a headless Service naming the reward replicas."""

    def service(name: str, component: str, selector: dict[str, str], port: int, port_name: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "selector": selector,
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        }
        if component == "reward":
            spec["clusterIP"] = "None"
        return {"apiVersion": "v1", "kind": "Service", "metadata": child_meta(job, name, component), "spec": spec}

    return [
        service(control_service_name(job), "control", driver_selector(job), ports.control, "grpc"),
        service(metrics_service_name(job), "metrics", driver_selector(job), ports.metrics, "metrics"),
        service(reward_service_name(job), "reward", pool_selector(job, "reward"), ports.reward, "grpc"),
    ]


def render_token_secret(job: RLJob, token: str) -> dict[str, Any]:
    """The job's token (see rljob_workers.common.auth): made once, never applied again, so it stays the
    same for the job's life; its owner reference deletes it with the RLJob."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_meta(job, token_secret_name(job), "token"),
        "type": "Opaque",
        "stringData": {JOB_TOKEN_KEY: token, RAY_TOKEN_KEY: token},
    }


def render_network_policy(job: RLJob, ports: Ports, options: RenderOptions) -> dict[str, Any]:
    """Ingress to the job's pods only from its own pods, the operator (the control port) and the metrics
    scrapers (the metrics port); egress open unless the operator's options restrict it. Enforced only by
    a CNI that implements NetworkPolicy."""
    own = {"podSelector": {"matchLabels": {LABEL_JOB: job.metadata.name}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    for peers, port in ((options.operator_peers, ports.control), (options.scraper_peers, ports.metrics)):
        if peers:
            ingress.append({"from": [dict(p) for p in peers], "ports": [{"protocol": "TCP", "port": port}]})
    spec: dict[str, Any] = {"podSelector": own["podSelector"], "policyTypes": ["Ingress"], "ingress": ingress}
    if options.egress is not None:
        spec["policyTypes"].append("Egress")
        spec["egress"] = [{"to": [own]}, *(dict(rule) for rule in options.egress)]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_meta(job, network_policy_name(job), "network"),
        "spec": spec,
    }


def finish(doc: dict[str, Any], job: RLJob, owner: Owner | None) -> dict[str, Any]:
    metadata = doc["metadata"]
    metadata["labels"] = {**job_labels(job), **metadata.get("labels", {})}
    if owner is not None:
        metadata["ownerReferences"] = [owner.reference()]
    return doc


def render_pools(
    job: RLJob, options: RenderOptions, groups: ElasticGroups, finished: bool, owner: Owner | None
) -> list[dict[str, Any]]:
    """The pools the job should have now: its RayCluster, or none (suspended, or the run finished)."""
    if job.spec.suspend or finished:
        return []
    return [finish(render_ray_cluster(job, options, groups), job, owner)]


def render(
    job: RLJob,
    configs: WorkerConfigs,
    options: RenderOptions,
    *,
    owner: Owner | None = None,
    groups: ElasticGroups | None = None,
    finished: bool = False,
) -> list[dict[str, Any]]:
    """Every child the job should have now; `configs` are the job's worker configs, derived once by the caller.

    `groups` are the elastic groups' current sizes and the drained replicas to delete (see render/group_sizing.py);
    `finished` (the driver Job completed or failed) releases the pools but keeps the driver Job.
    """
    docs = [
        finish(doc, job, owner)
        for doc in (*render_service_account(job), render_config_map(job), *render_services(job, configs.ports))
    ]
    if options.network_policy:
        docs.insert(0, finish(render_network_policy(job, configs.ports, options), job, owner))
    docs += render_pools(job, options, groups or ElasticGroups(), finished, owner)
    if not job.spec.suspend:
        docs.append(finish(render_driver(job, configs.ports, options), job, owner))
    return docs


def absent_kinds(job: RLJob, *, finished: bool = False) -> tuple[str, ...]:
    """Kinds of child that must not exist now (suspended: pools and driver; finished: pools)."""
    if job.spec.suspend:
        return POOL_KINDS + DRIVER_KINDS
    if finished:
        return POOL_KINDS
    return ()
