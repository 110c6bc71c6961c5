#!/usr/bin/env python3
"""Fake GPU nodes for the e2e cluster, managed by kwok.

A small spec names node pools; each pool becomes `count` Node objects annotated
`kwok.x-k8s.io/node: fake`, which the cluster's kwok (see cluster.sh) makes Ready and
whose pods it marks Running. No kubelet, no containers.

    python3 e2e/nodes.py apply e2e/pools.example.yaml     # create or update the nodes
    python3 e2e/nodes.py render e2e/pools.example.yaml    # print the Node YAML only
    python3 e2e/nodes.py delete e2e/pools.example.yaml    # delete the pools' nodes
    python3 e2e/nodes.py apply --pool rollout:2:8 --pool reward:1:0   # inline: name:count:gpus

Spec (YAML or JSON):

    pools:
      - name: rollout              # node names are <name>-0, <name>-1, ...
        count: 2
        gpus: 8                    # nvidia.com/gpu capacity; 0 = a CPU pool
        cpu: "96"
        memory: 1Ti
        pods: 110
        labels: {nvidia.com/gpu.product: H100}
        taints:
          - {key: nvidia.com/gpu, value: present, effect: NoSchedule}

Every node also gets the label `rljob.io/e2e-pool: <name>`. kubectl comes from
--kubectl, $RLJOB_E2E_BIN/kubectl, or PATH; the cluster from --kubeconfig or $KUBECONFIG.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

POOL_LABEL = "rljob.io/e2e-pool"
GPU_RESOURCE = "nvidia.com/gpu"
FIELD_MANAGER = "rljob-e2e-nodes"
TAINT_EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}


@dataclass
class Pool:
    """One pool of identical fake nodes."""

    name: str
    count: int = 1
    gpus: int = 0
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Pool:
        known = {"name", "count", "gpus", "cpu", "memory", "pods", "labels", "taints"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"pool {d.get('name')!r}: unknown keys {sorted(unknown)}")
        if not d.get("name"):
            raise ValueError("every pool needs a name")
        pool = cls(
            name=str(d["name"]),
            count=int(d.get("count", 1)),
            gpus=int(d.get("gpus", 0)),
            cpu=str(d.get("cpu", "32")),
            memory=str(d.get("memory", "256Gi")),
            pods=int(d.get("pods", 110)),
            labels={str(k): str(v) for k, v in (d.get("labels") or {}).items()},
            taints=[{str(k): str(v) for k, v in t.items()} for t in d.get("taints") or []],
        )
        if pool.count < 0 or pool.gpus < 0:
            raise ValueError(f"pool {pool.name!r}: count and gpus must be >= 0")
        for t in pool.taints:
            if "key" not in t or t.get("effect") not in TAINT_EFFECTS:
                raise ValueError(f"pool {pool.name!r}: taint {t} needs a key and an effect")
        return pool

    @classmethod
    def parse_inline(cls, text: str) -> Pool:
        """`name:count:gpus`, count and gpus optional."""
        parts = text.split(":")
        d: dict[str, Any] = {"name": parts[0]}
        if len(parts) > 1:
            d["count"] = parts[1]
        if len(parts) > 2:
            d["gpus"] = parts[2]
        return cls.from_dict(d)

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]

    def resources(self) -> dict[str, str]:
        r = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        if self.gpus:
            r[GPU_RESOURCE] = str(self.gpus)
        return r

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for name in self.node_names():
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                POOL_LABEL: self.name,
                **self.labels,
            }
            node: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                },
                "spec": {"taints": self.taints} if self.taints else {},
                "status": {"capacity": self.resources(), "allocatable": self.resources()},
            }
            out.append(node)
        return out


def load_pools(spec: str | None, inline: list[str]) -> list[Pool]:
    pools = [Pool.parse_inline(p) for p in inline]
    if spec:
        if spec == "-":
            text = sys.stdin.read()
        else:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        data = yaml.safe_load(text) or {}
        items = data.get("pools", []) if isinstance(data, dict) else data
        pools += [Pool.from_dict(d) for d in items]
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique: {names}")
    if not pools:
        raise ValueError("no pools: give a spec file or --pool name:count:gpus")
    return pools


class Kubectl:
    def __init__(self, kubectl: str | None, kubeconfig: str | None) -> None:
        binary = kubectl
        if not binary and os.environ.get("RLJOB_E2E_BIN"):
            binary = os.path.join(os.environ["RLJOB_E2E_BIN"], "kubectl")
        binary = binary or shutil.which("kubectl")
        if not binary or not os.path.exists(binary):
            raise SystemExit("kubectl not found: pass --kubectl or eval $(e2e/cluster.sh env)")
        self.base = [binary] + (["--kubeconfig", kubeconfig] if kubeconfig else [])

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        proc = subprocess.run([*self.base, *args], input=stdin, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout


def render(pools: list[Pool]) -> str:
    return yaml.safe_dump_all([n for p in pools for n in p.nodes()], sort_keys=False)


def apply(k: Kubectl, pools: list[Pool], wait_s: float) -> None:
    nodes = [n for p in pools for n in p.nodes()]
    # Status is kept on create; on update only the status subresource changes it, so
    # patch it too: capacity then follows the spec when a pool is re-applied.
    k(
        "apply",
        "--server-side",
        f"--field-manager={FIELD_MANAGER}",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(nodes),
    )
    for n in nodes:
        patch = json.dumps({"status": n["status"]})
        k("patch", "node", n["metadata"]["name"], "--subresource=status", "--type=merge", "-p", patch)
    # Nodes that a pool no longer counts (count went down) are removed.
    for p in pools:
        want = set(p.node_names())
        have = k("get", "nodes", "-l", f"{POOL_LABEL}={p.name}", "-o", "name").split()
        extra = [h.split("/", 1)[1] for h in have if h.split("/", 1)[1] not in want]
        if extra:
            k("delete", "node", *extra)
    if wait_s > 0 and nodes:
        names = [n["metadata"]["name"] for n in nodes]
        deadline = time.monotonic() + wait_s
        while True:
            ready = _ready_nodes(k, names)
            if ready == set(names):
                break
            if time.monotonic() > deadline:
                missing = sorted(set(names) - ready)
                raise SystemExit(f"nodes not Ready after {wait_s}s: {missing} (is kwok running?)")
            time.sleep(0.5)
    for p in pools:
        print(f"pool {p.name}: {p.count} node(s), {p.gpus} GPU each, ready")


def _ready_nodes(k: Kubectl, names: list[str]) -> set[str]:
    out = json.loads(k("get", "nodes", *names, "-o", "json", "--ignore-not-found"))
    ready = set()
    for item in out.get("items", []):
        for c in item.get("status", {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") == "True":
                ready.add(item["metadata"]["name"])
    return ready


def delete(k: Kubectl, pools: list[Pool]) -> None:
    for p in pools:
        k("delete", "nodes", "-l", f"{POOL_LABEL}={p.name}", "--ignore-not-found", "--wait=false")
        print(f"pool {p.name}: deleted")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("command", choices=["apply", "render", "delete"])
    ap.add_argument("spec", nargs="?", help="pool spec file (YAML/JSON), '-' for stdin")
    ap.add_argument("--pool", action="append", default=[], help="inline pool name:count:gpus")
    ap.add_argument("--kubectl", help="kubectl binary")
    ap.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG)")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for Ready (0: no)")
    args = ap.parse_args(argv)
    try:
        pools = load_pools(args.spec, args.pool)
    except (ValueError, OSError, yaml.YAMLError) as e:
        print(f"nodes.py: {e}", file=sys.stderr)
        return 2
    if args.command == "render":
        sys.stdout.write(render(pools))
        return 0
    k = Kubectl(args.kubectl, args.kubeconfig)
    if args.command == "apply":
        apply(k, pools, args.wait)
    else:
        delete(k, pools)
    return 0


if __name__ == "__main__":
    sys.exit(main())
