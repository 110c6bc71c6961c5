"""`rljob run --cluster`, the driver pod's command, tested without Kubernetes.

A Ray head with the three pools' resources runs in a network namespace of its own (a stand-in
for the KubeRay head pod, with a 198.18.0.0/15 address); `rljob run --cluster` runs beside it in
the same namespace, as the driver pod does. From outside the namespace the test reads the
ControlService with `rljob status` and the metrics over HTTP at the spec's ports, the way the
operator and Prometheus reach a driver pod, and watches that no second Ray is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from test_local_run import job_doc

from rljob.v1 import control_service_pb2 as control_pb
from rljob_api.workercfg import TERMINATION_LOG_ENV, TOKEN_FILE_ENV, Ports, pool_resource
from rljob_workers.common.auth import JobToken

pytestmark = [pytest.mark.ray, pytest.mark.serial]

BIN = Path(sys.executable).parent
NETNS = f"rljob-drv{os.getpid()}"
HOST_IP, POD_IP = "198.18.250.1", "198.18.250.2"  # the benchmarking range, never a private one
RAY_PORT = 6390
PROMPTS_PER_STEP, GROUP_SIZE = 4, 4


def _missing() -> str | None:
    """What this machine lacks for the test, or None."""
    if os.geteuid() != 0:
        return "root, to create a network namespace"
    if shutil.which("ip") is None:
        return "iproute2's `ip` command"
    if not (BIN / "ray").exists() or not (BIN / "rljob").exists():
        return f"the `ray` and `rljob` commands in {BIN}"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace joined to this one by a veth pair: POD_IP inside, HOST_IP outside."""
    missing = _missing()
    if missing is not None:
        pytest.skip(f"needs {missing}")
    host_if, pod_if = f"rjh{os.getpid() % 100000}", f"rjp{os.getpid() % 100000}"
    _ip("netns", "add", NETNS)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", pod_if)
        _ip("link", "set", pod_if, "netns", NETNS)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for args in (
            ("addr", "add", f"{POD_IP}/30", "dev", pod_if),
            ("link", "set", pod_if, "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("netns", "exec", NETNS, "ip", *args)
        yield NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)  # takes the veth pair with it


# The job's reward: the example's exact match, but every sample after the first step's waits until
# the test has looked at the running job (a file, the gate, appears), however fast the job would be.
HELD_REWARD = """
import asyncio, os
from rljob_workers.tasks.arithmetic import exact_match

_scored = 0

async def held_exact_match(prompt, completion, answer, **_):
    global _scored
    _scored += 1
    while _scored > int(os.environ["RLJOB_TEST_HOLD_AFTER"]) and not os.path.exists(os.environ["RLJOB_TEST_GATE"]):
        await asyncio.sleep(0.05)
    return exact_match(prompt, completion, answer)
"""


@pytest.fixture
def held_reward(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gate of HELD_REWARD: the samples of step 2 on are scored once this file exists."""
    folder = tmp_path_factory.mktemp("held")
    (folder / "held_reward.py").write_text(HELD_REWARD)
    return folder / "gate"


def _pod_env(gate: Path) -> dict[str, str]:
    """The environment of a process in a pod: this one's, less what a fresh container lacks, plus
    where the job's reward (HELD_REWARD, with `gate`) is imported from.

    Ray turns token authentication on for `ray start` when ~/.ray/auth_token exists (a local
    `ray.init()` on this machine writes one), but not for a driver connecting by address; in a
    pod there is no such file, so both sides run without it, as here.
    """
    return {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(gate.parent), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RLJOB_TEST_GATE": str(gate),
        "RLJOB_TEST_HOLD_AFTER": str(PROMPTS_PER_STEP * GROUP_SIZE),
    }


def _in_netns(netns: str, *command: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *command]


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _gcs_servers() -> int:
    """Ray clusters on this machine: each runs one gcs_server."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                count += (entry / "comm").read_text().strip() == "gcs_server"
            except OSError:
                continue
    return count


@pytest.fixture
def ray_head(netns: str, tmp_path_factory: pytest.TempPathFactory, held_reward: Path) -> Iterator[str]:
    """`ray start --head` in the namespace, with one of each pool's resources (plus a spare rollout)."""
    temp_dir = Path(f"/tmp/rjc{os.getpid()}")  # Ray's socket paths must stay short
    resources = {pool_resource("rollout"): 2, pool_resource("reward"): 1, pool_resource("trainer"): 1}
    command = [
        str(BIN / "ray"),
        *("start", "--head", "--block", f"--node-ip-address={POD_IP}", f"--port={RAY_PORT}"),
        *("--num-cpus=4", "--num-gpus=0", f"--resources={json.dumps(resources)}", f"--temp-dir={temp_dir}"),
        *("--include-dashboard=false", "--disable-usage-stats"),
    ]
    log = (tmp_path_factory.mktemp("head") / "head.log").open("w")
    head = subprocess.Popen(
        _in_netns(netns, *command),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_pod_env(held_reward),
        start_new_session=True,
    )
    try:
        _wait_for_port(POD_IP, RAY_PORT, 60, head)
        yield f"{POD_IP}:{RAY_PORT}"
    finally:
        # Killed outright: a graceful `ray stop` drains for 30 s, and nothing of this cluster is kept.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait(30)
        for pid in _processes_with(str(temp_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _wait_for_port(host: str, port: int, seconds: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args!r} exited with {process.returncode} before {host}:{port} opened")
        with socket.socket() as sock:
            sock.settimeout(1)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on {host}:{port} after {seconds:.0f}s")


def _metrics_once_trained(url: str, driver: subprocess.Popen[bytes], seconds: float = 120) -> str:
    """The driver's metrics page once it reports a step: the first step is trained whole (HELD_REWARD
    holds the second), so it comes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and driver.poll() is None:
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        if "rljob_step{" in page:
            return page
        time.sleep(0.2)
    raise AssertionError(f"no step on {url} after {seconds:.0f}s (driver exit code {driver.poll()})")


def _job_file(assets: Path, work: Path) -> Path:
    # 12 x 4 prompts of the 64: every step a new prompt group
    doc = job_doc(assets, work, totalSteps=12, promptsPerStep=PROMPTS_PER_STEP, groupSize=GROUP_SIZE)
    doc["spec"]["reward"]["functions"][0]["rule"]["function"] = "held_reward:held_exact_match"
    path = work / "rljob.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_cluster_run_joins_the_ray_it_is_given_and_serves_at_the_spec_ports(
    assets, ray_head, netns, held_reward, tmp_path
):
    job_file = _job_file(assets, tmp_path)
    ports = Ports()  # the defaults the operator's Services point at
    clusters_before = _gcs_servers()
    termination_log = tmp_path / "termination-log"  # the driver pod's /dev/termination-log
    env = {**_pod_env(held_reward), "RAY_ADDRESS": ray_head, TERMINATION_LOG_ENV: str(termination_log)}
    command = _in_netns(netns, str(BIN / "rljob"), "run", "--cluster", "--no-display", str(job_file))
    # Without the job's token (the operator's Secret, mounted) the driver refuses to start, in a line.
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "RLJOB_TOKEN_FILE is not set" in refused.stderr, refused.stderr[-2000:]
    token = JobToken.new(tmp_path / "secret")  # as the operator's Secret is mounted in the driver pod
    env[TOKEN_FILE_ENV] = token.path
    log_path = tmp_path / "driver.log"
    with log_path.open("w") as log:
        driver = subprocess.Popen(
            [*command, "--output", str(tmp_path / "out")], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            _wait_for_port(POD_IP, ports.control, 120, driver)
            metrics = _metrics_once_trained(f"http://{POD_IP}:{ports.metrics}/metrics", driver)
            status = subprocess.run(
                [str(BIN / "rljob"), "status", f"{POD_IP}:{ports.control}", "--token-file", token.path],
                capture_output=True,
                text=True,
                timeout=30,
            )
            clusters_during = _gcs_servers()
            held_reward.touch()  # the job goes on past its first step
            rc = driver.wait(240)
        finally:
            if driver.poll() is None:
                driver.kill()
    output = log_path.read_text()
    assert rc == 0, output[-3000:]
    assert clusters_during == clusters_before, f"the driver started a Ray of its own:\n{output[-3000:]}"
    assert "Started a local Ray instance" not in output
    assert status.returncode == 0, status.stderr
    assert "rollout 1/1  trainer 1/1  reward 1/1" in status.stdout, (
        status.stdout
    )  # the live pools, as the driver sees them
    assert "rljob_step{" in metrics and "rljob_policy_version{" in metrics, metrics[:500]
    record = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in record] == list(range(1, 13))
    # its last word for the operator, read once the ControlService is gone: the final step and reward
    final = json_format.Parse(termination_log.read_text(), control_pb.JobStatus())
    assert final.phase == control_pb.RUN_PHASE_SUCCEEDED and final.step == final.total_steps == 12, final
    assert final.reward_mean == record[-1]["reward_mean"] and final.checkpoint.endswith("step-000012")
