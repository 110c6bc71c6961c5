"""The environment pool on the real node (test_e2e_real_environments.py): the tool example's cluster variant on
data whose tool is slow for a stretch of the run, and what its environment pods cost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from e2e_cluster import Cluster
from e2e_real import NODE_SELECTOR, TOLERATIONS
from e2e_registry import PULL_SECRET

from conftest import REPO

MODEL, DATA = "models/tiny-calculator", "data/calculator-slow-stretch.jsonl"  # under the assets volume
PER_STEP, GROUP = 8, 8  # promptsPerStep, groupSize: 64 episodes a step
MAX_EPISODES = 64  # maxEpisodesPerReplica: one replica may hold a whole step's episodes


def make_calculator_assets(assets: Path, model: Path, steps: int, slow: tuple[int, int], slow_seconds: float) -> None:
    """The tool example's model (built once, copied) and its data as `rljob make-model` writes it, in order, the
    tool of the prompts of steps [slow[0], slow[1]) taking `slow_seconds` a call (the `step_seconds` field the
    calculator reads from its task), the others none; world-readable."""
    target = assets / MODEL
    shutil.copytree(model, target)
    written = assets / "data" / "calculator-train.jsonl"
    subprocess.run(
        [str(Path(sys.executable).parent / "rljob"), "make-model", "--task", "calculator", "--out", str(target),
         "--data", str(written)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in written.read_text().splitlines()][: (steps + 4) * PER_STEP]
    assert len(rows) == (steps + 4) * PER_STEP, f"make-model wrote {len(rows)} rows"
    for i, row in enumerate(rows):
        row["step_seconds"] = str(slow_seconds if slow[0] * PER_STEP <= i < slow[1] * PER_STEP else 0.0)
    (assets / DATA).write_text("".join(json.dumps(row) + "\n" for row in rows))
    for path in [assets, *assets.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def calculator_job(namespace: str, image: str, name: str, steps: int, replicas: tuple[int, int]) -> dict[str, Any]:
    """examples/calculator-cluster.yaml as `name` in `namespace`, on the slow-stretch data, unshuffled, its
    environment pool `replicas` (min, max), every pool on the real node, `image` pulled with the pull Secret."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    doc["metadata"].update(name=name, namespace=namespace)
    spec = doc["spec"]
    spec.update(image=image, imagePullPolicy="IfNotPresent", imagePullSecrets=[{"name": PULL_SECRET}])
    for pool in ("rollout", "trainer", "environment"):
        spec[pool].update(nodeSelector=NODE_SELECTOR, tolerations=TOLERATIONS)
    spec["model"]["path"] = f"/mnt/rljob/{MODEL}"
    spec["data"].update(path=f"/mnt/rljob/{DATA}", fields=["answer", "step_seconds"], shuffle=False)
    spec["algorithm"].update(totalSteps=steps, promptsPerStep=PER_STEP, groupSize=GROUP)
    spec["checkpoint"].update(dir=f"/mnt/runs/{name}/checkpoints", everySteps=10)
    environment = spec["environment"]
    environment.update(replicas={"min": replicas[0], "max": replicas[1]}, maxEpisodesPerReplica=MAX_EPISODES)
    # Outside the slow stretch the load (tool calls in service) runs 5..11 (calls of 10-25 ms at 350-470 a
    # second), inside it 45 and more (a replica's sync tool runs 6 calls at once, on its threads): at 16 a
    # replica one replica fits the first with the policy's headroom, and the second asks for all four.
    environment["scaling"]["targetBacklogPerReplica"] = 16
    environment["args"] = {"step_latency_seconds": 0.0}  # each task's step_seconds sets it
    return doc


def delete_one_pod(cluster: Cluster, namespace: str, job: str, pool: str) -> tuple[str, float]:
    """Delete one Running pod of the pool (the newest); (its name, time.monotonic() of the delete)."""
    pods = [
        p
        for p in cluster.objects("pods", namespace, f"rljob.io/job={job},rljob.io/pool={pool}")
        if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    assert pods, f"no Running {pool} pod to delete"
    pod = max(pods, key=lambda p: p["metadata"]["creationTimestamp"])["metadata"]["name"]
    at = time.monotonic()
    cluster.kubectl("delete", "pod", "-n", namespace, pod, "--wait=false")
    return pod, at
