"""The e2e cluster's real node (e2e/node.sh): containers run, Services resolve and answer.

The session's cluster with the real node (real_node_fixtures.py, shared with the operator's e2e tests):
containerd + runc, the CNI bridge, the kubelet, kube-proxy and CoreDNS. Pods use the busybox image the node made locally
(`rljob.e2e/busybox:local`, never pulled) and tolerate the node's taint. Skips only where the
machine cannot run containers, naming what it lacks (e2e/node.sh check).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_cluster import Cluster, fresh_namespace, wait_for
from real_node_fixtures import REAL_NODE_MARKS, RealCluster

pytest_plugins = ["real_node_fixtures"]
pytestmark = [*REAL_NODE_MARKS]

IMAGE = "rljob.e2e/busybox:local"
BRIDGE = "rljob0"


@pytest.fixture(scope="module")
def cluster(real_cluster: RealCluster) -> Cluster:
    """The session's cluster with the real node (real_node_fixtures.py), which other modules' pods share."""
    print(f"\nset-up of the shared real node: {real_cluster.times}")
    return real_cluster.cluster


def pod(name: str, command: str, labels: dict[str, str] | None = None, restart: str = "Never") -> dict[str, Any]:
    """A busybox pod pinned to the real node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"rljob.io/e2e-node": "real"},
            "tolerations": [{"key": "rljob.io/e2e-real-node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "main", "image": IMAGE, "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", command]}
            ],
        },
    }


def run_pod(cluster: Cluster, ns: str, doc: dict[str, Any], phase: str) -> float:
    """Create the pod and wait for `phase`; returns the seconds it took. A Failed pod fails the test."""
    t0 = time.monotonic()
    cluster.apply(doc, "-n", ns)
    name = doc["metadata"]["name"]

    def reached() -> bool:
        got = (cluster.get("pod", name, ns) or {}).get("status", {}).get("phase")
        if got == "Failed" and phase != "Failed":
            logs = cluster.kubectl("logs", name, "-n", ns, check=False).stdout
            raise AssertionError(f"pod {name} Failed; logs:\n{logs}")
        return got == phase

    wait_for(f"pod {name} {phase}", reached, timeout=90)
    took = time.monotonic() - t0
    print(f"pod {ns}/{name} {phase} after {took:.1f}s")
    return took


WEB = "echo hello-from-web > /www/index.html; echo serving; exec httpd -f -v -p 8080 -h /www"


def serve(cluster: Cluster, ns: str) -> None:
    """A busybox httpd pod behind the Service `web` (port 80 -> 8080)."""
    run_pod(cluster, ns, pod("web", WEB, labels={"app": "web"}, restart="Always"), "Running")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    cluster.apply(service, "-n", ns)
    # A Service without its endpoint programmed yet is REJECTed ("No route to host"): wait until kube-proxy maps
    # it to the pod in the host's nat table, as a client outside this test would find it once it is set up.
    pod_ip = (cluster.get("pod", "web", ns) or {})["status"]["podIP"]
    wait_for("kube-proxy's rule for the Service", lambda: f"--to-destination {pod_ip}:8080" in _nat_rules(), timeout=30)


def _nat_rules() -> str:
    return subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True).stdout


def test_service_resolves_and_answers_from_another_pod(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    with fresh_namespace(cluster, request.node.name, "node") as ns:
        serve(cluster, ns)
        host = f"web.{ns}.svc.cluster.local"
        # busybox wget: no -T (it crashes Debian's static busybox 1.35); the pod's own timeout instead
        client = f"nslookup {host} && timeout 20 wget -q -O - http://{host}/ && echo client-done"
        run_pod(cluster, ns, pod("client", client), "Succeeded")
        logs = cluster.kubectl("logs", "client", "-n", ns).stdout
        ip = cluster.get("service", "web", ns)["spec"]["clusterIP"]  # type: ignore[index]
        assert ip.startswith("198.19."), ip
        assert f"Address: {ip}" in logs, logs
        assert "hello-from-web" in logs and "client-done" in logs, logs
        # the server's output (kubectl logs: httpd -v logs each answer with the client's address)
        # and a command run in it (kubectl exec)
        server_logs = cluster.kubectl("logs", "web", "-n", ns).stdout
        assert server_logs.startswith("serving\n") and "response:200" in server_logs, server_logs
        out = cluster.kubectl("exec", "web", "-n", ns, "--", "cat", "/www/index.html").stdout
        assert out == "hello-from-web\n"


def test_pod_reaches_api_server_through_kubernetes_service(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    with fresh_namespace(cluster, request.node.name, "node") as ns:
        # kubectl's in-cluster config: $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT (the Service's
        # ClusterIP), the ServiceAccount's token, and the server certificate checked against its ca.crt.
        # (Not busybox wget: its own TLS client fails the handshake with the API server.)
        script = (
            "nslookup kubernetes.default.svc.cluster.local && "
            'echo "service $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" && '
            "kubectl version -o json && kubectl auth whoami -o jsonpath='{.status.userInfo.username}'"
        )
        run_pod(cluster, ns, pod("api-client", script), "Succeeded")
        logs = cluster.kubectl("logs", "api-client", "-n", ns).stdout
        assert "Address: 198.19.0.1" in logs and "service 198.19.0.1:443" in logs, logs
        assert '"gitVersion": "v1.37.1"' in logs, logs
        assert logs.rstrip().endswith(f"system:serviceaccount:{ns}:default"), logs


def host_leftovers(cluster: Cluster) -> list[str]:
    """What pods leave on the host: veths on the bridge, IP leases, tasks, pod cgroups, pod folders."""
    node = cluster.state / "node"
    out = []
    veths = subprocess.run(["ip", "-o", "link", "show", "master", BRIDGE], capture_output=True, text=True).stdout
    out += [f"veth {line.split(':')[1].strip()}" for line in veths.splitlines()]
    out += [f"IP lease {p.name}" for p in (node / "cni" / "ipam" / "rljob-e2e").glob("198.*")]
    sock = str(node / "containerd" / "containerd.sock")
    tasks = subprocess.run(
        ["ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls", "-q"], capture_output=True, text=True
    )
    out += [f"task {t}" for t in tasks.stdout.split()]
    out += [f"cgroup {p}" for p in Path("/sys/fs/cgroup/memory/rljob-e2e/kubepods").glob("**/pod*")]
    out += [f"pod folder {p.name}" for p in (node / "kubelet" / "pods").glob("*")]
    out += [f"netns {p.name}" for p in (node / "containerd" / "state").glob("**/netns/*")]
    out += [f"CNI result {p.name}" for p in Path("/var/lib/cni/results").glob("rljob-e2e-*")]
    return out


def test_deleting_pods_leaves_nothing_behind(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    before = set(host_leftovers(cluster))  # what other modules' pods on the shared node hold (the operator's)
    with fresh_namespace(cluster, request.node.name, "node") as ns:
        serve(cluster, ns)
        assert set(host_leftovers(cluster)) - before, "a running pod has a veth, a lease, a task"
    # the test's namespace is being deleted now; wait for its pods to be gone from the node
    wait_for(
        f"no pods of {ns} on the real node",
        lambda: not cluster.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout,
        timeout=90,
    )
    deadline = time.monotonic() + 60
    while (left := set(host_leftovers(cluster)) - before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"left on the host after the pods were deleted: {sorted(left)}"


NODE_PROCESSES = ("kube-proxy", "kubelet", "containerd", "coredns", "api-forward", "registry")


def test_a_node_killed_without_its_stop_does_not_bar_the_next(
    cluster: Cluster, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A run cut off (its processes killed, no stop) leaves its bridge; the next node takes it over.

    The dead node is this module's own, killed with SIGKILL, its bridge relabelled as owned by a
    state folder that no longer exists, as after a CI run on this machine was killed.
    """
    for name in NODE_PROCESSES:
        pid = int((cluster.state / "pids" / f"{name}.pid").read_text())
        subprocess.run(["kill", "-KILL", "--", f"-{pid}"], check=False)
    vanished = tmp_path / "vanished-state"
    subprocess.run(["ip", "link", "set", BRIDGE, "alias", str(vanished)], check=True)
    ready = cluster.start_node()
    print(f"node Ready again after {ready:.1f}s, over a dead node's bridge")
    alias = subprocess.run(["ip", "-o", "link", "show", BRIDGE], capture_output=True, text=True).stdout
    assert f"alias {cluster.state.resolve()}" in alias, f"the new node owns the bridge: {alias}"
    with fresh_namespace(cluster, request.node.name, "node") as ns:
        run_pod(cluster, ns, pod("after", "echo ok"), "Succeeded")
