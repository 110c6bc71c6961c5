"""Pieces of the pod templates shared by the pools and the driver: volumes, mounts, resources."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rljob_api import LocalObjectReference, RLJob, SecurityContext, VolumeSource
from rljob_api.code import CODE_CONFIG_MAP_DIR, CODE_VOLUME_DIR
from rljob_api.placement import Placement, Quantity
from rljob_operator.names import CONFIG_DIR, JOB_TOKEN_DIR, JOB_TOKEN_KEY, TOKEN_DIR, config_name, token_secret_name

GPU = "nvidia.com/gpu"
CONFIG_VOLUME = "rljob-config"
JOB_TOKEN_VOLUME = "rljob-token"
# The one writable place besides the volumes when the root filesystem is read-only: Ray's session
# folder (/tmp/ray), caches and temporary files.
TMP_VOLUME = "tmp"
# The pools' /dev/shm: memory-backed, so NCCL and the engines' shared-memory queues get more than the
# container runtime's 64 MiB. The kubelet mounts a tmpfs of sizeLimit (a write past it fails); the pages
# written count against the pod's memory limit and the node's memory, not its request.
SHM_VOLUME = "dshm"
# spec.code's sources, in the pods that import the user's code (the driver, reward and environment pools)
CODE_CONFIG_MAP_VOLUME = "code-configmap"
CODE_CLAIM_VOLUME = "code-volume"
# Caches that default to $HOME (read-only with the image) go under /tmp.
WRITABLE_ENV = [
    {"name": "XDG_CACHE_HOME", "value": "/tmp/.cache"},
    {"name": "MPLCONFIGDIR", "value": "/tmp/.config/matplotlib"},
    {"name": "HF_HOME", "value": "/tmp/.cache/huggingface"},
]


def cpu_quantity(cores: float) -> str:
    """1.0 -> "1", 0.5 -> "500m"."""
    if float(cores).is_integer():
        return str(int(cores))
    return f"{round(cores * 1000)}m"


def cpu_cores(quantity: Quantity) -> float:
    """A CPU quantity as cores: 4 -> 4.0, "500m" -> 0.5, "2" -> 2.0."""
    text = str(quantity).strip()
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)


def _volume_name(prefix: str, name: str) -> str:
    """A DNS-label volume name for a claim or secret (dots are not allowed, 63 characters at most)."""
    clean = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    full = f"{prefix}-{clean}"
    if len(full) <= 63:
        return full
    return f"{full[:56].rstrip('-')}-{hashlib.sha256(full.encode()).hexdigest()[:6]}"


def claims(job: RLJob) -> list[VolumeSource]:
    """The job's PersistentVolumeClaims (model, data, checkpoints), one per mount path."""
    spec = job.spec
    found: list[VolumeSource] = []
    for source in (spec.model.volume, spec.data.volume, spec.checkpoint.volume):
        if source is not None and all(s.mount_path != source.mount_path for s in found):
            found.append(source)
    return found


def token_secrets(job: RLJob) -> list[tuple[str, str, str]]:
    """(function name, secret name, key) of every remote reward with a token Secret."""
    return [
        (f.name, f.remote.token_secret.name, f.remote.token_secret.key)
        for f in job.spec.reward.functions
        if f.remote is not None and f.remote.token_secret is not None
    ]


def base_volumes(job: RLJob) -> list[dict[str, Any]]:
    """What every pod of the job has: /tmp (writable with a read-only root) and the job's token."""
    token = {"secretName": token_secret_name(job), "items": [{"key": JOB_TOKEN_KEY, "path": JOB_TOKEN_KEY}]}
    return [{"name": TMP_VOLUME, "emptyDir": {}}, {"name": JOB_TOKEN_VOLUME, "secret": token}]


def base_mounts() -> list[dict[str, Any]]:
    return [
        {"name": TMP_VOLUME, "mountPath": "/tmp"},
        {"name": JOB_TOKEN_VOLUME, "mountPath": JOB_TOKEN_DIR, "readOnly": True},
    ]


def volumes(job: RLJob, *, tokens: bool) -> list[dict[str, Any]]:
    """Pod volumes: /tmp and the job's token, the ConfigMap, each claim once, and (for reward and driver)
    the remote rewards' token Secrets."""
    out = [*base_volumes(job), {"name": CONFIG_VOLUME, "configMap": {"name": config_name(job)}}]
    seen: set[str] = set()
    for source in claims(job):
        if source.claim_name in seen:
            continue
        seen.add(source.claim_name)
        out.append(
            {
                "name": _volume_name("pvc", source.claim_name),
                "persistentVolumeClaim": {"claimName": source.claim_name},
            }
        )
    if tokens:
        for function, secret, key in token_secrets(job):
            out.append(
                {
                    "name": _volume_name("token", function),
                    "secret": {"secretName": secret, "items": [{"key": key, "path": key}]},
                }
            )
    return out


def volume_mounts(job: RLJob, *, tokens: bool) -> list[dict[str, Any]]:
    """Mounts matching `volumes`: /tmp, the job's token, /etc/rljob, each claim at its mountPath, remote
    rewards' tokens under /var/run/secrets/rljob."""
    out = [*base_mounts(), {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
    for source in claims(job):
        out.append(
            {
                "name": _volume_name("pvc", source.claim_name),
                "mountPath": source.mount_path,
                "readOnly": source.read_only,
            }
        )
    if tokens:
        for function, _secret, _key in token_secrets(job):
            out.append(
                {
                    "name": _volume_name("token", function),
                    "mountPath": f"{TOKEN_DIR}/{function}",
                    "readOnly": True,
                }
            )
    return out


def code_volumes(job: RLJob) -> list[dict[str, Any]]:
    """spec.code's cluster sources as volumes: the ConfigMap's files, the claim (read-only)."""
    code, out = job.spec.code, []
    if code.config_map is not None:
        out.append({"name": CODE_CONFIG_MAP_VOLUME, "configMap": {"name": code.config_map}})
    if code.volume is not None:
        claim = {"claimName": code.volume.claim_name, "readOnly": True}
        out.append({"name": CODE_CLAIM_VOLUME, "persistentVolumeClaim": claim})
    return out


def code_mounts(job: RLJob) -> list[dict[str, Any]]:
    """Where `code_volumes` go: the folders spec.code's cluster path names."""
    code, out = job.spec.code, []
    if code.config_map is not None:
        out.append({"name": CODE_CONFIG_MAP_VOLUME, "mountPath": CODE_CONFIG_MAP_DIR, "readOnly": True})
    if code.volume is not None:
        mount = {"name": CODE_CLAIM_VOLUME, "mountPath": CODE_VOLUME_DIR, "readOnly": True}
        out.append({**mount, **({"subPath": code.volume.sub_path} if code.volume.sub_path else {})})
    return out


def code_env(job: RLJob) -> list[dict[str, Any]]:
    """PYTHONPATH holding the mounted code, where spec.code names a cluster source (the image sets none)."""
    folders = job.spec.code.cluster_path()
    return [{"name": "PYTHONPATH", "value": ":".join(folders)}] if folders else []


def shm_volume(size: str) -> dict[str, Any]:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def shm_mount() -> dict[str, Any]:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def pool_resources(placement: Placement, *, cpus: float, gpus: int) -> dict[str, dict[str, str]]:
    """Container resources: the pool's CPUs (unless its resources set cpu), its extras, and GPUs as request
    and limit (an extended resource must have both, equal)."""
    requests = {"cpu": cpu_quantity(cpus)}
    requests.update({k: str(v) for k, v in placement.resources.requests.items()})
    limits = {k: str(v) for k, v in placement.resources.limits.items()}
    if gpus:
        requests[GPU] = str(gpus)
        limits[GPU] = str(gpus)
    out = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def ray_cpus(resources: dict[str, dict[str, str]], cpus: float) -> int:
    """CPUs a Ray node advertises: what its pod requests, at least what its actors need, whole cores."""
    return max(1, math.ceil(max(cpu_cores(resources["requests"]["cpu"]), cpus)))


def container(
    job: RLJob, name: str, security: SecurityContext, image: str | None = None, **fields: Any
) -> dict[str, Any]:
    """A container of `image` (default: the job's worker image): name, image and pull policy, then `fields`
    in the order given, then its securityContext."""
    return {
        "name": name,
        "image": image or job.spec.image,
        "imagePullPolicy": job.spec.image_pull_policy,
        **fields,
        "securityContext": security.container_fields(),
    }


def pod_template(
    labels: Mapping[str, str],
    main: dict[str, Any],
    *,
    account: Mapping[str, Any],
    security: SecurityContext,
    volumes: list[dict[str, Any]] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    pull_secrets: Sequence[LocalObjectReference] = (),
) -> dict[str, Any]:
    """The one pod template builder of the pools, the head and the driver: their labels, and a spec of
    `account` (service account fields, restart policy), the image pull secrets, its securityContext, the
    one container, its volumes and placement."""
    spec: dict[str, Any] = {**account}
    if pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret.name} for secret in pull_secrets]
    spec.update(securityContext=security.pod_fields(), containers=[main])
    if volumes is not None:
        spec["volumes"] = volumes
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}
