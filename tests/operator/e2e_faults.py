"""Faults on the real node (test_e2e_real.py): delete a pool pod, the operator pod or the driver pod of
a running RLJob, then measure when the job noticed and when it was training again."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from e2e_cluster import Cluster, wait_for

OPERATOR_NS, OPERATOR_SELECTOR = "rljob-system", "app.kubernetes.io/name=rljob-operator"
RECOVERED_STEPS = 5  # trained after the fault, with its pool (or driver) back: recovered


@dataclass
class Fault:
    target: str  # a pool, "operator" or "driver"
    at_step: int
    step: int = 0  # when the pod was deleted
    detect: float = float("nan")  # seconds until the job showed it (a pool short, a new driver pod)
    recover: float = float("nan")  # seconds until it trained RECOVERED_STEPS more steps, whole again


class FaultRun:
    """One running RLJob and the faults done to it."""

    def __init__(self, cluster: Cluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name

    def status(self) -> dict[str, Any]:
        return dict((self.cluster.get("rlj", self.name, self.namespace) or {}).get("status") or {})

    def step(self) -> int:
        return int(self.status().get("step") or 0)

    def whole(self, status: dict[str, Any] | None = None) -> bool:
        pools = (status if status is not None else self.status()).get("pools") or {}
        return bool(pools) and all(p.get("ready", 0) >= p.get("desired", 1) for p in pools.values())

    def _recovered(self, step: int) -> bool:
        """Training at `step` or past it with every pool whole, or ended (which the caller asserts against)."""
        status = self.status()
        if status.get("phase") in ("Succeeded", "Failed"):
            return True
        return status.get("phase") == "Running" and int(status.get("step") or 0) >= step and self.whole(status)

    def pods(self, selector: str, namespace: str | None = None) -> list[str]:
        out = self.cluster.kubectl("get", "pods", "-n", namespace or self.namespace, "-l", selector, "-o", "name")
        return out.stdout.split()

    def selector(self, target: str) -> tuple[str, str]:
        """(namespace, label selector) of the pod a fault deletes."""
        if target == "operator":
            return OPERATOR_NS, OPERATOR_SELECTOR
        if target == "driver":
            return self.namespace, f"rljob.io/job={self.name},rljob.io/component=driver"
        return self.namespace, f"rljob.io/job={self.name},rljob.io/pool={target}"

    def inject(self, fault: Fault, timeout: float = 300) -> Fault:
        """Wait for the fault's step, delete its pod, and time detection and recovery."""
        wait_for(f"step {fault.at_step}", lambda: self.step() >= fault.at_step, timeout=timeout, every=0.5)
        namespace, selector = self.selector(fault.target)
        before = set(self.pods(selector, namespace))
        fault.step, started = self.step(), time.monotonic()
        self.cluster.kubectl("delete", "pod", "-n", namespace, "-l", selector, "--wait=false")
        if fault.target in ("operator", "driver"):  # noticed when its replacement pod exists
            wait_for(f"a new {fault.target} pod", lambda: set(self.pods(selector, namespace)) - before, timeout=120)
        else:  # noticed when the job's status shows the pool short
            wait_for(f"{fault.target} short", lambda: not self.whole(), timeout=120, every=0.2)
        fault.detect = time.monotonic() - started
        trained_from = fault.step
        if fault.target == "driver":
            # A deleted driver trains on through its graceful stop: steps the new driver must go past
            wait_for("the deleted driver gone", lambda: not set(self.pods(selector, namespace)) & before, timeout=120)
            trained_from = max(fault.step, self.step())
        wait_for(
            f"{RECOVERED_STEPS} steps after the {fault.target} fault",
            lambda: self._recovered(trained_from + RECOVERED_STEPS),
            timeout=timeout,
            every=0.5,
        )
        fault.recover = time.monotonic() - started
        assert self.status().get("phase") == "Running", f"the run ended before the {fault.target} fault recovered"
        return fault


def fault_table(faults: list[Fault], lost: int, twice: int, scored_twice: int, outcome: str) -> str:
    rows = [
        "| fault | step | time to detect | time to recover | prompts lost | trained twice | scored twice | outcome |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in faults:
        rows.append(
            f"| {f.target} pod deleted | {f.step} | {f.detect:.1f} s | {f.recover:.1f} s | {lost} | {twice} "
            f"| {scored_twice} | {outcome} |"
        )
    return "\n".join(rows)


def each_restart_told_once(cluster: Cluster, ns: str, job: str, status: dict[str, Any]) -> None:
    """status.restarts counts each replacement once (the operator was replaced meanwhile, and the driver),
    and `kubectl describe rlj` shows an Event for each."""
    restarts = status.get("restarts") or {}
    counts = {pool: restarts.get(pool) for pool in ("rollout", "reward", "trainer", "driver")}
    assert counts == {"rollout": 1, "reward": 1, "trainer": 1, "driver": 1}, restarts
    reasons = ("ReplicaReplaced", "TrainerRestarted", "DriverRestarted")
    told = [e for e in cluster.events(ns, job) if e["reason"] in reasons]
    counts = {reason: [e["reason"] for e in told].count(reason) for reason in reasons}
    assert counts == {"ReplicaReplaced": 2, "TrainerRestarted": 1, "DriverRestarted": 1}, [e["message"] for e in told]
    described = cluster.kubectl("describe", "rlj", job, "-n", ns).stdout
    for what in ("rollout replica", "reward replica", "trainer group lost", "driver pod 1 failed"):
        assert what in described, described[-3000:]
    print("events:\n" + "\n".join(f"  {e['reason']}: {e['message']}" for e in told))


def child_generations(cluster: Cluster, ns: str, job: str) -> dict[str, Any]:
    """The generation of each child the operator writes (a rewrite of its spec would bump it)."""
    found: dict[str, tuple[Any, ...]] = {}
    for kind, name in (("raycluster", f"{job}-ray"), ("job", f"{job}-driver"),
                       ("networkpolicy", f"{job}-pods"), ("configmap", f"{job}-config")):  # fmt: skip
        obj = cluster.get(kind, name, ns) or {}
        found[kind] = (obj.get("metadata") or {}).get("generation"), (obj.get("metadata") or {}).get("resourceVersion")
    found["raycluster"] = found["raycluster"][:1]  # KubeRay writes its status (a new resourceVersion)
    found["job"] = found["job"][:1]  # so does the Job controller
    return found
