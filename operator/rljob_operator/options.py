"""What rendering needs besides the RLJob: operator-wide defaults and the owner, passed in, never read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rljob_api import API_VERSION, KIND
from rljob_api.workercfg import Pool

# The Ray version of the worker image (pinned in constraints.txt); KubeRay reads it for feature gates.
DEFAULT_RAY_VERSION = "2.60.0"


@dataclass(frozen=True)
class RenderOptions:
    """Operator-wide defaults of the children (set from the operator's flags or the chart's values)."""

    ray_version: str = DEFAULT_RAY_VERSION
    head_cpu: str = "1"
    head_memory: str = "4Gi"
    driver_cpu: str = "1"
    driver_memory: str = "4Gi"
    driver_backoff_limit: int = 3
    # Where the head and driver (no GPUs) run: e.g. a CPU node pool.
    system_node_selector: Mapping[str, str] = field(default_factory=dict)
    system_tolerations: Sequence[Mapping[str, Any]] = ()
    # A NetworkPolicy per job: ingress to its pods from its own pods, from `operator_peers` to the control
    # port and from `scraper_peers` to the metrics port (NetworkPolicy peers, as the chart names them).
    network_policy: bool = True
    operator_peers: Sequence[Mapping[str, Any]] = ()
    scraper_peers: Sequence[Mapping[str, Any]] = ()
    # Egress rules besides the job's own pods; None leaves egress open.
    egress: Sequence[Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Owner:
    """The RLJob that owns every child; garbage collection deletes the children with it."""

    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class ElasticGroup:
    """An elastic worker group's size as the scaling policy last set it (None: the spec's min), and the
    drained pods KubeRay is to delete."""

    replicas: int | None = None
    workers_to_delete: tuple[str, ...] = ()


@dataclass(frozen=True)
class ElasticGroups:
    """The reward and environment groups as last decided (see render/group_sizing.py)."""

    reward: ElasticGroup = field(default_factory=ElasticGroup)
    environment: ElasticGroup = field(default_factory=ElasticGroup)

    def of(self, pool: Pool) -> ElasticGroup:
        return self.environment if pool == "environment" else self.reward

    def with_group(self, pool: Pool, group: ElasticGroup) -> ElasticGroups:
        return replace(self, **{pool: group})
