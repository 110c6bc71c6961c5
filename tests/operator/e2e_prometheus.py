"""Prometheus on the e2e cluster, scraping what the chart says to scrape, for the dashboard test.

Prometheus (built from its Go module by e2e/build.sh) runs on the host, where the real node's bridge
routes to every pod. It finds its targets with Kubernetes service discovery through the cluster's
kubeconfig, configured from the chart's own ServiceMonitors the way the Prometheus Operator turns a
ServiceMonitor into a scrape job: keep the endpoints of Services whose labels match, on the named port;
label each series with namespace, service, pod, job (the Service) and endpoint; honour the exported
labels where the ServiceMonitor says so. Then every query of the shipped Grafana dashboard runs through
Prometheus's HTTP API over each run's time, with the dashboard's variables set to that run's RLJob.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e_cluster import CHART, Cluster, free_port, wait_for

SCRAPE_INTERVAL = "2s"
# The series only a job with environments exports (driver/telemetry/episode_metrics.py; the prefix cache only
# where the engine reports it)
EPISODE_SERIES = ("rljob_episode", "rljob_environment_", "rljob_tool_calls", "rljob_prefix_cache")
DASHBOARD = CHART / "files" / "rljob-dashboard.json"


@dataclass(frozen=True)
class Window:
    """One RLJob's run: the dashboard's $namespace and $rljob, and the time it ran (unix seconds)."""

    namespace: str
    rljob: str
    start: float
    end: float
    evaluates: bool = True  # the job has spec.data.eval: its held-out eval panels show data
    plays_episodes: bool = False  # the job has spec.environment: its episode panels show data


def service_monitors(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """The chart's ServiceMonitors as `helm template` renders them with the ServiceMonitor switched on."""
    out = subprocess.run(
        [str(Path(cluster.env["RLJOB_E2E_BIN"]) / "helm"), "template", "rljob", str(CHART),
         "--namespace", namespace, "--show-only", "templates/servicemonitor.yaml",
         "--set", "metrics.serviceMonitor.enabled=true",
         "--set", f"metrics.serviceMonitor.interval={SCRAPE_INTERVAL}"],
        env=cluster.env, check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc and doc.get("kind") == "ServiceMonitor"]


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus's service discovery spells it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_configs(monitors: list[dict[str, Any]], kubeconfig: str) -> list[dict[str, Any]]:
    """One scrape job per ServiceMonitor endpoint, as the Prometheus Operator would generate it."""
    jobs = []
    for monitor in monitors:
        meta, spec = monitor["metadata"], monitor["spec"]
        discovery: dict[str, Any] = {"role": "endpointslice", "kubeconfig_file": kubeconfig}
        selector = spec.get("namespaceSelector") or {}
        if not selector.get("any"):
            discovery["namespaces"] = {"names": selector.get("matchNames") or [meta["namespace"]]}
        keep = [
            {
                "action": "keep",
                "source_labels": [f"__meta_kubernetes_service_label_{_label(k)}",
                                  f"__meta_kubernetes_service_labelpresent_{_label(k)}"],
                "regex": f"({re.escape(v)});true",
            }
            for k, v in spec["selector"]["matchLabels"].items()
        ]  # fmt: skip
        for index, endpoint in enumerate(spec["endpoints"]):
            port = endpoint["port"]
            relabel = [
                *keep,
                {"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": port},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
                {"target_label": "endpoint", "replacement": port},
            ]
            jobs.append({
                "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "scrape_interval": endpoint.get("interval", "30s"),
                "metrics_path": endpoint.get("path", "/metrics"),
                "kubernetes_sd_configs": [discovery],
                "relabel_configs": relabel,
            })  # fmt: skip
    return jobs


class Prometheus:
    """A Prometheus server on 127.0.0.1 with the given scrape jobs, its data in `folder`."""

    def __init__(self, binary: Path, folder: Path, jobs: list[dict[str, Any]]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": SCRAPE_INTERVAL}, "scrape_configs": jobs}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "prometheus.log"
        self.process = subprocess.Popen(
            [str(binary), f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"),
        )  # fmt: skip
        wait_for("Prometheus ready", self._ready, timeout=60)

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def api(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as reply:
                body = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Prometheus {path} {params}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {body}")
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        """The active targets: scrape job, labels, health and last error of each."""
        return list(self.api("targets", state="active")["activeTargets"])

    def series_over(self, query: str, window: Window) -> list[dict[str, Any]]:
        """The series `query` returns at any point of the window, a step of the scrape interval."""
        data = self.api("query_range", query=query, start=window.start, end=window.end, step=SCRAPE_INTERVAL)
        return list(data["result"])

    def label_values(self, label: str, match: str, window: Window) -> list[str]:
        """What a dashboard variable `label_values(match, label)` offers over the window."""
        return list(self.api(f"label/{label}/values", **{"match[]": match, "start": window.start, "end": window.end}))

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel, rows included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels") or [])
            found.extend((panel.get("title", "?"), t["expr"]) for t in panel.get("targets") or [] if t.get("expr"))

    walk(board.get("panels") or [])
    return found


def variable_queries(board: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each query variable's `label_values(match, label)` as {variable: (match, label)}."""
    found = {}
    for variable in (board.get("templating") or {}).get("list") or []:
        query = variable.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        parsed = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", text.strip())
        if variable.get("type") == "query" and parsed:
            found[variable["name"]] = (parsed.group(1), parsed.group(2))
    return found


def with_variables(text: str, window: Window) -> str:
    """`text` with Grafana's $namespace and $rljob set to the window's, as regex literals in PromQL strings."""

    def literal(value: str) -> str:
        return re.escape(value).replace(
            "\\", "\\\\"
        )  # PromQL strings take `\\-` for regex `\-`; a bare `\-` is an error

    return text.replace("$namespace", literal(window.namespace)).replace("$rljob", literal(window.rljob))


def empty_panels(prometheus: Prometheus, window: Window) -> list[str]:
    """The dashboard's variables and panel queries that show nothing for the window's RLJob."""
    board, empty = dashboard(), []
    for name, (match, label) in variable_queries(board).items():
        wanted = getattr(window, name)
        offered = prometheus.label_values(label, with_variables(match, window), window)
        if wanted not in offered:
            empty.append(f"${name} offers {offered}, not {wanted!r}: label_values({match}, {label})")
    for title, expr in panel_queries(board):
        if "rljob_eval_" in expr and not window.evaluates:
            continue  # no eval rounds, nothing to show
        if any(series in expr for series in EPISODE_SERIES) and not window.plays_episodes:
            continue  # one completion per prompt, no episodes to show
        if not prometheus.series_over(with_variables(expr, window), window):
            empty.append(f"{title}: {expr}")
    return empty
