"""Helpers of the operator's integration tests: the e2e control plane, kubectl, the operator process,
a stand-in for the controller's ControlService, and a stand-in kubelet for head and driver pods.

Why a stand-in kubelet: kwok marks every pod of a Job Succeeded the moment it runs (no container
ever runs here), which would end every run at once. The tests therefore place the head and the
driver (the operator's "system" pods) on a node label no fake node has, so they stay Pending, and
move them to Running or Succeeded themselves, the way a kubelet would report a real run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import psutil
import pytest
import yaml

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"
CRD = REPO / "crds" / "rljob.io_rljobs.yaml"
NEEDED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "kuberay-operator",
    "helm",
)
CHART = REPO / "charts" / "rljob-operator"
SYSTEM_POOL = {"rljob.io/e2e-pool": "system"}  # no fake node has it: head and driver wait for the test
T = TypeVar("T")


def e2e_bin() -> Path:
    out = subprocess.run(["bash", str(E2E / "build.sh"), "bin"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def missing_binaries() -> list[str]:
    try:
        folder = e2e_bin()
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        return [f"e2e/build.sh bin failed: {exc}"]
    return [str(folder / b) for b in NEEDED if not (folder / b).is_file()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0, every: float = 0.3) -> T:
    """Poll until `check` returns something truthy; fail naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


class Cluster:
    """A running e2e control plane (started by e2e/cluster.sh into its own state folder)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = {**os.environ, "RLJOB_E2E_STATE": str(state)}

    def script(self, *args: str, timeout: float = 300) -> str:
        out = subprocess.run(
            ["bash", str(E2E / "cluster.sh"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if out.returncode:
            raise RuntimeError(f"e2e/cluster.sh {' '.join(args)} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def start(self, kuberay: bool = True) -> None:
        self.script("start")
        # The environment `eval "$(e2e/cluster.sh env)"` gives a shell: KUBECONFIG, PATH, RLJOB_E2E_*.
        shell = f'eval "$(bash {E2E / "cluster.sh"} env)" && env -0'
        out = subprocess.run(["bash", "-c", shell], env=self.env, capture_output=True, check=True)
        self.env = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
        if kuberay:
            self.script("kuberay")

    def start_node(self) -> float:
        """Join the real node (e2e/node.sh start); returns the seconds until it was Ready."""
        t0 = time.monotonic()
        self.script("node")
        return time.monotonic() - t0

    @property
    def kubectl_binary(self) -> str:
        """The kubectl built for the control plane, for the calls a test leaves running (watches, waits)."""
        return str(Path(self.env["RLJOB_E2E_BIN"]) / "kubectl")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [self.kubectl_binary, *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and out.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr}")
        return out

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--show-managed-fields", check=False)
        if out.returncode:
            if "NotFound" in out.stderr:
                return None
            raise AssertionError(out.stderr)
        return dict(json.loads(out.stdout))

    def objects(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "json", "--show-managed-fields"]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args).stdout)["items"])

    def apply(self, doc: dict[str, Any], *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.kubectl("apply", "--server-side", "-f", "-", *extra, input=json.dumps(doc), check=check)

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [
            e
            for e in self.objects("events", namespace)
            if e["involvedObject"].get("kind") == "RLJob" and e["involvedObject"].get("name") == name
        ]

    def install_chart_rbac(self, namespace: str, release: str = "rljob") -> Path:
        """The chart's ServiceAccount and cluster-wide RBAC, and a kubeconfig that authenticates as that
        ServiceAccount: the operator then runs with exactly the chart's permissions."""
        helm = Path(self.env["RLJOB_E2E_BIN"]) / "helm"
        rendered = subprocess.run(
            [str(helm), "template", release, str(CHART), "--namespace", namespace, "--show-only",
             "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"],
            env=self.env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        self.kubectl("create", "namespace", namespace)
        self.kubectl("apply", "--server-side", "-f", "-", input=rendered)
        account = f"{release}-rljob-operator"
        token = self.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
        admin = yaml.safe_load(Path(self.env["KUBECONFIG"]).read_text())
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": admin["clusters"][0]["name"], "user": account}}],
            "current-context": account,
        }
        path = self.state / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def audit(self) -> list[dict[str, Any]]:
        """The API server's audit events so far (e2e/cluster.sh logs the rljob-system accounts' requests),
        the rotated file's first (--audit-log-maxbackup keeps one: audit-<time>.log)."""
        events = []
        for path in [*sorted(self.state.glob("audit-*.log")), self.state / "audit.log"]:
            if path.exists():
                *complete, _ = path.read_text().split("\n")  # the API server may be writing the last line
                events += [json.loads(line) for line in complete if line.strip()]
        return events

    def audit_files(self) -> str:
        """The audit log's files, sizes and first events, the API server's start and what its log says of the
        audit: for a failure's message (CI once found the operator's first two minutes missing from it)."""
        files = []
        for p in sorted(self.state.glob("audit*.log")):
            first = p.read_text().split("\n", 1)[0]
            when = json.loads(first).get("requestReceivedTimestamp") if first.strip() else None
            files.append(f"{p.name} {p.stat().st_size} B from {when}")
        pid_file = self.state / "pids" / "kube-apiserver.pid"
        try:
            started = time.ctime(psutil.Process(int(pid_file.read_text())).create_time())
        except (OSError, ValueError, psutil.Error) as exc:
            started = f"? ({exc})"
        log = self.state / "logs" / "kube-apiserver.log"
        said = [line[:300] for line in log.read_text().splitlines() if "audit" in line.lower()] if log.exists() else []
        return f"{', '.join(files)}; the API server up since {started}; its log on the audit: {said[-5:]}"

    def kubelet(self, namespace: str, selector: str, phase: str) -> int:
        """Report the selected pods as a kubelet would: Running and Ready, or Succeeded/Failed."""
        pods = self.objects("pods", namespace, selector)
        for pod in pods:
            ready = "True" if phase == "Running" else "False"
            status: dict[str, Any] = {
                "phase": phase,
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": ready},
                    {"type": "ContainersReady", "status": ready},
                ],
            }
            if phase != "Running":
                status["containerStatuses"] = [
                    {
                        "name": c["name"],
                        "image": c["image"],
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0 if phase == "Succeeded" else 1, "reason": phase}},
                    }
                    for c in pod["spec"]["containers"]
                ]
            self.kubectl(
                "patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": status}),
            )  # fmt: skip
        return len(pods)


class OperatorProcess:
    """`python -m rljob_operator` as a subprocess against the e2e cluster."""

    def __init__(self, cluster: Cluster, control_port: int, log: Path, kubeconfig: Path | None = None) -> None:
        self.cluster = cluster
        self.env = {**cluster.env, "KUBECONFIG": str(kubeconfig or cluster.env["KUBECONFIG"])}
        self.metrics_port = free_port()
        self.args = [
            sys.executable,
            "-m",
            "rljob_operator",
            "--interval=1",
            f"--metrics-port={self.metrics_port}",
            "--metrics-host=127.0.0.1",
            f"--control-address=127.0.0.1:{control_port}",
            "--control-timeout=0.5",
            f"--system-node-selector={json.dumps(SYSTEM_POOL)}",
        ]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def metrics_up(self) -> bool:
        try:
            self.metrics()
            return True
        except OSError:
            return False


def start_operator(cluster: Cluster, control_port: int, log: Path) -> OperatorProcess:
    """The operator as the Helm chart's ServiceAccount (so its RBAC is tested too), serving metrics."""
    print(f"operator log: {log}")
    op = OperatorProcess(cluster, control_port, log, kubeconfig=cluster.install_chart_rbac("rljob-system"))
    op.start()
    wait_for("operator metrics", op.metrics_up, timeout=60)
    return op


def install_crd(cluster: Cluster, path: str) -> str:
    """Apply a CRD file and wait until the API server serves it; the API server's refusal fails the test."""
    out = cluster.kubectl("apply", "--server-side", "-f", path, check=False)
    assert out.returncode == 0, f"the API server refused {path}:\n{out.stderr}"
    wait_for(  # `kubectl wait` fails at once while the CRD has no conditions yet
        "CRD established",
        lambda: (
            cluster.kubectl("wait", "--for=condition=Established", "crd/rljobs.rljob.io", check=False).returncode == 0
        ),
    )
    return path


@contextmanager
def fresh_namespace(cluster: Cluster, test_name: str, prefix: str) -> Iterator[str]:
    """A fresh namespace named after the test, deleted (without waiting) afterwards."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.removeprefix("test_").lower())[:40].strip("-")
    name = f"{prefix}-{slug}-{uuid.uuid4().hex[:4]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def real_node_missing() -> list[str]:
    """What this machine lacks to run the real node (`e2e/node.sh check`: root, containerd, runc,
    the CNI plugins, overlayfs, cgroups, the built kubelet/kube-proxy/CoreDNS), one item a line."""
    out = subprocess.run(["bash", str(E2E / "node.sh"), "check"], capture_output=True, text=True)
    if out.returncode == 0:
        return []
    return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()] or ["e2e/node.sh check failed"]


def skip_without_binaries() -> pytest.MarkDecorator:
    """Skip a module, naming what is missing, when the e2e binaries are not built."""
    missing = missing_binaries()
    return pytest.mark.skipif(
        bool(missing), reason=f"e2e binaries not built (run e2e/build.sh): missing {', '.join(missing)}"
    )


class FakeControl(control_grpc.ControlServiceServicer):
    """Answers GetJobStatus with `status`, or UNAVAILABLE while it is None (no controller up), after
    `delay` seconds (a busy controller: each poll is in flight that long)."""

    def __init__(self) -> None:
        self.status: control_pb.JobStatus | None = None
        self.delay = 0.0
        self.tokens: set[str] = set()  # the bearer tokens callers sent

    def GetJobStatus(self, request: Any, context: grpc.ServicerContext) -> control_pb.GetJobStatusResponse:
        self.tokens |= {str(v) for k, v in context.invocation_metadata() if k == "authorization"}
        time.sleep(self.delay)
        if self.status is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "controller not running")
        return control_pb.GetJobStatusResponse(status=self.status)


@contextmanager
def fake_control() -> Iterator[tuple[FakeControl, int]]:
    servicer = FakeControl()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_grpc.add_ControlServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(grace=None)
