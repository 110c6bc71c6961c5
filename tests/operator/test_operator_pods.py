"""What every pod of a job gets besides its container: the image pull secrets (head, pools, driver) and, on
the pools, a memory-backed /dev/shm of the size the spec sets or the default for its GPUs and engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_operator_render import gpu_job, groups, one, rendered

from rljob_api import RLJobInvalid, load_rljob, parse_rljob
from rljob_api.placement import default_shm_size

REPO = Path(__file__).resolve().parents[2]


def pods_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template the operator and KubeRay make from: the head, each worker group, the driver."""
    cluster = one(docs, "RayCluster")["spec"]
    return {
        "head": cluster["headGroupSpec"]["template"]["spec"],
        **{pool: group["template"]["spec"] for pool, group in groups(docs).items()},
        "driver": one(docs, "Job")["spec"]["template"]["spec"],
    }


def test_image_pull_secrets_reach_every_pod() -> None:
    pods = pods_of(rendered(gpu_job(imagePullSecrets=[{"name": "registry"}, {"name": "mirror"}])))
    assert set(pods) == {"head", "rollout", "trainer", "reward", "driver"}
    for name, pod in pods.items():
        assert pod["imagePullSecrets"] == [{"name": "registry"}, {"name": "mirror"}], name
    for name, pod in pods_of(rendered(gpu_job())).items():
        assert "imagePullSecrets" not in pod, name  # none set: the service account's, if any


def test_image_pull_secrets_are_names() -> None:
    with pytest.raises(ValueError, match="imagePullSecrets"):
        gpu_job(imagePullSecrets=["registry"])


def shm(group: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The pool pod's /dev/shm volume and the mount paths of that volume in its container."""
    pod = group["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    mounts = [m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == "dshm"]
    return volume, mounts


def test_every_pool_pod_has_a_memory_backed_shm_sized_for_its_gpus_and_engine() -> None:
    # gpu-cluster: vllm rollout and FSDP trainer on 8 GPUs a pod, a CPU reward pool
    sizes = {"rollout": "256Gi", "trainer": "8Gi", "reward": "256Mi"}
    for pool, group in groups(rendered(gpu_job())).items():
        volume, mounts = shm(group)
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": sizes[pool]}, pool
        assert mounts == ["/dev/shm"], pool
    for pool, group in groups(rendered(load_rljob(REPO / "examples" / "arithmetic.yaml"))).items():
        assert shm(group)[0]["emptyDir"]["sizeLimit"] == "256Mi", pool  # hf on the CPU
    one_gpu_vllm = gpu_job(
        **{"rollout.gpusPerReplica": 1, "rollout.dataParallelSize": 1, "rollout.tensorParallelSize": 1}
    )
    assert shm(groups(rendered(one_gpu_vllm))["rollout"])[0]["emptyDir"]["sizeLimit"] == "32Gi"


def test_shm_size_from_the_spec() -> None:
    job = gpu_job(**{"trainer.shmSize": "24Gi", "reward.shmSize": "512Mi"})
    g = groups(rendered(job))
    assert shm(g["trainer"])[0]["emptyDir"]["sizeLimit"] == "24Gi"
    assert shm(g["reward"])[0]["emptyDir"]["sizeLimit"] == "512Mi"
    assert shm(g["rollout"])[0]["emptyDir"]["sizeLimit"] == "256Gi"
    # the head (GCS only) and the driver run no NCCL or engine: the runtime's /dev/shm
    docs = rendered(job)
    for name in ("head", "driver"):
        assert all(v["name"] != "dshm" for v in pods_of(docs)[name]["volumes"]), name


@pytest.mark.parametrize("size", ["0", "1.5Gi", "8GB", "-1Gi", "Gi"])
def test_shm_size_must_be_a_whole_quantity(size: str) -> None:
    with pytest.raises(ValueError, match="shmSize"):
        gpu_job(**{"trainer.shmSize": size})


@pytest.mark.parametrize(
    ("gpus", "engine", "size"),
    [(0, None, "256Mi"), (1, None, "256Mi"), (2, None, "2Gi"), (8, None, "8Gi"), (0, "hf", "256Mi"),
     (0, "vllm", "4Gi"), (1, "sglang", "32Gi"), (4, "vllm", "128Gi"), (8, "hf", "8Gi")],
)  # fmt: skip
def test_default_shm_size(gpus: int, engine: str | None, size: str) -> None:
    assert default_shm_size(gpus, engine) == size


def refusal(path: str, value: Any) -> str:
    """The one-line error of the arithmetic example with `path` (under spec) set to `value`."""
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    *parents, leaf = path.split(".")
    node = doc["spec"]
    for part in parents:
        node = node[part]
    node[leaf] = value
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    (error,) = info.value.errors
    return str(error)


def test_bad_shm_size_and_pull_secret_are_refused_naming_the_field() -> None:
    assert refusal("trainer.shmSize", "2GB") == (
        "spec.trainer.shmSize: '2GB' does not match ^[1-9][0-9]*(Ki|Mi|Gi|Ti|k|M|G|T)?$"
    )
    assert refusal("imagePullSecrets", ["registry"]) == (
        "spec.imagePullSecrets[0]: Input should be a valid dictionary or instance of LocalObjectReference"
    )


def test_a_checkpoint_volume_is_writable_by_default() -> None:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["checkpoint"]["volume"] = {"claimName": "runs", "mountPath": "/runs"}
    doc["spec"]["model"]["volume"] = {"claimName": "models"}
    spec = parse_rljob(doc).spec
    assert spec.checkpoint.volume is not None and spec.checkpoint.volume.read_only is False
    assert spec.model.volume is not None and spec.model.volume.read_only is True  # model and data: read-only
