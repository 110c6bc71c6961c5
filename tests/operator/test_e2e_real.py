"""`kubectl apply -f examples/arithmetic-cluster.yaml` trains for real (`make e2e-real`).

The e2e control plane with KubeRay and one real node (kubelet, containerd, kube-proxy, CoreDNS); the
operator installed by its Helm chart into a pod from its own image; the RLJob applied with kubectl.
Its head, three worker groups and driver run as containers of the worker-test image on that node:
KubeRay starts Ray in them, the driver runs `rljob run --cluster`, the operator reads the driver's
ControlService through its Service and writes the RLJob's status. Every Ray pod's raylet must reach
the object store it has just started without Ray's 1 s connect retry (raylet.out). While it trains, a pod of
another namespace calls its ControlService and WeightService without the job's token and is refused; then it
loses a reward, a rollout and a trainer pod, the operator pod and the driver pod, one at a time. It must still
reach Succeeded with the last five steps' mean reward >= 0.8 (the `make run` bar), train every prompt once and
score every sample once, leave its checkpoint and metrics on the run volume, and `kubectl delete rlj` must
leave nothing of it but the user's two claims. Two more runs put a judge that slows down for a stretch in
front of an elastic reward pool and a fixed one: the elastic group grows with the backlog and shrinks after
it, draining each replica before its pod goes.

Skips only where the machine cannot run containers or the images are not built, naming what is missing.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_cluster import Cluster, wait_for
from e2e_elastic import (
    PoolRun,
    PoolWatch,
    Stretch,
    drained_pods,
    elastic_table,
    judged_job,
    scaling_lines,
    scored_by_replica,
    write_judged_data,
)
from e2e_faults import Fault, FaultRun, child_generations, each_restart_told_once, fault_table
from e2e_intruders import intrude, intrude_on_ray, refused
from e2e_jobs import start_kubectl_wait
from e2e_prometheus import Prometheus, Window, empty_panels, scrape_configs, service_monitors
from e2e_real import (
    TRAINER_SHM_BYTES,
    cluster_job,
    diagnose,
    host_volume,
    make_assets,
    make_runs_folder,
    read_running_pods,
    seconds_per_step,
    wait_gone,
)
from e2e_registry import pulled_images
from real_node_fixtures import REAL_NODE_MARKS, RealCluster, RealOperator

from rljob_workers.driver.telemetry.ledger import read_ledger

pytest_plugins = ["real_node_fixtures"]
pytestmark = [*REAL_NODE_MARKS, pytest.mark.ray, pytest.mark.timeout(1800)]

NS = "rljob-e2e-real"
JOB = "arithmetic"
TIMEOUT = 900  # apply -> first step, or the last fault -> Succeeded; each about 1-2 minutes on 2 cores
TRACKER_KEYS = "tracker-keys"


class Setup:
    """The cluster with the operator in a pod, and the folders behind the job's volumes."""

    def __init__(self, real: RealCluster, operator: RealOperator, root: Path) -> None:
        self.cluster, self.root, self.operator = real.cluster, root, operator
        self.assets, self.runs = root / "assets", root / "runs"
        self.times = real.times
        self.prometheus: Prometheus | None = None
        self.windows: list[Window] = []  # each RLJob run, for the dashboard test

    def ran(self, name: str, start: float, job: dict[str, Any]) -> None:
        spec = job["spec"]
        self.windows.append(
            Window(NS, name, start, time.time(), "eval" in spec["data"], bool(spec.get("environments")))
        )


@pytest.fixture(scope="module")
def setup(
    real_cluster: RealCluster,
    real_operator: RealOperator,
    tmp_path_factory: pytest.TempPathFactory,
    example_model: Path,
) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("e2e-real")
    root.chmod(0o755)  # the pods' user reads the volumes below it
    s = Setup(real_cluster, real_operator, root)
    cluster = s.cluster
    try:
        t0 = time.monotonic()
        monitors = service_monitors(cluster, real_operator.namespace)
        jobs = scrape_configs(monitors, cluster.env["KUBECONFIG"])
        s.prometheus = Prometheus(Path(cluster.env["RLJOB_E2E_BIN"]) / "prometheus", root / "prometheus", jobs)
        make_assets(s.assets, example_model)
        make_runs_folder(s.runs)
        cluster.kubectl("create", "namespace", NS)
        cluster.apply(real_operator.registry.pull_secret(NS))  # every job of this module pulls the registry's image
        for name, claim, path in (("assets", "rljob-assets", s.assets), ("runs", "rljob-runs", s.runs)):
            for doc in host_volume(f"{NS}-{name}", NS, claim, path, local=name == "runs"):
                cluster.apply(doc)
        s.times["this module's set-up"] = time.monotonic() - t0
        yield s
    finally:
        if s.prometheus is not None:
            s.prometheus.stop()
        # the node as the shared fixtures left it, for the next module
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", "--ignore-not-found", check=False)
        for name in ("assets", "runs"):
            cluster.kubectl("delete", "pv", f"{NS}-{name}", "--ignore-not-found", check=False)


def registry_job(setup: Setup) -> dict[str, Any]:
    """The example whose images come from the node's registry, pulled with the job's pull Secret
    (spec.imagePullSecrets), and whose driver takes the trackers' credentials (spec.logging.secretName): it
    starts only once the kubelet has read them."""
    job = cluster_job(NS, setup.operator.worker_image)
    job["spec"].setdefault("logging", {})["secretName"] = TRACKER_KEYS
    setup.cluster.kubectl("create", "secret", "generic", TRACKER_KEYS, "-n", NS, "--from-literal=WANDB_API_KEY=unused")
    return job


def assert_pods_ran_what_was_pulled(setup: Setup, inside: dict[str, Any]) -> None:
    """Every pod of the job ran the image the node pulled from the registry (none was imported under that
    name); the driver's environment came from the trackers' Secret."""
    assert setup.operator.worker_image in pulled_images(setup.cluster, setup.operator.registry)
    assert set(inside.get("images", ())) == {setup.operator.worker_image}, inside.get("images")
    driver_pod = setup.cluster.objects("pods", NS, f"rljob.io/job={JOB},rljob.io/component=driver")[0]["spec"]
    assert driver_pod["containers"][0]["envFrom"] == [{"secretRef": {"name": TRACKER_KEYS}}], driver_pod


def delete_leaves_only_the_claims(cluster: Cluster) -> None:
    """kubectl delete: every child goes (pods, services, the driver Job, ConfigMap, RBAC, RayCluster)."""
    cluster.kubectl("delete", "rlj", JOB, "-n", NS, "--wait=true", "--timeout=120s")
    selector = f"rljob.io/job={JOB}"
    wait_gone(
        cluster,
        NS,
        selector,
        "pods,services,jobs,configmaps,secrets,networkpolicies,serviceaccounts,roles,rolebindings,rayclusters",
    )
    wait_for("no pod in the namespace", lambda: not cluster.kubectl("get", "pods", "-n", NS, "-o", "name").stdout)
    services = cluster.kubectl("get", "services", "-n", NS, "-o", "name").stdout
    claims = cluster.kubectl("get", "pvc", "-n", NS, "-o", "name").stdout.split()
    assert not services.strip(), services
    assert sorted(claims) == ["persistentvolumeclaim/rljob-assets", "persistentvolumeclaim/rljob-runs"], claims


# Long enough for the intruder and all five faults, with ~200 steps to spare. Steps now run ~0.08 s apart,
# and go on while a pod is replaced (~22 s): in one CI run the fourth fault came at step 436 (70-150 steps a
# fault), and 480 steps ended before the fifth. The steps after it only wait: each 100 costs ~10 s.
STEPS = 800
# One at a time, each a few steps after the one before has recovered.
FAULTS = ["reward", "rollout", "trainer", "operator", "driver"]
SPACING = 10


def test_apply_trains_through_five_faults_to_succeeded_and_delete_leaves_nothing(setup: Setup) -> None:
    """`kubectl apply` of the cluster example (longer, checkpointing every 10 steps), pulled from the
    registry. A pod of another namespace calls it without the token and is refused. Then a reward, a rollout
    and a trainer worker pod, the operator pod and the driver pod are deleted, one at a time, mid-run:
    KubeRay recreates each pool pod and the pool takes it back; the new operator adopts the job and rewrites
    nothing; the Job restarts the driver, which resumes from the checkpoint on the volume. The run still
    learns as `make run` does and reaches Succeeded, its ledger trains every prompt once and scores every
    sample once, and `kubectl delete` leaves only the user's claims. One run for both stories: the clean
    path's checks all hold on the faulted run, which costs CI one job start instead of two."""
    cluster = setup.cluster
    job = registry_job(setup)
    reward_from_a_config_map(cluster, job)  # #54: the reward function exists only in a ConfigMap
    job["spec"]["algorithm"]["totalSteps"] = STEPS
    job["spec"]["checkpoint"]["everySteps"] = 10  # a resumed driver or trainer loses little
    run = FaultRun(cluster, NS, JOB)
    started, applied = time.monotonic(), time.time()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    waiting = start_kubectl_wait(cluster, JOB, NS, "Succeeded")  # #53: a pipeline waits the Kubernetes way
    wait_for("the first step", lambda: run.step() >= 1, timeout=TIMEOUT, every=0.5)
    first_step = time.monotonic() - started
    inside = read_running_pods(cluster, NS, JOB)  # the pools up, before any fault
    try:
        faults = intrude_then_fault(setup, run)
        status = wait_for("the run to end", lambda: _ended(run.status()), timeout=TIMEOUT)
    except AssertionError as exc:
        waiting.kill()
        raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
    took = time.monotonic() - started
    waited = waiting.communicate(timeout=60)[0].strip()  # it returns on its own once Succeeded is True
    print(f"kubectl wait --for=condition=Succeeded (started at apply): rc {waiting.returncode}, {waited!r}")
    setup.ran(JOB, applied, job)
    assert status["phase"] == "Succeeded", diagnose(cluster, NS)
    assert waiting.returncode == 0 and "condition met" in waited, waited
    final_line = cluster.kubectl("get", "rlj", JOB, "-n", NS).stdout

    # the run's own record, on the run volume: every step once, learned, and its checkpoint
    output = setup.runs / JOB
    books = read_ledger(output / "metrics.jsonl", STEPS, job["spec"]["algorithm"]["promptsPerStep"])
    assert [r["step"] for r in books.records] == list(range(1, STEPS + 1))
    rewards = [r["reward_mean"] for r in books.records]
    assert rewards[0] <= 0.2 and statistics.mean(rewards[-5:]) >= 0.8, rewards
    # the RLJob's status ends where the run ended (the driver pod's termination message), not at the last poll
    assert status.get("step") == STEPS and status["reward"]["mean"] == rewards[-1], status
    latest = output / "checkpoints" / "latest"
    final_checkpoint = output / "checkpoints" / latest.read_text().strip()
    assert json.loads((final_checkpoint / "state.json").read_text())["step"] == STEPS, final_checkpoint
    assert_inside_the_pods(setup, inside)
    assert_the_driver_resumed(cluster, faults[-1], books.records)
    print("\n" + fault_table(faults, books.prompts_lost, books.trained_twice, books.scored_twice, status["phase"]))
    assert books.clean, (books.prompts_lost, books.trained_twice, books.scored_twice)
    each_restart_told_once(cluster, NS, JOB, status)

    delete_leaves_only_the_claims(cluster)
    assert (final_checkpoint / "state.json").exists(), "the checkpoint outlives the job, on the user's volume"
    print(f"\nset-up: {json.dumps({k: round(v, 1) for k, v in setup.times.items()})}")
    print(f"kubectl apply -> first train step {first_step:.1f}s, -> Succeeded {took:.1f}s (five faults on the way)")
    print(f"each Ray pod's raylet reaching its object store: {inside.get('store_connect')}")
    print(f"final status:\n{final_line}")


# The shipped example's reward as a user writes it beside their job, and ships it with `kubectl create configmap
# --from-file`: in no image, only in the ConfigMap the job's spec.code names.
CONFIG_MAP_REWARDS = """
def exact_match(prompt, completion, answer, **_):
    text = completion.split("</s>")[0].strip()
    return 1.0 if text == answer.strip() else 0.0
"""


def reward_from_a_config_map(cluster: Cluster, job: dict[str, Any]) -> None:
    """The job's reward function from a ConfigMap (`spec.code.configMap`): the operator mounts it into the driver
    and the reward pods and puts it on their PYTHONPATH."""
    source = cluster.state / "configmap_rewards.py"
    source.write_text(CONFIG_MAP_REWARDS)
    made = cluster.kubectl("create", "configmap", "arithmetic-rewards", "-n", NS, f"--from-file={source}")
    assert made.returncode == 0, made.stderr
    job["spec"]["code"] = {"configMap": "arithmetic-rewards"}
    [function] = job["spec"]["reward"]["functions"]
    function["rule"]["function"] = "configmap_rewards:exact_match"


def intrude_then_fault(setup: Setup, run: FaultRun) -> list[Fault]:
    """The intruder, refused, then each of FAULTS, one at a time, timed; the faults done."""
    cluster = setup.cluster
    # A pod of another namespace, without the token, while the job trains: it reaches both ports (the e2e
    # node's bridge enforces no NetworkPolicy) and is refused by the token; no Stop, no weights.
    intruder = intrude(cluster, setup.operator.worker_image, setup.operator.registry.pull_secret(NS), NS, JOB)
    assert intruder == {"Stop": ["UNAUTHENTICATED"] * 2, "FetchWeights": ["UNAUTHENTICATED"] * 2}, intruder
    # A pod in the job's own namespace wearing the job's label (the NetworkPolicy admits it) at Ray's doors:
    # the dashboard's job API (a submitted job would print the token file), the GCS, the client port. Ray's
    # token authentication refuses each, with no token and with a wrong one.
    ray = intrude_on_ray(cluster, setup.operator.worker_image, NS, JOB)
    assert len(ray) == 4 and all(len(answers) == 2 for answers in ray.values()), ray
    assert all(refused(answers) for answers in ray.values()), ray
    assert run.status().get("phase") == "Running", "the intruder stopped the job or it ended before the intrusion"
    faults = []
    for target in FAULTS:
        generations = child_generations(cluster, NS, JOB) if target == "operator" else {}
        faults.append(run.inject(Fault(target, run.step() + SPACING)))
        print(f"{target} pod deleted at step {faults[-1].step}: detected {faults[-1].detect:.1f}s, "
              f"recovered {faults[-1].recover:.1f}s", flush=True)  # fmt: skip
        if target == "operator":  # the new one adopted the job and rewrote none of its children
            assert child_generations(cluster, NS, JOB) == generations
    return faults


def assert_inside_the_pods(setup: Setup, inside: dict[str, Any]) -> None:
    """What the pools' pods showed once training started: every Ray pod's raylet reached the object store it
    had just started without Ray's 1 s connect retry (rljob_api.workercfg.RAY_SYSTEM_CONFIG, in each Ray pod's
    environment); the trainer pod's /dev/shm is memory-backed at the size the spec set (spec.trainer.shmSize);
    every pod ran the image pulled from the registry."""
    store_connect, shm = inside.get("store_connect", {}), inside.get("shm", {})
    assert len(store_connect) >= 2 and max(store_connect.values()) < 0.5, store_connect
    assert shm and set(shm.values()) == {TRAINER_SHM_BYTES}, shm
    assert_pods_ran_what_was_pulled(setup, inside)


def assert_the_driver_resumed(cluster: Cluster, deleted: Fault, records: list[dict[str, Any]]) -> None:
    """The deleted driver left a checkpoint on SIGTERM (not only the periodic one): its successor resumed at
    or after the step the status showed when the pod was deleted, with that step's policy version, and
    trained to the end (its log has the last step). The Job counts the deleted driver, retried once."""
    log = cluster.kubectl("logs", "-n", NS, f"job/{JOB}-driver").stdout
    resumed = re.search(r"resuming from \S+: step (\d+), policy version (\d+)", log)
    assert resumed, log[-3000:]
    step, version = int(resumed.group(1)), int(resumed.group(2))
    assert step >= deleted.step and version == records[step - 1]["version"], (step, version, deleted)
    assert f"step {STEPS}/" in log, log[-3000:]
    driver = cluster.get("job", f"{JOB}-driver", NS) or {}
    assert driver.get("status", {}).get("failed") == 1, driver.get("status")


# The fast tail after the slow stretch must hold the scale-down window (5 s), after the slow samples have
# left the latency the load is measured with, and the drain: measured, 3 -> 1 came ~57 steps (~8 s) after
# step 36 and the pod was gone ~9 steps later. 54 steps of tail were too few once the steps got faster.
ELASTIC_STEPS, SLOW = 200, Stretch(12, 36)
POOLS = {"elastic": (1, 3), "fixed": (3, 3)}  # reward replicas (min, max)


def test_reward_pool_grows_and_shrinks_with_its_backlog(setup: Setup) -> None:
    """A judge that slows down 60x from step 12 to 36: the elastic job's reward backlog grows, the driver asks for
    more replicas, the operator raises the reward worker group, KubeRay starts pods, their replicas take
    samples; once the judge is fast again a replica is drained and its pod goes while the run trains on.
    The same job with a fixed pool at the maximum beside it: reward pod-seconds and time, both ledgers clean."""
    write_judged_data(setup.assets, ELASTIC_STEPS, SLOW)
    runs, watches, logs, scaled = {}, {}, {}, {}
    for name, replicas in POOLS.items():
        runs[name], watches[name], logs[name], scaled[name] = _judged_run(setup, name, replicas)
        print(f"\n{name} reward pool {replicas}:\n  " + "\n  ".join(watches[name].changes()), flush=True)
        print("  " + "\n  ".join(watches[name].start_lines() + scaling_lines(logs[name])), flush=True)
    elastic, fixed = runs["elastic"], runs["fixed"]
    print("\n" + elastic_table(elastic, fixed))
    grown = watches["elastic"]
    assert grown.peak() >= 2 and watches["fixed"].peak() == 3, (grown.peak(), watches["fixed"].peak())
    drained = drained_pods(logs["elastic"])
    assert drained, "no reward replica was drained:\n" + logs["elastic"][-3000:]
    # each drained replica's pod went (KubeRay's workersToDelete) while the job still trained
    assert all(grown.gone_before_step(pod, ELASTIC_STEPS) for pod in drained), (drained, grown.changes())
    assert sum(1 for n in elastic.scored.values() if n > 0) >= 2, elastic.scored  # the added replicas scored
    assert elastic.pod_seconds < fixed.pod_seconds, (elastic, fixed)
    # `kubectl describe rlj` told each scale: up with the backlog, down after it; the fixed pool never scaled
    assert any(now > was for was, now in scaled["elastic"]) and any(now < was for was, now in scaled["elastic"])
    assert not scaled["fixed"], scaled["fixed"]


def _judged_run(
    setup: Setup, name: str, replicas: tuple[int, int]
) -> tuple[PoolRun, PoolWatch, str, list[tuple[int, int]]]:
    """Apply the judged job, watch its reward pods until it ends, check its ledger, delete it. Also returns
    the reward scalings (from, to) `kubectl describe rlj` shows."""
    cluster = setup.cluster
    job = judged_job(NS, setup.operator.worker_image, name, ELASTIC_STEPS, replicas)
    started, applied = time.monotonic(), time.time()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    watch_ = PoolWatch(cluster, NS, name).start()
    try:
        status = wait_for(f"{name} to end", lambda: _ended(_status(cluster, name)), timeout=TIMEOUT, every=1.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(cluster, NS)}") from None
    finally:
        watch_.stop()
    wall = time.monotonic() - started
    setup.ran(name, applied, job)
    assert status["phase"] == "Succeeded", diagnose(cluster, NS)
    driver_log = cluster.kubectl("logs", "-n", NS, f"job/{name}-driver").stdout
    books = read_ledger(setup.runs / name / "metrics.jsonl", ELASTIC_STEPS, job["spec"]["algorithm"]["promptsPerStep"])
    assert books.clean, (name, books.prompts_lost, books.trained_twice, books.scored_twice)
    per_step, _ = seconds_per_step(setup.runs / name / "metrics.jsonl")
    described = cluster.kubectl("describe", "rlj", name, "-n", NS).stdout
    scaled = [(int(a), int(b)) for a, b in re.findall(r"RewardScaled\s.*reward replicas (\d+) -> (\d+)", described)]
    cluster.kubectl("delete", "rlj", name, "-n", NS, "--wait=true", "--timeout=120s")
    wait_gone(cluster, NS, f"rljob.io/job={name}", "pods")
    run = PoolRun(name, watch_.pod_seconds(), per_step, wall, scored_by_replica(driver_log))
    return run, watch_, driver_log, scaled


def _status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict((cluster.get("rlj", name, NS) or {}).get("status") or {})


def _ended(status: dict[str, Any]) -> dict[str, Any] | None:
    return status if status.get("phase") in ("Succeeded", "Failed") else None


def test_every_dashboard_panel_shows_each_run(setup: Setup) -> None:
    """Prometheus scraped the operator and each driver as the chart's ServiceMonitors say; with the
    dashboard's variables set to each RLJob that ran above, every panel's query returns data."""
    prometheus = setup.prometheus
    assert prometheus is not None
    if not setup.windows:
        pytest.skip("no RLJob ran to its end above, so there is nothing for the dashboard to show")
    targets = prometheus.targets()
    lines = [f"  {t['labels'].get('job')} {t['scrapeUrl']} {t['health']} {t.get('lastError') or ''}" for t in targets]
    print("\nPrometheus targets:\n" + "\n".join(lines))
    assert any(t["labels"].get("namespace") == "rljob-system" and t["health"] == "up" for t in targets), targets
    empty = {w.rljob: empty_panels(prometheus, w) for w in setup.windows}
    for w in setup.windows:
        print(f"{w.rljob}: {w.end - w.start:.0f}s, empty panels: {len(empty[w.rljob])}")
    assert not any(empty.values()), json.dumps(empty, indent=1)
