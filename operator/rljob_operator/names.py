"""Names and labels of an RLJob's children: one place, so render, status and handlers agree."""

from __future__ import annotations

import hashlib
from typing import Any

from rljob_api import RLJob
from rljob_api.workercfg import Pool

FIELD_MANAGER = "rljob-operator"
MANAGED_BY = "rljob-operator"

LABEL_JOB = "rljob.io/job"
LABEL_COMPONENT = "rljob.io/component"
LABEL_POOL = "rljob.io/pool"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"

# Where the ConfigMap is mounted in every pod, and the two files in it.
CONFIG_DIR = "/etc/rljob"
RLJOB_FILE = "rljob.yaml"
# Where remote-reward token Secrets are mounted: <dir>/<function name>/<key>.
TOKEN_DIR = "/var/run/secrets/rljob"
# Where the job's own token (its Secret's one key) is mounted in the driver and every pool pod.
JOB_TOKEN_DIR = "/var/run/rljob"
JOB_TOKEN_KEY = "token"
JOB_TOKEN_FILE = f"{JOB_TOKEN_DIR}/{JOB_TOKEN_KEY}"
# The same token under the key KubeRay's authOptions.secretName reads: Ray's own token (dashboard, job
# submission, GCS, the client port) is the job's, so nothing without it drives the job's Ray cluster.
RAY_TOKEN_KEY = "auth_token"

MAX_NAME = 63


def child_name(job_name: str, suffix: str = "", limit: int = MAX_NAME) -> str:
    """`<job>-<suffix>`, shortened with a stable hash when it would pass `limit` characters.

    Services need a DNS-1035 label (a letter first), so a job name starting with a digit gets a prefix.
    """
    name = f"{job_name}-{suffix}" if suffix else job_name
    if not name[0].isalpha():
        name = f"rlj-{name}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    keep = limit - len(digest) - len(suffix) - 2
    head = name[:keep].rstrip("-")
    return f"{head}-{digest}-{suffix}" if suffix else f"{head}-{digest}"


def ray_cluster_name(job: RLJob) -> str:
    # KubeRay appends "-head-svc" (9) to the cluster name for the head Service; keep that within 63.
    return child_name(job.metadata.name, "ray", limit=MAX_NAME - len("-head-svc"))


def driver_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "driver")


def config_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "config")


def control_service_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "control")


def metrics_service_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "metrics")


def reward_service_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "reward")


def token_secret_name(job: RLJob) -> str:
    """The Secret holding the job's token (made once by the operator, owned by the RLJob)."""
    return child_name(job.metadata.name, "token")


def network_policy_name(job: RLJob) -> str:
    return child_name(job.metadata.name, "pods")


def service_account_name(job: RLJob) -> str:
    """The pods' service account: the spec's, or the one the operator makes."""
    return job.spec.service_account_name or child_name(job.metadata.name, "rljob")


def head_service_name(job: RLJob) -> str:
    """The head Service KubeRay makes for the RayCluster."""
    return f"{ray_cluster_name(job)}-head-svc"


def job_labels(job: RLJob) -> dict[str, str]:
    """Labels on every child: the job's own, then ours (which win)."""
    return {
        **job.metadata.labels,
        LABEL_JOB: job.metadata.name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def component_labels(job: RLJob, component: str) -> dict[str, str]:
    return {**job_labels(job), LABEL_COMPONENT: component}


def pool_labels(job: RLJob, pool: Pool) -> dict[str, str]:
    return {**component_labels(job, "pool"), LABEL_POOL: pool}


def child_meta(job: RLJob, name: str, component: str) -> dict[str, Any]:
    """A child's metadata: its name in the job's namespace, with the job's and the component's labels."""
    return {"name": name, "namespace": job.metadata.namespace, "labels": component_labels(job, component)}


def driver_selector(job: RLJob) -> dict[str, str]:
    """Selects the driver pod (the controller): what the control and metrics Services target."""
    return {LABEL_JOB: job.metadata.name, LABEL_COMPONENT: "driver"}


def pool_selector(job: RLJob, pool: Pool) -> dict[str, str]:
    return {LABEL_JOB: job.metadata.name, LABEL_POOL: pool}
