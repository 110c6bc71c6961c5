"""The operator's settings, typed: what its flags (process/flags.py) and the chart's values set. Pure values."""

from __future__ import annotations

from dataclasses import dataclass, field

from rljob_operator.options import RenderOptions

# {service}: the job's control Service, {namespace}, {job}, {port}: where the controller's ControlService is.
DEFAULT_CONTROL_ADDRESS = "{service}.{namespace}.svc:{port}"


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()
    metrics_port: int = 8080
    metrics_host: str = "0.0.0.0"
    liveness: str | None = None
    interval_seconds: float = 5.0
    control_address: str = DEFAULT_CONTROL_ADDRESS
    control_timeout_seconds: float = 1.0
    concurrency: int = 16
    render: RenderOptions = field(default_factory=RenderOptions)

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces
