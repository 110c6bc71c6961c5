"""Pieces of the pod templates shared by the pools and the driver: volumes, mounts, resources."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rljob_api import RLJob, VolumeSource
from rljob_api.placement import Placement, Quantity

from .names import CONFIG_DIR, TOKEN_DIR, config_name

GPU = "nvidia.com/gpu"
CONFIG_VOLUME = "rljob-config"


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


def volumes(job: RLJob, *, tokens: bool) -> list[dict[str, Any]]:
    """Pod volumes: the ConfigMap, each claim once, and (for reward and driver) the token Secrets."""
    out: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "configMap": {"name": config_name(job)}}]
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
    """Mounts matching `volumes`: /etc/rljob, each claim at its mountPath, tokens under /var/run/secrets/rljob."""
    out: list[dict[str, Any]] = [{"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True}]
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


def container(job: RLJob, name: str, **fields: Any) -> dict[str, Any]:
    """A container of the job's image: name, image and pull policy, then `fields` in the order given."""
    return {"name": name, "image": job.spec.image, "imagePullPolicy": job.spec.image_pull_policy, **fields}


def pod_template(
    labels: Mapping[str, str],
    main: dict[str, Any],
    *,
    account: Mapping[str, Any],
    volumes: list[dict[str, Any]] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The one pod template builder of the pools, the head and the driver: their labels, and a spec of
    `account` (service account fields, restart policy), the one container, its volumes and placement."""
    spec: dict[str, Any] = {**account, "containers": [main]}
    if volumes is not None:
        spec["volumes"] = volumes
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}
