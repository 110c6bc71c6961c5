"""The environment pool on the real node (#56): `kubectl apply` of the tool example's cluster variant, its
environment a worker group of its own.

- Elastic against fixed: the tool is slow for a stretch of the run (each call of those steps' tasks sleeps), so the
  elastic group (1..4) grows with the episodes' backlog and shrinks after. The same job with the group fixed at 4
  beside it: environment pod-seconds and wall time, both ledgers clean, every episode trained once.
- A fault: one environment pod deleted a few steps into the stretch (a group fixed at 2), its episodes restart on
  the other and a replacement comes up; detection and recovery times from the driver's log.
- The TypeScript environment of examples/environment-server-ts as its own image (`kind: image`): a second
  container in each environment pod, serving the job's episodes on the pod's port with the job's token.
- An environment image that cannot be pulled: Degraded, naming the pool and the reason, within a minute.

Skips only where the machine cannot run containers or the images are not built, naming what is missing.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import Cluster, wait_for
from e2e_elastic import PoolRun, PoolWatch, drained_pods, elastic_table, scaling_lines
from e2e_environments import (
    GROUP,
    PER_STEP,
    calculator_job,
    delete_one_pod,
    make_calculator_assets,
)
from e2e_real import E2E, diagnose, host_volume, make_runs_folder, seconds_per_step, wait_gone
from e2e_registry import push_images
from real_node_fixtures import REAL_NODE_MARKS, RealCluster, RealOperator

from rljob_workers.driver.telemetry.ledger import read_ledger

pytest_plugins = ["real_node_fixtures"]
pytestmark = [*REAL_NODE_MARKS, pytest.mark.ray, pytest.mark.timeout(1800)]

NS = "rljob-e2e-env"
TIMEOUT = 900
# Steps [20, 32) slow: 64 episodes a step, each tool call 1 s, of which one replica runs 6 at once (its threads),
# so the stretch asks for four; before and after it, one is plenty. The elastic pool's pods take about 12 s to
# serve, the stretch's first steps run short of replicas meanwhile (about 9 s lost): the run is long enough that
# this stays within the wall-time target. The fault's run goes on long enough (about 45 s after the pod goes)
# for its replica to be found lost (9 to 26 s) and replaced.
STEPS, SLOW, SLOW_SECONDS, FAULT_STEPS = 160, (20, 32), 1.0, 100
POOLS = {"elastic": (1, 4), "fixed": (4, 4)}


@dataclass
class Setup:
    cluster: Cluster
    operator: RealOperator
    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"


@pytest.fixture(scope="module")
def setup(
    real_cluster: RealCluster,
    real_operator: RealOperator,
    tmp_path_factory: pytest.TempPathFactory,
    calculator: dict[str, Path],
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("e2e-real-env")
    root.chmod(0o755)  # the pods' user reads the volumes below it
    s = Setup(real_cluster.cluster, real_operator, root)
    cluster = s.cluster
    try:
        make_calculator_assets(root / "assets", calculator["model"], STEPS, SLOW, SLOW_SECONDS)
        make_runs_folder(s.runs)
        cluster.kubectl("create", "namespace", NS)
        cluster.apply(real_operator.registry.pull_secret(NS))
        for name, claim, path in (("assets", "rljob-assets", root / "assets"), ("runs", "rljob-runs", s.runs)):
            for doc in host_volume(f"{NS}-{name}", NS, claim, path, local=name == "runs"):
                cluster.apply(doc)
        yield s
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", "--ignore-not-found", check=False)
        for name in ("assets", "runs"):
            cluster.kubectl("delete", "pv", f"{NS}-{name}", "--ignore-not-found", check=False)


def test_environment_pool_grows_with_its_backlog_and_shrinks_after_against_a_fixed_pool(setup: Setup) -> None:
    runs, watches, logs = {}, {}, {}
    for name, replicas in POOLS.items():
        runs[name], watches[name], logs[name] = _environment_run(setup, name, replicas, STEPS)
        print(f"\n{name} environment pool {replicas}:\n  " + "\n  ".join(watches[name].changes()), flush=True)
        print("  " + "\n  ".join(scaling_lines(logs[name], "environment")), flush=True)
    elastic, fixed = runs["elastic"], runs["fixed"]
    print("\n" + elastic_table(elastic, fixed, "environment", wall_target=0.10))
    grown = watches["elastic"]
    assert grown.peak() >= 3 and watches["fixed"].peak() == 4, (grown.peak(), watches["fixed"].peak())
    drained = drained_pods(logs["elastic"], "environment")
    assert drained, "no environment replica was drained:\n" + logs["elastic"][-3000:]
    assert all(grown.gone_before_step(pod, STEPS) for pod in drained), (drained, grown.changes())
    assert 1 - elastic.pod_seconds / fixed.pod_seconds >= 0.30, (elastic, fixed)
    assert elastic.wall_seconds <= 1.10 * fixed.wall_seconds, (elastic, fixed)


def test_an_environment_pod_deleted_mid_run_loses_no_episode_and_is_replaced(setup: Setup) -> None:
    """Its own run (a fault inside the comparison above would make its times a matter of where it lands: the
    driver finds a deleted pod's replica lost in 9 to 26 s)."""
    _environment_run(setup, "fault", (2, 2), FAULT_STEPS, fault=True)


def _environment_run(
    setup: Setup, name: str, replicas: tuple[int, int], steps: int, fault: bool = False
) -> tuple[PoolRun, PoolWatch, str]:
    """Apply the job, watch its environment pods until it ends (deleting one a few steps into the slow stretch
    where `fault`), check its ledger and episodes, delete it."""
    cluster = setup.cluster
    job = calculator_job(NS, setup.operator.worker_image, name, steps, replicas)
    started, applied = time.monotonic(), time.time()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    watch = PoolWatch(cluster, NS, name, pool="environment").start()
    try:
        deleted = _delete_mid_stretch(cluster, name, watch) if fault else None
        status = wait_for(f"{name} to end", lambda: _ended(_status(cluster, name)), timeout=TIMEOUT, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
    finally:
        watch.stop()
    wall = time.monotonic() - started
    assert status["phase"] == "Succeeded", diagnose(cluster, NS)
    driver_log = cluster.kubectl("logs", "-n", NS, f"job/{name}-driver").stdout
    metrics = setup.runs / name / "metrics.jsonl"
    _assert_every_episode_once(metrics, name, steps)
    if deleted is not None:
        _print_the_fault(driver_log, status, *deleted)
    per_step, rewards = seconds_per_step(metrics)
    print(f"{name}: applied at {applied:.0f}, reward {rewards[0]:.2f} -> {statistics.fmean(rewards[-5:]):.2f}")
    cluster.kubectl("delete", "rlj", name, "-n", NS, "--wait=true", "--timeout=120s")
    wait_gone(cluster, NS, f"rljob.io/job={name}", "pods")
    return PoolRun(name, watch.pod_seconds(), per_step, wall, _played_by_replica(driver_log)), watch, driver_log


def _delete_mid_stretch(cluster: Cluster, name: str, watch: PoolWatch) -> tuple[str, float]:
    """Once the slow stretch is under way and the group has grown, delete one of its pods; (pod, wall time)."""

    def grown() -> bool:
        last = watch.samples[-1] if watch.samples else None
        return last is not None and last.step >= SLOW[0] + 3 and len(last.running) >= 2

    wait_for("the environment group grown in the slow stretch", grown, timeout=TIMEOUT, every=0.5)
    pod, _ = delete_one_pod(cluster, NS, name, "environment")
    print(f"environment pod {pod} deleted at step {watch.samples[-1].step}", flush=True)
    return pod, time.time()


def _assert_every_episode_once(metrics: Path, name: str, steps: int) -> None:
    """Every prompt trained once and every step trained its whole groups of episodes: none lost, none twice."""
    books = read_ledger(metrics, steps, PER_STEP)
    episodes = sum(r["samples"] for r in books.records)
    restarts = books.records[-1]["counts"].get("episode_restarts", 0)
    print(
        f"{name}: {episodes} episodes trained of {steps * PER_STEP * GROUP}; prompts lost {books.prompts_lost}, "
        f"trained twice {books.trained_twice}; episodes restarted {restarts}"
    )
    assert books.clean, (name, books.prompts_lost, books.trained_twice, books.scored_twice)
    assert episodes == steps * PER_STEP * GROUP, episodes


def _print_the_fault(driver_log: str, status: dict[str, Any], pod: str, deleted_at: float) -> None:
    """When the driver found the deleted pod's replica lost and when its replacement served, from its log's
    times; status.restarts counts it."""
    died = re.search(r"^(\S+ \S+) \S+ WARNING environment replica (\S+) died \((.*)\); starting", driver_log, re.M)
    replaced = re.search(r"^(\S+ \S+) \S+ WARNING environment replica \S+ replaced by (\S+) in", driver_log, re.M)
    assert died and replaced, "\n".join(line for line in driver_log.splitlines() if "environment" in line)[-3000:]
    detect, recover = _log_time(died.group(1)) - deleted_at, _log_time(replaced.group(1)) - deleted_at
    print(
        f"environment pod {pod} deleted: replica {died.group(2)} found lost after {detect:.1f} s ({died.group(3)}), "
        f"{replaced.group(2)} serving after {recover:.1f} s; status.restarts {status.get('restarts')}"
    )
    assert (status.get("restarts") or {}).get("environment") == 1, status.get("restarts")


def _log_time(stamp: str) -> float:
    """A driver log line's time ('2026-12-04 21:27:40,333', the pod's clock: the host's) as a Unix time."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").astimezone().timestamp()


def _played_by_replica(driver_log: str) -> dict[str, int]:
    found = re.findall(r"^episodes played: (.*)$", driver_log, re.MULTILINE)
    if not found:
        return {}
    return {name: int(count) for name, count in (part.rsplit(" ", 1) for part in found[-1].split(", "))}


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.get("rlj", name, NS) or {}).get("status") or {})


def _ended(status: dict[str, Any]) -> dict[str, Any] | None:
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def _environment_ts_image(setup: Setup, tmp_path: Path) -> str:
    """The TypeScript environment's image (e2e/images-environment-ts.sh) pushed to the node's registry."""
    built = subprocess.run(["bash", str(E2E / "images-environment-ts.sh"), "check"], capture_output=True, text=True)
    if built.returncode:
        pytest.skip(built.stdout.strip() or "the TypeScript environment image is not built")
    pushed = push_images(setup.operator.registry, tmp_path, "environment-ts")
    [reference] = pushed
    return reference


TS_STEPS = 6


def test_an_environment_in_typescript_runs_as_its_own_image_in_the_pool_pods(setup: Setup, tmp_path: Path) -> None:
    """kind image: the TypeScript server's image as a second container of each environment pod, on the pod's port
    with the job's token; the Ray actor in the pod waits for it and stands for it. It drives the job's episodes:
    the run reaches Succeeded with every episode trained once, its tools called."""
    cluster, name = setup.cluster, "calculator-ts"
    image = _environment_ts_image(setup, tmp_path)
    job = calculator_job(NS, setup.operator.worker_image, name, TS_STEPS, (1, 2))
    environment = job["spec"]["environment"]
    for python_only in ("class", "args"):
        environment.pop(python_only)
    environment.update(kind="image", image=image, env={"RLJOB_STEP_LATENCY_SECONDS": "0.05"})
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    try:
        status = wait_for(f"{name} to end", lambda: _ended(_status(cluster, name)), timeout=TIMEOUT, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
    assert status["phase"] == "Succeeded", diagnose(cluster, NS)
    pods = cluster.objects("pods", NS, f"rljob.io/job={name},rljob.io/pool=environment")
    containers = {c["name"]: c["image"] for pod in pods for c in pod["spec"]["containers"]}
    assert containers.get("environment") == image, containers
    metrics = setup.runs / name / "metrics.jsonl"
    books = read_ledger(metrics, TS_STEPS, PER_STEP)
    assert books.clean and sum(r["samples"] for r in books.records) == TS_STEPS * PER_STEP * GROUP
    tool_calls = sum(r["episodes"].get("tool_calls_calc", 0) for r in books.records)
    driver_log = cluster.kubectl("logs", "-n", NS, f"job/{name}-driver", check=False).stdout
    assert tool_calls > 0, f"{books.records[-1]['episodes']}\n{driver_log[-4000:]}"
    print(f"TypeScript environment {image}: Succeeded in {time.monotonic() - started:.0f} s, {tool_calls} tool calls")
    cluster.kubectl("delete", "rlj", name, "-n", NS, "--wait=true", "--timeout=120s")
    wait_gone(cluster, NS, f"rljob.io/job={name}", "pods")


def test_an_environment_image_that_cannot_be_pulled_is_degraded_within_a_minute(setup: Setup) -> None:
    """kind image with an image the registry does not have: within a minute of `kubectl apply` the job is
    Degraded naming the environment pool and the pull failure, and it does not say Running."""
    cluster, name = setup.cluster, "calculator-no-image"
    missing = f"{setup.operator.registry.address}/rljob/no-such-environment:0.0.0"
    job = calculator_job(NS, setup.operator.worker_image, name, 2, (1, 1))
    environment = job["spec"]["environment"]
    for python_only in ("class", "args"):
        environment.pop(python_only)
    environment.update(kind="image", image=missing)
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))

    def degraded() -> dict[str, Any] | None:
        conditions = {c["type"]: c for c in _status(cluster, name).get("conditions") or ()}
        found = conditions.get("Degraded")
        return found if found and found["status"] == "True" else None

    try:
        condition = wait_for("Degraded", degraded, timeout=60, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
    took = time.monotonic() - started
    print(f"Degraded {took:.0f} s after kubectl apply: {condition['reason']}: {condition['message']}")
    assert condition["reason"] == "ImagePullFailed" and "environment" in condition["message"], condition
    assert missing in condition["message"] or "no-such-environment" in condition["message"], condition
    assert _status(cluster, name).get("phase") != "Running", _status(cluster, name)
    cluster.kubectl("delete", "rlj", name, "-n", NS, "--wait=true", "--timeout=120s")
    wait_gone(cluster, NS, f"rljob.io/job={name}", "pods")
