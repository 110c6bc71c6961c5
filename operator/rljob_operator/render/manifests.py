"""Render an RLJob into the Kubernetes objects that run it. Pure: everything it needs is an argument.

Children: the NetworkPolicy (ingress from the job's own pods, the operator and the scrapers),
ServiceAccount, Role, RoleBinding (what the driver may read), the ConfigMap (`rljob.yaml`: the job as the
driver reads it and derives its workers' configs from), the control, metrics and reward Services, the
pools (the RayCluster) and the driver (a batch Job). The job's token Secret is rendered apart
(`render_token_secret`): it is made once, with a random token, never applied again. The writer applies
them in dependency waves (writer.write_children). A suspended job has no pools and no driver; a finished
one keeps its driver Job (the record of how it ended) but releases its pools.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

import yaml

from rljob_api import RLJob
from rljob_api.workercfg import TERMINATION_LOG_ENV, TOKEN_FILE_ENV, Ports, WorkerConfigs
from rljob_operator.names import (
    CONFIG_DIR,
    JOB_TOKEN_FILE,
    JOB_TOKEN_KEY,
    LABEL_JOB,
    RAY_TOKEN_KEY,
    RLJOB_FILE,
    component_labels,
    config_name,
    control_service_name,
    driver_name,
    driver_selector,
    head_service_name,
    job_labels,
    metrics_service_name,
    network_policy_name,
    pool_selector,
    reward_service_name,
    service_account_name,
    token_secret_name,
)
from rljob_operator.options import ElasticGroups, Owner, RenderOptions
from rljob_operator.render.pods import (
    WRITABLE_ENV,
    code_env,
    code_mounts,
    code_volumes,
    container,
    pod_template,
    volume_mounts,
    volumes,
)
from rljob_operator.render.raycluster import render_ray_cluster

# The children that hold GPUs (the pools) and the driver: what suspend deletes.
POOL_KINDS = ("RayCluster",)
DRIVER_KINDS = ("Job",)
# A deleted driver pod gets SIGTERM: rljob run finishes or drops the step, writes a checkpoint (within
# --stop-timeout) and exits; the grace period outlasts that, so Kubernetes' SIGKILL does not cut it short.
DRIVER_STOP_TIMEOUT_SECONDS = 60
DRIVER_GRACE_SECONDS = DRIVER_STOP_TIMEOUT_SECONDS + 30
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default path, named so the driver is told it
DRIVER_COMMAND = [
    *("rljob", "run", f"{CONFIG_DIR}/{RLJOB_FILE}", "--cluster", "--resume", "--no-display"),
    *("--stop-timeout", str(DRIVER_STOP_TIMEOUT_SECONDS)),
]


def run_output_dir(job: RLJob) -> str | None:
    """Where the driver writes metrics.jsonl and the reward curve: beside the checkpoints on their volume
    (the checkpoint folder's parent, when that is still on the volume), so they outlive the driver pod and
    a retried driver's `--resume` continues the same file. None: the pod's own folder."""
    volume = job.spec.checkpoint.volume
    if volume is None:
        return None
    parent = posixpath.dirname(posixpath.normpath(job.spec.checkpoint.dir))
    mount = posixpath.normpath(volume.mount_path)
    return parent if parent == mount or parent.startswith(mount.rstrip("/") + "/") else None


def driver_command(job: RLJob) -> list[str]:
    output = run_output_dir(job)
    return DRIVER_COMMAND + (["--output", output] if output else [])


def driver_script(job: RLJob) -> str:
    """The driver pod joins the Ray cluster as a node without CPUs or GPUs (so no pool actor lands on it),
    which lets `ray.init(address="auto")` in `rljob run --cluster` find a local node, then runs the
    controller."""
    return (
        "set -e\n"
        'ray start --address="$RAY_ADDRESS" --num-cpus=0 --num-gpus=0'
        " --resources='{\"rljob.io/driver\": 1}' --disable-usage-stats\n"
        "exec " + shlex.join(driver_command(job)) + "\n"
    )


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


def _meta(job: RLJob, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": job.metadata.namespace, "labels": component_labels(job, component)}


def render_config_map(job: RLJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, config_name(job), "config"),
        "data": {RLJOB_FILE: rljob_document(job)},
    }


def render_service_account(job: RLJob) -> list[dict[str, Any]]:
    """The driver's own account, unless the spec names one. It holds no Role: no driver code calls the
    Kubernetes API (its ConfigMap is a volume), and its token is not mounted."""
    if job.spec.service_account_name:
        return []
    name = service_account_name(job)
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, name, "account")}]


def render_services(job: RLJob, ports: Ports) -> list[dict[str, Any]]:
    """ControlService and metrics of the driver; a headless Service naming the reward replicas."""

    def service(name: str, component: str, selector: dict[str, str], port: int, port_name: str) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "selector": selector,
            "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
        }
        if component == "reward":
            spec["clusterIP"] = "None"
        return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, name, component), "spec": spec}

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
        "metadata": _meta(job, token_secret_name(job), "token"),
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
        "metadata": _meta(job, network_policy_name(job), "network"),
        "spec": spec,
    }


def tracker_credentials(job: RLJob) -> dict[str, Any]:
    """spec.logging.secretName: every key of that Secret as the driver's environment (the trackers run there)."""
    secret = job.spec.logging.secret_name
    return {"envFrom": [{"secretRef": {"name": secret}}]} if secret else {}


def driver_env(job: RLJob) -> list[dict[str, Any]]:
    return [
        {"name": "RAY_ADDRESS", "value": f"{head_service_name(job)}.{job.metadata.namespace}.svc:6379"},
        {"name": "RLJOB_JOB", "value": job.metadata.name},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # its last JobStatus, as the container's termination message (see observe.final_snapshot)
        {"name": TERMINATION_LOG_ENV, "value": TERMINATION_LOG},
        {"name": TOKEN_FILE_ENV, "value": JOB_TOKEN_FILE},
        *ray_auth_env(job),
        *WRITABLE_ENV,
        *code_env(job),  # it imports the rules and environment classes for its set-up checks
    ]


def ray_auth_env(job: RLJob) -> list[dict[str, Any]]:
    """The driver's `ray start` and `ray.init` join a cluster that requires the job's token (authOptions,
    render/raycluster.py): the same two variables KubeRay gives the pods it makes."""
    secret = {"secretKeyRef": {"name": token_secret_name(job), "key": RAY_TOKEN_KEY}}
    return [{"name": "RAY_AUTH_MODE", "value": "token"}, {"name": "RAY_AUTH_TOKEN", "valueFrom": secret}]


def render_driver(job: RLJob, ports: Ports, options: RenderOptions) -> dict[str, Any]:
    """The driver: a Job running the controller (`rljob run --cluster --resume`); a retry resumes from
    the newest checkpoint, and its Complete/Failed condition is how the run ended."""
    main = container(
        job,
        "driver",
        job.spec.security_context,
        command=["/bin/sh", "-c", driver_script(job)],
        env=driver_env(job),
        **tracker_credentials(job),
        terminationMessagePath=TERMINATION_LOG,
        # a driver that dies before writing it leaves the end of its log instead
        terminationMessagePolicy="FallbackToLogsOnError",
        ports=[
            {"name": "grpc", "containerPort": ports.control},
            {"name": "metrics", "containerPort": ports.metrics},
        ],
        resources={
            "requests": {"cpu": options.driver_cpu, "memory": options.driver_memory},
            "limits": {"memory": options.driver_memory},
        },
        volumeMounts=[*volume_mounts(job, tokens=True), *code_mounts(job)],
    )
    template = pod_template(
        component_labels(job, "driver"),
        main,
        account={
            "restartPolicy": "Never",
            "serviceAccountName": service_account_name(job),
            # it imports the user's reward modules and calls no Kubernetes API: no token to steal
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": DRIVER_GRACE_SECONDS,
        },
        security=job.spec.security_context,
        volumes=[*volumes(job, tokens=True), *code_volumes(job)],
        node_selector=options.system_node_selector,
        tolerations=options.system_tolerations,
        pull_secrets=job.spec.image_pull_secrets,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job, driver_name(job), "driver"),
        # A retry starts once the deleted or failed driver has exited (its SIGTERM checkpoint written, its
        # folder lock released), never beside it.
        "spec": {
            "backoffLimit": options.driver_backoff_limit,
            "podReplacementPolicy": "Failed",
            "template": template,
            **active_deadline(job),
        },
    }


def active_deadline(job: RLJob) -> dict[str, int]:
    """spec.activeDeadlineSeconds as the driver Job's own, a backstop across driver restarts: the driver stops
    itself at the deadline (a checkpoint written), the Job ends whatever is left a grace period later."""
    seconds = job.spec.active_deadline_seconds
    return {"activeDeadlineSeconds": seconds + DRIVER_GRACE_SECONDS} if seconds is not None else {}


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
