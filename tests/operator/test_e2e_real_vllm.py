"""`kubectl apply` of the cluster example with `engine: vllm` trains for real on the real node
(`make e2e-real-vllm`; not in `make test`: vLLM's 6 GB environment and its minutes on the node are more than
CI's budget holds).

The rollout pool's pods run the rollout-vllm-test image (docker/rollout-vllm.Dockerfile's runtime), pulled
from the node's registry with the job's pull Secret, with vLLM's CPU build (runtimes/vllm/requirements.lock, made
with that image's base and python3 by `e2e/images.sh rollout-vllm-test`) mounted at /opt/rljob/venv by an
admission policy, as the worker-test pods get theirs; head, trainer, reward and driver run the worker-test
image. KubeRay starts Ray in each; the driver's `rljob run --cluster` puts the rollout replica on the rollout
pod's Ray node, in vLLM's environment. The run must reach Succeeded and learn as the hf example does, vLLM's
engine process must run in the rollout pod, and every step's engine/trainer log-prob mismatch must be
fp32-small.

Skips where the real node cannot run, the images are not built, or vLLM's rollout environment is not.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import Cluster, wait_for
from e2e_real import (
    ENV_MOUNT,
    cluster_job,
    diagnose,
    host_volume,
    make_assets,
    make_runs_folder,
    seconds_per_step,
    wait_gone,
    worker_env_policy,
)
from e2e_registry import project_version, push_images
from real_node_fixtures import REAL_NODE_MARKS, RealCluster, RealOperator

from rljob_workers.driver.telemetry.ledger import read_ledger

pytest_plugins = ["real_node_fixtures"]
pytestmark = [*REAL_NODE_MARKS, pytest.mark.ray, pytest.mark.vllm_node, pytest.mark.timeout(2400)]

NS = "rljob-e2e-vllm"
JOB = "arithmetic"
POLICY = "rljob-e2e-rollout-vllm-env"
TIMEOUT = 1800  # apply -> Succeeded, vLLM's import, engine start and sampler compile in the pod included
LOGPROB_TOLERANCE = 1e-4  # fp32 on both sides (tests/test_vllm.py)


@dataclass
class VllmSetup:
    cluster: Cluster
    root: Path
    worker_image: str
    rollout_image: str


@pytest.fixture(scope="module")
def vllm_setup(
    real_cluster: RealCluster,
    real_operator: RealOperator,
    tmp_path_factory: pytest.TempPathFactory,
    example_model: Path,
) -> Iterator[VllmSetup]:
    env = real_operator.images.get("RLJOB_E2E_ROLLOUT_VLLM_ENV", "")
    if not (Path(env) / ".done").is_file():
        pytest.skip("vLLM's rollout environment is not built: e2e/images.sh rollout-vllm-test (make e2e-real-vllm)")
    cluster = real_cluster.cluster
    root = tmp_path_factory.mktemp("e2e-real-vllm")
    root.chmod(0o755)  # the pods' user reads the volumes below it
    registry = real_operator.registry
    push_images(registry, root, "rollout-vllm-test")
    rollout_image = f"{registry.address}/rljob/rljob-rollout-vllm-test:{project_version()}"
    s = VllmSetup(cluster, root, real_operator.worker_image, rollout_image)
    try:
        for doc in worker_env_policy(env, rollout_image, name=POLICY):
            cluster.apply(doc)
        make_assets(root / "assets", example_model)
        make_runs_folder(root / "runs")
        cluster.kubectl("create", "namespace", NS)
        cluster.apply(registry.pull_secret(NS))
        for name, claim in (("assets", "rljob-assets"), ("runs", "rljob-runs")):
            for doc in host_volume(f"{NS}-{name}", NS, claim, root / name, local=name == "runs"):
                cluster.apply(doc)
        # an admission policy takes effect a moment after it is made: a pod made before would miss its mount
        wait_for("the rollout pods' environment mount", lambda: _mounts_the_env(cluster, rollout_image), timeout=60)
        yield s
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", "--ignore-not-found", check=False)
        for name in ("assets", "runs"):
            cluster.kubectl("delete", "pv", f"{NS}-{name}", "--ignore-not-found", check=False)
        for kind in ("mutatingadmissionpolicybinding", "mutatingadmissionpolicy"):
            cluster.kubectl("delete", kind, POLICY, "--ignore-not-found", check=False)


def _mounts_the_env(cluster: Cluster, image: str) -> bool:
    """A server-side dry run of a pod of `image` comes back with the environment's mount."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mount-probe", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": image}]},
    }
    out = cluster.kubectl("create", "--dry-run=server", "-o", "yaml", "-f", "-", input=yaml.safe_dump(pod), check=False)
    if out.returncode:
        return False
    mounts = yaml.safe_load(out.stdout)["spec"]["containers"][0].get("volumeMounts", [])
    return any(m.get("mountPath") == ENV_MOUNT for m in mounts)


def vllm_job(s: VllmSetup) -> dict[str, Any]:
    """examples/arithmetic-cluster.yaml with vLLM as its rollout engine, its rollout pods on the rollout image."""
    job = cluster_job(NS, s.worker_image)
    job["spec"]["rollout"].update(engine="vllm", image=s.rollout_image, weightUpdate="drain")
    return job


def test_apply_with_vllm_trains_to_succeeded_with_the_engine_in_the_rollout_pod(vllm_setup: VllmSetup) -> None:
    s = vllm_setup
    cluster, job = s.cluster, vllm_job(s)
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    inside: dict[str, Any] = {}
    status = _watch(cluster, started, inside)
    took = time.monotonic() - started
    assert status.get("phase") == "Succeeded", f"the run ended {status.get('phase')}:\n{diagnose(cluster, NS)}"

    # vLLM's engine ran in the rollout pod, on the rollout image; the other pods ran the worker image
    assert inside["images"] == {"rollout": {s.rollout_image}, "others": {s.worker_image}}, inside["images"]
    assert any("EngineCore" in line for line in inside["processes"]), inside["processes"]
    # and that pod was Ready: KubeRay's probes ask its Ray dashboard agent, which needs ray[default] there too
    assert inside["rollout_ready"] == [True], inside["rollout_ready"]
    assert any("rollout 1/1" in message for message in inside["messages"]), inside["messages"]

    output = s.root / "runs" / JOB
    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_step, rewards = seconds_per_step(output / "metrics.jsonl")
    spec = job["spec"]
    assert len(rewards) == spec["algorithm"]["totalSteps"]
    assert rewards[0] <= 0.2 and statistics.mean(rewards[-5:]) >= 0.8, rewards
    mismatch = [r["logprob_mismatch_mean"] for r in records]
    assert None not in mismatch and max(mismatch) < LOGPROB_TOLERANCE, mismatch
    books = read_ledger(output / "metrics.jsonl", len(rewards), spec["algorithm"]["promptsPerStep"])
    assert books.clean, (books.prompts_lost, books.trained_twice, books.scored_twice)

    cluster.kubectl("delete", "rlj", JOB, "-n", NS, "--wait=true", "--timeout=120s")
    wait_gone(cluster, NS, f"rljob.io/job={JOB}", "pods,rayclusters,jobs")
    print(
        f"\nkubectl apply -> first step {inside.get('first_step', float('nan')):.1f}s, -> Succeeded {took:.1f}s; "
        f"{per_step:.3f} s/step; reward {rewards[0]:.3f} -> {statistics.mean(rewards[-5:]):.3f}; "
        f"mismatch max {max(mismatch):.2e}"
    )


def _watch(cluster: Cluster, started: float, inside: dict[str, Any]) -> dict[str, Any]:
    """Follow the RLJob until it ends; at its first train step, read the pods' images and the rollout pod's
    processes into `inside`. Its last status."""
    status: dict[str, Any] = {}
    seen: tuple[Any, ...] = ()
    inside["messages"] = []
    while time.monotonic() < started + TIMEOUT:
        status = (cluster.get("rlj", JOB, NS) or {}).get("status", {})
        if "first_step" not in inside and status.get("step", 0) >= 1:
            inside.update(first_step=time.monotonic() - started, **_read_pods(cluster))
        shown = (status.get("phase"), status.get("step"), status.get("message"))
        if shown != seen:
            print(f"{time.monotonic() - started:6.1f}s  {shown}", flush=True)
            inside["messages"].append(status.get("message") or "")
            seen = shown
        if status.get("phase") in ("Succeeded", "Failed"):
            break
        time.sleep(2)
    return status


def _read_pods(cluster: Cluster) -> dict[str, Any]:
    """The images of the rollout pod and of the others; the command lines of the rollout pod's processes and
    whether it is Ready."""
    pods = cluster.objects("pods", NS, f"rljob.io/job={JOB}")
    rollout = [p for p in pods if p["metadata"].get("labels", {}).get("rljob.io/pool") == "rollout"]
    images = {
        "rollout": {c["image"] for p in rollout for c in p["spec"]["containers"]},
        "others": {c["image"] for p in pods if p not in rollout for c in p["spec"]["containers"]},
    }
    listing = 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < "$f"; echo; done'
    processes = [
        line
        for p in rollout
        for line in cluster.kubectl(
            "exec", "-n", NS, p["metadata"]["name"], "--", "sh", "-c", listing
        ).stdout.splitlines()
    ]
    ready = [
        any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))
        for p in rollout
    ]
    return {"images": images, "processes": processes, "rollout_ready": ready}
