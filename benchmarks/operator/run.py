"""Operator benchmark: 50 RLJobs applied at once on the simulated cluster (e2e/: real API server,
scheduler, controller-manager, KubeRay; kwok nodes).

Measures, per RLJob, from its create call returning:
- apply -> RayCluster created (the operator's create handler; target p99 < 2 s),
- apply -> the pools' pods all Running (KubeRay, scheduler, kwok after the operator),
- apply -> phase Running (pools, head and driver running, as the operator's status says),
and the operator's resident memory (peak, sampled every 0.2 s; target < 200 MB), CPU time and
reconcile errors (target 0). Baseline, in the same run and on the same cluster: the same 50
RayClusters (as the operator renders them) created directly by this script, timed the same way,
which is what the control plane alone costs under this load. `--before GIT_REF`: the operator of that
commit (its packages from a git worktree) does the same burst first, in its own namespace of the same
cluster, deleted (and gone) before this tree's operator starts, and a table puts the two side by side.

kwok runs no container and would complete the driver Job at once, so, as in the integration tests,
head and driver pods are placed on a label no node has and this script reports them Running as a
kubelet would, the moment they appear.

    python benchmarks/operator/run.py [--jobs 50] [--interval 5] [--json out.json] [--crd FILE] [--before GIT_REF]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from rljob_operator.options import RenderOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmark's own module, also when loaded by path
from operator_watch import (
    Recorder,
    cpu_seconds,
    handler_stats,
    latencies,
    operator_metrics,
    quietly,
    rss_mb,
    sample_rss,
)

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"
SYSTEM_POOL = {"rljob.io/e2e-pool": "system"}


def sh(*args: str, env: dict[str, str], input: str | None = None) -> str:
    out = subprocess.run(list(args), env=env, input=input, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{' '.join(args)}:\n{out.stderr[-2000:]}")
    return out.stdout


def start_cluster(state: Path) -> dict[str, str]:
    env = {**os.environ, "RLJOB_E2E_STATE": str(state)}
    sh("bash", str(E2E / "cluster.sh"), "start", env=env)
    dump = subprocess.run(
        ["bash", "-c", f'eval "$(bash {E2E / "cluster.sh"} env)" && env -0'], env=env, capture_output=True, check=True
    ).stdout.decode()
    env = dict(item.split("=", 1) for item in dump.split("\0") if "=" in item)
    sh("bash", str(E2E / "cluster.sh"), "kuberay", env=env)
    # 3 one-CPU pods per job (rollout, trainer, reward): 18 nodes of 32 cores hold the operator's 50 jobs, the
    # earlier operator's 50 (--before) and the baseline's 50 RayClusters side by side.
    sh(sys.executable, str(E2E / "nodes.py"), "apply", "--pool", "cpu:18:0", env=env)
    return env


def rljob(name: str, namespace: str) -> dict[str, Any]:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


def baseline(jobs: int, options: Any) -> dict[str, Any]:
    """The same RayClusters, created directly: the control plane's own cost under the same load."""
    from rljob_api import parse_rljob
    from rljob_operator.options import ElasticGroups
    from rljob_operator.render.raycluster import render_ray_cluster

    ns = "baseline"
    client.CoreV1Api().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    recorder = Recorder(ns)
    for target in (recorder.watch_ray_clusters, recorder.kubelet):
        threading.Thread(target=quietly(target, recorder.stop), daemon=True).start()
    time.sleep(1)
    custom = client.CustomObjectsApi()
    applied: dict[str, float] = {}
    for i in range(jobs):
        name = f"base-{i:03d}"
        doc = render_ray_cluster(parse_rljob(rljob(name, ns)), options, ElasticGroups())
        doc["metadata"]["labels"] = {"rljob.io/job": name}
        custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", doc)
        applied[name] = time.monotonic()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(recorder.pools_running) < jobs:
        time.sleep(0.5)
    recorder.stop.set()
    return {
        "create_to_raycluster_seen": latencies(applied, recorder.ray_cluster),
        "create_to_pools_running": latencies(applied, recorder.pools_running),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--interval", type=float, default=5.0, help="the operator's status poll interval")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--crd", type=Path, default=REPO / "crds" / "rljob.io_rljobs.yaml")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--before",
        metavar="GIT_REF",
        help="first run the operator of this commit (a git worktree) the same way, on the same cluster: before/after",
    )
    return parser.parse_args()


def install_crd(env: dict[str, str], crd: Path) -> None:
    kubectl = str(Path(env["RLJOB_E2E_BIN"]) / "kubectl")
    sh(kubectl, "apply", "--server-side", "-f", str(crd), env=env)
    for _ in range(60):  # `kubectl wait` fails at once while the CRD has no conditions yet
        try:
            sh(kubectl, "wait", "--for=condition=Established", "crd/rljobs.rljob.io", env=env)
            break
        except RuntimeError:
            time.sleep(1)


def worktree_env(env: dict[str, str], ref: str, state: Path) -> dict[str, str]:
    """The environment that runs the packages of commit `ref` (checked out as a git worktree in `state`)
    ahead of this tree's editable install."""
    folder = state / "before"
    sh("git", "-C", str(REPO), "worktree", "add", "--detach", str(folder), ref, env=env)
    where = [folder / part for part in ("api", "operator", "workers", "proto/gen")]
    return {**env, "PYTHONPATH": os.pathsep.join(str(path) for path in where)}


def start_operator(
    env: dict[str, str], state: Path, interval: float, name: str = "operator"
) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m rljob_operator` with admin credentials; its log in the state folder. Returns it and its
    metrics port."""
    metrics_port = 18000 + os.getpid() % 1000
    log = (state / f"{name}.log").open("wb")
    operator = subprocess.Popen(
        [sys.executable, "-m", "rljob_operator", f"--interval={interval}", "--metrics-host=127.0.0.1",
         f"--metrics-port={metrics_port}", f"--system-node-selector={json.dumps(SYSTEM_POOL)}"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    return operator, metrics_port


def burst(operator: subprocess.Popen[bytes], metrics_port: int, ns: str, args: argparse.Namespace) -> dict[str, Any]:
    """Create `args.jobs` RLJobs one after the other and time each (see the module's docstring)."""
    time.sleep(5)  # the operator lists RLJobs and starts watching
    idle_mb = rss_mb(operator.pid)
    cpu_before = cpu_seconds(operator.pid)
    recorder = Recorder(ns)
    for target in (recorder.watch_ray_clusters, recorder.watch_rljobs, recorder.kubelet):
        threading.Thread(target=quietly(target, recorder.stop), daemon=True).start()
    time.sleep(1)
    peak = sample_rss(operator, recorder.stop, idle_mb)
    custom = client.CustomObjectsApi()
    applied: dict[str, float] = {}
    burst_start = time.monotonic()
    for i in range(args.jobs):
        name = f"bench-{i:03d}"
        custom.create_namespaced_custom_object("rljob.io", "v1alpha1", ns, "rljobs", rljob(name, ns))
        applied[name] = time.monotonic()
    burst_s = time.monotonic() - burst_start
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and len(recorder.running) < args.jobs:
        time.sleep(0.5)
    time.sleep(2 * args.interval)  # a few more polls at steady state
    recorder.stop.set()
    cpu = cpu_seconds(operator.pid) - cpu_before
    metrics, errors = operator_metrics(metrics_port)
    return {
        "jobs": args.jobs,
        "interval_s": args.interval,
        "apply_burst_s": round(burst_s, 2),
        "operator": {
            "apply_to_raycluster": latencies(applied, recorder.ray_cluster),
            "apply_to_pools_running": latencies(applied, recorder.pools_running),
            "apply_to_phase_running": latencies(applied, recorder.running),
            "create_handler": handler_stats(metrics, "reconcile"),
            "rss_idle_mb": round(idle_mb, 1),
            "rss_peak_mb": round(max(peak), 1),
            "cpu_seconds": round(cpu, 1),
            "reconcile_errors": errors,
        },
    }


def delete_namespace(ns: str, timeout: float = 300) -> None:
    """Delete `ns` (its RLJobs, their children, their pods) and wait until it is gone."""
    core = client.CoreV1Api()
    core.delete_namespace(ns)
    deadline = time.monotonic() + timeout
    while ns in {n.metadata.name for n in core.list_namespace().items if n.metadata}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"namespace {ns} still there after {timeout:.0f}s")
        time.sleep(1)


def before_after(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The two operators side by side: apply -> RayCluster p50/p99, peak memory, CPU, and after/before."""
    rows = [
        ("apply -> RayCluster p50 (s)", before["apply_to_raycluster"]["p50_s"], after["apply_to_raycluster"]["p50_s"]),
        ("apply -> RayCluster p99 (s)", before["apply_to_raycluster"]["p99_s"], after["apply_to_raycluster"]["p99_s"]),
        (
            "apply -> phase Running p99 (s)",
            before["apply_to_phase_running"]["p99_s"],
            after["apply_to_phase_running"]["p99_s"],
        ),
        ("operator RSS peak (MB)", before["rss_peak_mb"], after["rss_peak_mb"]),
        ("operator CPU (s)", before["cpu_seconds"], after["cpu_seconds"]),
    ]
    lines = [f"{'':32} {'before':>8} {'after':>8} {'after/before':>12}"]
    for name, old, new in rows:
        ratio = f"{new / old:.2f}" if old and new is not None else "-"
        lines.append(f"{name:32} {old!s:>8} {new!s:>8} {ratio:>12}")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    state = Path(tempfile.mkdtemp(prefix="rljob-bench-"))
    env = start_cluster(state)
    operator: subprocess.Popen[bytes] | None = None
    try:
        install_crd(env, args.crd)
        config.load_kube_config(env["KUBECONFIG"])
        runs = [("bench", env)]
        if args.before:
            runs.insert(0, ("bench-before", worktree_env(env, args.before, state)))
        bursts: dict[str, dict[str, Any]] = {}
        for ns, run_env in runs:
            client.CoreV1Api().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            operator, metrics_port = start_operator(run_env, state, args.interval, ns)
            bursts[ns] = burst(operator, metrics_port, ns, args)
            operator.terminate()
            operator.wait(timeout=30)
            operator = None
            if ns != runs[-1][0]:  # the next operator watches every namespace: leave it none of these jobs
                delete_namespace(ns)
        result = bursts["bench"]
        if args.before:
            result["before"] = {"ref": args.before, **bursts["bench-before"]}
            print(before_after(bursts["bench-before"]["operator"], result["operator"]))
        result["baseline_direct_rayclusters"] = baseline(args.jobs, RenderOptions(system_node_selector=SYSTEM_POOL))
        result["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(timeout=30)
        subprocess.run(["bash", str(E2E / "cluster.sh"), "clean"], env=env, capture_output=True)
        if args.before:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(state / "before")])


if __name__ == "__main__":
    sys.exit(main())
