"""The driver: a batch Job whose pod joins the job's Ray cluster as a node with no CPUs or GPUs and runs the
controller (`rljob run --cluster --resume`); a retry resumes from the newest checkpoint, and the Job's
Complete/Failed condition is how the run ended. Pure."""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

from rljob_api import RLJob
from rljob_api.workercfg import TERMINATION_LOG_ENV, TOKEN_FILE_ENV, Ports
from rljob_operator.names import (
    CONFIG_DIR,
    JOB_TOKEN_FILE,
    RAY_TOKEN_KEY,
    RLJOB_FILE,
    child_meta,
    component_labels,
    driver_name,
    head_service_name,
    service_account_name,
    token_secret_name,
)
from rljob_operator.options import RenderOptions
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
        "metadata": child_meta(job, driver_name(job), "driver"),
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
