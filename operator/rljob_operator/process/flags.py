"""The operator's command-line flags, each defaulting to an RLJOB_OPERATOR_* environment variable, read into
its settings (config.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rljob_operator.config import DEFAULT_CONTROL_ADDRESS, OperatorConfig
from rljob_operator.options import DEFAULT_RAY_VERSION, RenderOptions


def _json(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = json.loads(text) if text else kind()
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value

    return parse


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rljob_operator",
        description="The RLJob operator (kopf). Every flag defaults to the environment variable shown.",
    )

    def add(flag: str, default: Any, help: str, **kwargs: Any) -> None:
        var = "RLJOB_OPERATOR_" + flag.lstrip("-").upper().replace("-", "_")
        kwargs.setdefault("type", type(default) if default is not None else str)
        parser.add_argument(flag, default=env.get(var, default), help=f"{help} (${var})", **kwargs)

    add("--namespaces", "", "comma-separated namespaces to watch; empty watches the whole cluster")
    add("--metrics-port", 8080, "port of the Prometheus /metrics endpoint; 0 disables it")
    add("--metrics-host", "0.0.0.0", "address the metrics endpoint listens on")
    add("--liveness", "", "kopf liveness endpoint, e.g. http://0.0.0.0:8081/healthz; empty disables it")
    add("--interval", 5.0, "seconds between two status polls of every RLJob")
    add("--control-address", DEFAULT_CONTROL_ADDRESS, "address of a job's ControlService ({service} {namespace} ...)")
    add("--control-timeout", 1.0, "deadline of one ControlService call, in seconds")
    add("--concurrency", 16, "RLJobs polled at once; also the Kubernetes client's thread pool")
    add("--ray-version", DEFAULT_RAY_VERSION, "rayVersion of the RayClusters (the worker image's Ray)")
    add("--head-cpu", "1", "CPU request of the Ray head")
    add("--head-memory", "4Gi", "memory of the Ray head")
    add("--driver-cpu", "1", "CPU request of the driver")
    add("--driver-memory", "4Gi", "memory of the driver")
    add("--driver-backoff-limit", 3, "driver retries (each resumes from the newest checkpoint) before the job fails")
    add("--system-node-selector", "", "JSON nodeSelector of the head and driver pods", type=_json(dict))
    add("--system-tolerations", "", "JSON list of tolerations of the head and driver pods", type=_json(list))
    add("--network-policy", "true", "render a NetworkPolicy per job (true/false)")
    add("--operator-peers", "", "JSON list of NetworkPolicy peers that are this operator", type=_json(list))
    add("--scraper-peers", "", "JSON list of NetworkPolicy peers that may scrape the jobs' metrics", type=_json(list))
    add("--egress", "", "JSON list of egress rules of the jobs' pods besides their own; empty: open", type=_egress)
    return parser


def _egress(text: str) -> list[Any] | None:
    return None if not text.strip() else _json(list)(text)


def _flag(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> OperatorConfig:
    """Flags over environment over defaults; no other global is read."""
    args = build_parser(env).parse_args(list(argv))
    # argparse applies `type` to string defaults (from the environment) too.
    return OperatorConfig(
        namespaces=tuple(n.strip() for n in str(args.namespaces).split(",") if n.strip()),
        metrics_port=int(args.metrics_port),
        metrics_host=str(args.metrics_host),
        liveness=str(args.liveness) or None,
        interval_seconds=float(args.interval),
        control_address=str(args.control_address),
        control_timeout_seconds=float(args.control_timeout),
        concurrency=max(1, int(args.concurrency)),
        render=RenderOptions(
            ray_version=str(args.ray_version),
            head_cpu=str(args.head_cpu),
            head_memory=str(args.head_memory),
            driver_cpu=str(args.driver_cpu),
            driver_memory=str(args.driver_memory),
            driver_backoff_limit=int(args.driver_backoff_limit),
            system_node_selector=dict(args.system_node_selector or {}),
            system_tolerations=tuple(args.system_tolerations or ()),
            network_policy=_flag(str(args.network_policy)),
            operator_peers=tuple(args.operator_peers or ()),
            scraper_peers=tuple(args.scraper_peers or ()),
            egress=None if args.egress is None else tuple(args.egress),
        ),
    )
