"""What `make e2e-real` sets up on the e2e cluster's real node before it applies an RLJob: the images,
the operator installed by its Helm chart into a pod, the worker environment's mount, and the job's
model, data and run volumes (hostPath PersistentVolumes bound to the claims the example names).

The worker pods run the worker-test image (e2e/images.sh): the full worker image's runtime, whose
Python environment is a folder on the host mounted read-only at /opt/rljob/venv. KubeRay and the
operator build those pods, so the mount is added at admission by a MutatingAdmissionPolicy that
matches the worker-test image, and nothing in the product knows about it.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from e2e_cluster import E2E, REPO, Cluster, wait_for
from e2e_registry import PULL_SECRET

from conftest import store_connect_seconds

NODE_SELECTOR = {"rljob.io/e2e-node": "real"}
TOLERATIONS = [{"key": "rljob.io/e2e-real-node", "operator": "Exists", "effect": "NoSchedule"}]
ENV_MOUNT = "/opt/rljob/venv"
RAYLET_LOG = "/tmp/ray/session_latest/logs/raylet.out"  # Ray's default temp folder in the pod


def images_env() -> dict[str, str]:
    """RLJOB_E2E_* of `e2e/images.sh env`: the images' names and archives, the worker environment."""
    out = subprocess.run(["bash", str(E2E / "images.sh"), "env"], capture_output=True, text=True, check=True)
    found = {}
    for word in shlex.split(out.stdout):
        name, _, value = word.partition("=")
        if name.startswith("RLJOB_E2E_"):
            found[name] = value
    return found


def images_missing() -> list[str]:
    """What `e2e/images.sh check` says is not built (empty: the operator and worker-test images are there)."""
    out = subprocess.run(["bash", str(E2E / "images.sh"), "check"], capture_output=True, text=True)
    if out.returncode == 0:
        return []
    return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()] or ["e2e/images.sh check failed"]


def worker_env_policy(
    env_folder: str, *image_prefixes: str, name: str = "rljob-e2e-worker-env"
) -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy `name` (and its binding) mounting `env_folder` at /opt/rljob/venv, read-only, in
    every container and init container of a pod that runs an image of `image_prefixes` (the worker-test
    image's, imported or pulled; the rollout-vllm-test image's, with vLLM's environment)."""
    mount = f'Object.spec.containers.volumeMounts{{name: "rljob-env", mountPath: "{ENV_MOUNT}", readOnly: true}}'
    uses = "(" + " || ".join(f'c.image.startsWith("{prefix}")' for prefix in image_prefixes) + ")"
    init_mount = mount.replace("spec.containers", "spec.initContainers")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                ]
            },
            "matchConditions": [
                {"name": "worker-test-image", "expression": f"object.spec.containers.exists(c, {uses})"}
            ],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": (
                            "Object{spec: Object.spec{"
                            'volumes: [Object.spec.volumes{name: "rljob-env", hostPath: Object.spec.volumes.hostPath'
                            f'{{path: "{env_folder}", type: "Directory"}}}}], '
                            f"containers: object.spec.containers.filter(c, {uses}).map(c, "
                            f"Object.spec.containers{{name: c.name, volumeMounts: [{mount}]}})}}}}"
                        )
                    },
                },
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": (
                            "has(object.spec.initContainers) && object.spec.initContainers.exists(c, "
                            f"{uses}) ? Object{{spec: Object.spec{{initContainers: object.spec.initContainers"
                            f".filter(c, {uses}).map(c, Object.spec.initContainers{{name: c.name, "
                            f"volumeMounts: [{init_mount}]}})}}}} : Object{{}}"
                        )
                    },
                },
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name},
    }
    return [policy, binding]


def install_operator(
    cluster: Cluster, image: str, chart: list[str], pull_secret: str, namespace: str = "rljob-system"
) -> float:
    """`helm install` of the chart (`chart`: where it comes from, and how to reach it) with the operator's
    image pulled with `pull_secret`, on the real node; waits for the operator's pod to be ready and returns the
    seconds it took."""
    repository, _, tag = image.rpartition(":")
    placement = {"nodeSelector": NODE_SELECTOR, "tolerations": TOLERATIONS}
    t0 = time.monotonic()
    subprocess.run(
        [str(Path(cluster.env["RLJOB_E2E_BIN"]) / "helm"), "install", "rljob", *chart,
         "--namespace", namespace, "--wait", "--timeout", "5m",
         "--set", f"image.repository={repository}", "--set-string", f"image.tag={tag}",  # a tag may be all digits
         "--set", "image.pullPolicy=IfNotPresent",
         "--set-json", f"imagePullSecrets={json.dumps([{'name': pull_secret}])}",
         "--set", "operator.interval=1",
         "--set-json", f"nodeSelector={json.dumps(NODE_SELECTOR)}",
         "--set-json", f"tolerations={json.dumps(TOLERATIONS)}",
         "--set-json", f"systemPlacement={json.dumps(placement)}",
         # head and driver sized for one 2-core node
         "--set", "ray.head.cpu=100m", "--set", "ray.head.memory=3Gi",
         "--set", "driver.cpu=100m", "--set", "driver.memory=3Gi"],
        env=cluster.env, check=True, capture_output=True, text=True, timeout=330,
    )  # fmt: skip
    return time.monotonic() - t0


def make_assets(folder: Path, built: Path) -> None:
    """The example's model and data, made by the user's own command, world-readable. `built` is the model as
    that command builds it (conftest's `example_model`): copied first, the command finds it made already."""
    shutil.copytree(built, folder / "models" / "tiny-arith")
    subprocess.run(
        [str(Path(sys.executable).parent / "rljob"), "make-model", "--task", "arithmetic",
         "--out", str(folder / "models" / "tiny-arith"), "--data", str(folder / "data" / "arithmetic-train.jsonl"),
         "--eval-data", str(folder / "data" / "arithmetic-eval.jsonl")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def make_runs_folder(folder: Path) -> None:
    """Where the pods write checkpoints and metrics: root's, mode 0755, as a fresh claim's filesystem is. The
    pods (uid 1000) write it through their fsGroup (spec.securityContext), which the kubelet sets on a `local`
    volume as on most claims' (not on hostPath's)."""
    folder.mkdir(parents=True)
    folder.chmod(0o755)


def host_volume(name: str, namespace: str, claim: str, path: Path, local: bool = False) -> list[dict[str, Any]]:
    """A PersistentVolume on the real node, bound in advance to the claim `claim`, and the claim: hostPath, or
    with `local` a `local` volume (pinned to the node), whose ownership the pods' fsGroup sets."""
    size = {"storage": "1Gi"}
    source: dict[str, Any] = {"hostPath": {"path": str(path), "type": "Directory"}}
    if local:
        [(label, value)] = NODE_SELECTOR.items()
        term = {"matchExpressions": [{"key": label, "operator": "In", "values": [value]}]}
        source = {"local": {"path": str(path)}, "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": size,
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            **source,
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    claim_doc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": name,
            "resources": {"requests": size},
        },
    }
    return [volume, claim_doc]


def cluster_job(namespace: str, image: str) -> dict[str, Any]:
    """examples/arithmetic-cluster.yaml in `namespace`, running `image`, every pool on the real node: the image
    pulled from the node's registry with the pull Secret PULL_SECRET of the job's namespace."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "arithmetic-cluster.yaml").read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"].update(image=image, imagePullPolicy="IfNotPresent", imagePullSecrets=[{"name": PULL_SECRET}])
    for pool in ("rollout", "trainer", "reward"):
        doc["spec"][pool].update(nodeSelector=NODE_SELECTOR, tolerations=TOLERATIONS)
    doc["spec"]["trainer"]["shmSize"] = TRAINER_SHM_SIZE
    return doc


def raylet_store_connect(cluster: Cluster, namespace: str, job: str) -> dict[str, float]:
    """Each of the job's Ray pods: the seconds its raylet took to reach the object store it had just
    started, read from the raylet's log in the pod."""
    selector = f"rljob.io/job={job},ray.io/node-type"
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout.split()
    return {
        pod.removeprefix("pod/"): store_connect_seconds(
            cluster.kubectl("exec", "-n", namespace, pod, "--", "cat", RAYLET_LOG).stdout
        )
        for pod in pods
    }


# The trainer pool's /dev/shm in the apply test: set in the spec, read back inside the running pod.
TRAINER_SHM_SIZE, TRAINER_SHM_BYTES = "384Mi", 384 * 2**20


def shm_size_bytes(cluster: Cluster, namespace: str, pod: str) -> int:
    """The size of /dev/shm inside `pod` (`df -B1 /dev/shm` through kubectl exec): the sizeLimit of the
    memory-backed emptyDir the operator mounts there (tmpfs takes it as its size)."""
    out = cluster.kubectl("exec", "-n", namespace, pod, "--", "df", "-B1", "/dev/shm").stdout
    filesystem, size, *_ = out.splitlines()[-1].split()
    assert filesystem in ("tmpfs", "shm"), f"/dev/shm of {pod} is {filesystem}, not memory:\n{out}"
    return int(size)


def pool_pod_shm(cluster: Cluster, namespace: str, job: str, pool: str) -> dict[str, int]:
    """Each pod of the pool: its /dev/shm size in bytes."""
    selector = f"rljob.io/job={job},rljob.io/pool={pool}"
    pods = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "name").stdout.split()
    return {pod.removeprefix("pod/"): shm_size_bytes(cluster, namespace, pod.removeprefix("pod/")) for pod in pods}


def read_running_pods(cluster: Cluster, namespace: str, job: str) -> dict[str, Any]:
    """What the apply test reads inside the job's pods while it trains: each Ray pod's raylet connect time
    to its object store (store_connect), each trainer pod's /dev/shm size (shm) and the images the pods run."""
    pods = cluster.objects("pods", namespace, f"rljob.io/job={job}")
    return {
        "store_connect": raylet_store_connect(cluster, namespace, job),
        "shm": pool_pod_shm(cluster, namespace, job, "trainer"),
        "images": sorted({c["image"] for pod in pods for c in pod["spec"]["containers"]}),
    }


def seconds_per_step(metrics: Path) -> tuple[float, list[float]]:
    """(mean seconds per train step after the first, every step's mean reward) from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    first, last = rows[0], rows[-1]
    per_step = (last["elapsed_seconds"] - first["elapsed_seconds"]) / max(1, last["step"] - first["step"])
    return per_step, [r["reward_mean"] for r in rows]


def diagnose(cluster: Cluster, namespace: str) -> str:
    """What a failed run leaves to read: pods, the RLJob, the driver's, operator's and KubeRay's logs."""
    parts = []
    for args in (
        ("get", "pods", "-A", "-o", "wide"),
        ("get", "rlj", "-n", namespace, "-o", "yaml"),
        ("describe", "pods", "-n", namespace),
        ("logs", "-n", namespace, "-l", "rljob.io/component=driver", "--tail=80"),
        ("logs", "-n", "rljob-system", "deploy/rljob-rljob-operator", "--tail=60"),
    ):
        out = cluster.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{out.stdout[-6000:]}{out.stderr[-2000:]}")
    kuberay = cluster.state / "logs" / "kuberay-operator.log"
    if kuberay.exists():
        parts.append(f"KubeRay (last lines):\n{kuberay.read_text()[-3000:]}")
    return "\n".join(parts)


def wait_gone(cluster: Cluster, namespace: str, selector: str, kinds: str, timeout: float = 180) -> None:
    """Wait until no object of `kinds` with the label `selector` is left in the namespace."""

    def gone() -> bool:
        out = cluster.kubectl("get", kinds, "-n", namespace, "-l", selector, "-o", "name", check=False)
        return out.returncode == 0 and not out.stdout.strip()

    wait_for(f"{kinds} of {selector} deleted", gone, timeout=timeout, every=1)
