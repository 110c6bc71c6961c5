"""The environment pool's pods for a `kind: image` environment: the environment's own image as a second container
beside the Ray worker, in any language. The contract: it serves rljob.v1.EnvironmentService (and grpc.health.v1)
on all interfaces at spec.environment.port, checks the job's token read from the file RLJOB_TOKEN_FILE names, and
runs as the pod's non-root user on a read-only root filesystem (/tmp is writable). The kubelet restarts it when it
exits; its readiness is its health check. The Ray actor in the pod waits for it and stands for it in the pool.
"""

from __future__ import annotations

from typing import Any

from rljob_api import RLJob
from rljob_api.workercfg import TOKEN_FILE_ENV
from rljob_operator.names import JOB_TOKEN_FILE
from rljob_operator.render.pods import base_mounts, container

# What the environment container is told of its own port (it may also take it as an argument of `command`).
PORT_ENV = "RLJOB_ENVIRONMENT_PORT"


def environment_container(job: RLJob) -> dict[str, Any] | None:
    """The environment's own container of each environment pod; None unless spec.environment is kind image."""
    spec = job.spec.environment
    if spec is None or spec.kind != "image" or spec.image is None:
        return None
    env = [
        {"name": TOKEN_FILE_ENV, "value": JOB_TOKEN_FILE},
        {"name": PORT_ENV, "value": str(spec.port)},
        *({"name": name, "value": value} for name, value in sorted(spec.env.items())),
    ]
    fields: dict[str, Any] = {}
    if spec.command is not None:
        fields["command"] = list(spec.command)
    requests, limits = spec.resources.requests, spec.resources.limits
    resources = {
        **({"requests": {k: str(v) for k, v in requests.items()}} if requests else {}),
        **({"limits": {k: str(v) for k, v in limits.items()}} if limits else {}),
    }
    return container(
        job,
        "environment",
        spec.security_context or job.spec.security_context,
        spec.image,
        **fields,
        env=env,
        ports=[{"name": "environment", "containerPort": spec.port}],
        resources=resources,
        readinessProbe={"grpc": {"port": spec.port}, "periodSeconds": 2, "failureThreshold": 3},
        volumeMounts=base_mounts(),  # /tmp, and the job's token
    )
