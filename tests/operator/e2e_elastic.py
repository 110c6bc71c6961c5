"""The elastic reward pool on the real node (test_e2e_real.py): a judge that slows down for a stretch of the
run, the same job with an elastic reward group and with a fixed one at its maximum, and what the reward
pods cost each (pod-seconds of Running reward pods, sampled once a second)."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from e2e_cluster import Cluster
from e2e_real import cluster_job

from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

DATA = "data/judged.jsonl"  # under the assets volume
PER_STEP = 16  # promptsPerStep
# The judge's time per sample outside and inside the slow stretch. Outside it the load (arrival rate x
# latency) must fit one replica (9.6 slots at 12 per replica, DOWN_HEADROOM 0.8) with room: at ~1,500
# samples/s a 10 ms judge's 18 ms round trip made 27 slots, and the pool stayed at 2 or more; at 1 ms the
# down decision read 1,405/s x 4.6 ms = 6.4 slots.
FAST_SECONDS, SLOW_SECONDS = 0.001, 0.6
IN_FLIGHT = 16  # maxInFlightPerReplica
JUDGE = "rljob_workers.tasks.arithmetic:judged_match"


@dataclass(frozen=True)
class Stretch:
    """Steps [start, end) of the run whose prompts the judge takes SLOW_SECONDS over."""

    start: int
    end: int


def write_judged_data(assets: Path, steps: int, slow: Stretch) -> None:
    """The arithmetic prompts in order, each with the judge's seconds for it (the prompts of the slow stretch's
    steps slow; the job reads them unshuffled, PER_STEP a step)."""
    rows = []
    for i, row in enumerate(make_problems(steps * PER_STEP + 4 * PER_STEP, seed=20_000)):
        slow_prompt = slow.start * PER_STEP <= i < slow.end * PER_STEP
        rows.append({**row, "judge_seconds": str(SLOW_SECONDS if slow_prompt else FAST_SECONDS)})
    path = write_jsonl(assets / DATA, rows)
    path.chmod(0o644)


def judged_job(namespace: str, image: str, name: str, steps: int, replicas: tuple[int, int]) -> dict[str, Any]:
    """The cluster example as `name` on the judged data, its reward pool `replicas` (min, max) replicas."""
    doc = cluster_job(namespace, image)
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec["data"].update(path=f"/mnt/rljob/{DATA}", fields=["answer", "judge_seconds"], shuffle=False)
    # No eval rounds: the example's held-out split has no judge_seconds (the driver refuses it, naming the line),
    # and a round's samples would reach the judge beside the backlog this job measures.
    spec["data"].pop("eval", None)
    spec["algorithm"].update(totalSteps=steps, promptsPerStep=PER_STEP)
    spec["checkpoint"].update(dir=f"/mnt/runs/{name}/checkpoints", everySteps=steps)
    spec["reward"].update(
        functions=[{"name": "judge", "kind": "rule", "rule": {"function": JUDGE}}],
        replicas={"min": replicas[0], "max": replicas[1]},
        maxInFlightPerReplica=IN_FLIGHT,
        # Pods take seconds to start: add as many as the load asks for at once; shed them once the load has
        # been low for a whole window (longer than the dip between two steps), all at once.
        scaling={"targetBacklogPerReplica": IN_FLIGHT * 0.75, "intervalSeconds": 1, "cooldownSeconds": 5,
                 "scaleDownWindowSeconds": 5, "maxStepUp": replicas[1], "maxStepDown": replicas[1]},
    )  # fmt: skip
    return doc


@dataclass
class Sample:
    at: float  # seconds since the watch started
    running: tuple[str, ...]  # the pool's pods Running and not being deleted
    desired: int | None  # status.pools.<pool>.desired
    step: int


@dataclass
class PoolWatch:
    """Samples a job's pods of one pool (reward, environment) and its status once a second, in a thread, until
    stopped."""

    cluster: Cluster
    namespace: str
    job: str
    pool: str = "reward"
    samples: list[Sample] = field(default_factory=list)
    pods_seen: set[str] = field(default_factory=set)
    starts: dict[str, dict[str, str]] = field(default_factory=dict)  # pod -> milestone -> RFC 3339 time
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PoolWatch:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            pods = self.cluster.objects("pods", self.namespace, f"rljob.io/job={self.job},rljob.io/pool={self.pool}")
            running = [p["metadata"]["name"] for p in pods if _running(p)]
            self.pods_seen.update(p["metadata"]["name"] for p in pods)
            for pod in pods:
                self.starts.setdefault(pod["metadata"]["name"], {}).update(_milestones(pod))
            status = (self.cluster.get("rlj", self.job, self.namespace) or {}).get("status") or {}
            desired = ((status.get("pools") or {}).get(self.pool) or {}).get("desired")
            step = int(status.get("step") or 0)
            self.samples.append(Sample(time.monotonic() - self._started, tuple(running), desired, step))

    def pod_seconds(self) -> float:
        """Running pods of the pool integrated over the watch (each sample stands for the second before it)."""
        out, last = 0.0, 0.0
        for s in self.samples:
            out += len(s.running) * (s.at - last)
            last = s.at
        return out

    def peak(self) -> int:
        return max((len(s.running) for s in self.samples), default=0)

    def gone_before_step(self, pod: str, steps: int) -> bool:
        """Whether `pod` ran, then stopped running while the job had steps left to train."""
        ran = False
        for s in self.samples:
            ran = ran or pod in s.running
            if ran and pod not in s.running and s.step < steps:
                return True
        return False

    def changes(self) -> list[str]:
        """'t=12s step 4: 2 pods (desired 3)' at each change of the pod count or the desired count."""
        lines, seen = [], None
        for s in self.samples:
            if (len(s.running), s.desired) != seen:
                up = f"{len(s.running)} {self.pool} pods up"
                lines.append(f"t={s.at:5.1f}s step {s.step:3d}: {up}, wanted {s.desired}")
                seen = (len(s.running), s.desired)
        return lines

    def start_lines(self) -> list[str]:
        """Each pod's start, from its creation: 'pod: created <time>, wait-gcs-ready done +9s, ray-worker
        started +10s'."""
        lines = []
        for pod, marks in sorted(self.starts.items(), key=lambda item: item[1]["created"]):
            created = _seconds(marks["created"])
            after = [f"{what} +{_seconds(at) - created:.0f}s" for what, at in marks.items() if what != "created"]
            lines.append(f"{pod}: created {marks['created']}, " + ", ".join(after))
        return lines


def _milestones(pod: dict[str, Any]) -> dict[str, str]:
    """When the pod was created, its init containers finished and its main container started (as the API has them)."""
    status = pod.get("status") or {}
    marks = {"created": pod["metadata"]["creationTimestamp"]}
    for init in status.get("initContainerStatuses") or ():
        if finished := ((init.get("state") or {}).get("terminated") or {}).get("finishedAt"):
            marks[f"{init['name']} done"] = finished
    for main in status.get("containerStatuses") or ():
        if started := ((main.get("state") or {}).get("running") or {}).get("startedAt"):
            marks[f"{main['name']} started"] = started
    return marks


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def scaling_lines(driver_log: str, pool: str = "reward") -> list[str]:
    """The driver's decisions with their reasons ('reward pool 1 -> 3: scale up ...') and its 'reward replica
    reward-1 serving at ..., 8.4s after the decision' lines."""
    return re.findall(rf"{pool} (?:pool \d+ -> \d+: |replica \S+ serving at ).*$", driver_log, re.MULTILINE)


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def scored_by_replica(driver_log: str) -> dict[str, int]:
    """The driver's closing 'reward scored: reward-0 812, reward-1 300' line, as a dict."""
    found = re.findall(r"^reward scored: (.*)$", driver_log, re.MULTILINE)
    if not found:
        return {}
    return {name: int(count) for name, count in (part.rsplit(" ", 1) for part in found[-1].split(", "))}


def drained_pods(driver_log: str, pool: str = "reward") -> list[str]:
    """Pods of the pool's replicas the driver drained and stopped (its 'drained after scoring' lines)."""
    return re.findall(rf"{pool} replica \S+ drained after \w+ \d+ \w+; (\S+) stopped", driver_log)


@dataclass(frozen=True)
class PoolRun:
    name: str
    pod_seconds: float
    seconds_per_step: float
    wall_seconds: float
    scored: dict[str, int]


def elastic_table(elastic: PoolRun, fixed: PoolRun, pool: str = "reward", wall_target: float = 0.05) -> str:
    """The elastic run against the fixed pool: the pool's pod-seconds, s/step, apply-to-Succeeded, and the
    ratios."""
    rows = [f"{pool + ' pool':<16}{'pod-seconds':>12}{'s/step':>9}{'wall s':>9}  samples scored by replica"]
    for run in (elastic, fixed):
        scored = json.dumps(run.scored)
        rows.append(
            f"{run.name:<16}{run.pod_seconds:>12.0f}{run.seconds_per_step:>9.3f}{run.wall_seconds:>9.1f}  {scored}"
        )
    saved = 1 - elastic.pod_seconds / fixed.pod_seconds
    slower = elastic.wall_seconds / fixed.wall_seconds - 1
    step_ratio = elastic.seconds_per_step / fixed.seconds_per_step - 1
    rows.append(
        f"elastic: {saved:.0%} fewer {pool} pod-seconds, {slower:+.1%} wall time, {step_ratio:+.1%} s/step "
        f"(target: >= 30% fewer for <= {wall_target:.0%} more wall time)"
    )
    return "\n".join(rows)
