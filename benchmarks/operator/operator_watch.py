"""What the operator benchmark measures with: watch threads that time RLJobs and their children (and
play the kubelet for head and driver pods), the operator's memory, CPU and metrics, percentiles."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, watch


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Recorder:
    """Watches RayClusters, RLJobs and pods; plays the kubelet for head and driver pods."""

    def __init__(self, namespace: str) -> None:
        self.ns = namespace
        self.ray_cluster: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.pools_running: dict[str, float] = {}
        self._running_pods: dict[str, set[str]] = {}
        self.stop = threading.Event()
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()

    def watch_ray_clusters(self) -> None:
        w = watch.Watch()
        for event in w.stream(self.custom.list_namespaced_custom_object, "ray.io", "v1", self.ns, "rayclusters"):
            if event["type"] == "ADDED":
                job = event["object"]["metadata"]["labels"].get("rljob.io/job", "")
                self.ray_cluster.setdefault(job, time.monotonic())
            if self.stop.is_set():
                return

    def watch_rljobs(self) -> None:
        w = watch.Watch()
        for event in w.stream(self.custom.list_namespaced_custom_object, "rljob.io", "v1alpha1", self.ns, "rljobs"):
            obj = event["object"]
            if (obj.get("status") or {}).get("phase") == "Running":
                self.running.setdefault(obj["metadata"]["name"], time.monotonic())
            if self.stop.is_set():
                return

    def kubelet(self) -> None:
        """Pool pods: note when a job's three pools run. Head and driver pods stay unscheduled (no node has
        their label): report them Running."""
        w = watch.Watch()
        for event in w.stream(self.core.list_namespaced_pod, self.ns, label_selector="rljob.io/job"):
            pod = event["object"]
            labels = pod.metadata.labels or {}
            job = labels.get("rljob.io/job", "")
            if labels.get("rljob.io/pool") and pod.status.phase == "Running":
                running = self._running_pods.setdefault(job, set())
                running.add(labels["rljob.io/pool"])
                if len(running) == 3:
                    self.pools_running.setdefault(job, time.monotonic())
            system = labels.get("rljob.io/component") in ("head", "driver")
            if system and event["type"] != "DELETED" and pod.status.phase == "Pending":
                status = {
                    "phase": "Running",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Ready", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                    ],
                }
                try:
                    self.core.patch_namespaced_pod_status(pod.metadata.name, self.ns, {"status": status})
                except client.ApiException as exc:
                    print(f"kubelet: {pod.metadata.name}: {exc.status}", file=sys.stderr)
            if self.stop.is_set():
                return


def quietly(target: Any, stop: threading.Event) -> Any:
    """A watch thread that ends silently when the cluster goes away at the end of the run."""

    def run() -> None:
        try:
            target()
        except Exception:
            if not stop.is_set():
                raise

    return run


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def latencies(applied: dict[str, float], seen: dict[str, float]) -> dict[str, float | int | None]:
    values = [seen[n] - t for n, t in applied.items() if n in seen]
    if not values:
        return {"n": 0, "p50_s": None, "p99_s": None}
    return {"n": len(values), "p50_s": round(percentile(values, 50), 3), "p99_s": round(percentile(values, 99), 3)}


def handler_stats(metrics: str, handler: str) -> dict[str, float]:
    def total(name: str) -> float:
        prefix = f'rljob_operator_reconcile_seconds_{name}{{handler="{handler}",result="ok"}}'
        return sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(prefix))

    count = total("count")
    return {"count": count, "mean_s": round(total("sum") / count, 3) if count else 0.0}


def sample_rss(process: subprocess.Popen[bytes], stop: threading.Event, first: float) -> list[float]:
    """The process's resident memory every 0.2 s (a thread), until it exits or `stop` is set."""
    peak = [first]

    def sample() -> None:
        while process.poll() is None and not stop.is_set():
            peak.append(rss_mb(process.pid))
            time.sleep(0.2)

    threading.Thread(target=sample, daemon=True).start()
    return peak


def operator_metrics(port: int) -> tuple[str, float]:
    """The operator's metrics text and its error count."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        metrics = r.read().decode()
    error_lines = [line for line in metrics.splitlines() if line.startswith("rljob_operator_errors_total{")]
    return metrics, sum(float(line.split()[-1]) for line in error_lines)
