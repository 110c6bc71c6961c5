"""`rljob run`: a whole RLJob on this machine. Pools are Ray actors on a local Ray cluster; the
controller runs here and serves its ControlService and Prometheus metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_api import RLJob, RLJobInvalid, derive_worker_configs
from rljob_api.workercfg import WorkerConfigs
from rljob_workers.common.auth import TokenError
from rljob_workers.driver.gpu_fit import check_colocate_fits, require_gpu_to_colocate
from rljob_workers.driver.rundir import FolderLock, lock_run_folders, resume_from
from rljob_workers.driver.setup import (
    SetupError,
    check_models,
    check_quickly,
    load_job_file,
    prepare,
    resolved_configs,
)
from rljob_workers.driver.stopping import StoppedBeforePoolsUp, stop_before_the_pools_are_up
from rljob_workers.driver.trackers import TrackerError, Trackers, check_startable, open_trackers

log = logging.getLogger("rljob")


def local_ray_environment() -> None:
    """Keep a local Ray cluster on 127.0.0.1 (by default Ray advertises the machine's outward IP),
    with token authentication.

    Read by Ray when it is first imported, so this runs before anything imports ray."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Token authentication, Ray's default for a local cluster, asked for by name: left to its default,
    # every ray.init prints a warning saying so.
    os.environ.setdefault("RAY_AUTH_MODE", "token")


def run_local(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    locks: list[FolderLock] = []  # held across trainer restarts
    try:
        with stop_before_the_pools_are_up():
            return _run_local(args, locks)
    except StoppedBeforePoolsUp as stopped:
        _stop_ray()
        print(f"{stopped.signal.name} before the pools were up: stopping at once", file=sys.stderr)
        return 128 + int(stopped.signal)
    finally:
        for lock in locks:
            lock.release()


def _run_local(args: argparse.Namespace, locks: list[FolderLock]) -> int:
    """Set up, then run; the folder locks taken go into `locks` (released by the caller)."""
    try:
        job = load_job_file(args.file)
        output = Path(args.output or Path("rljob-runs") / job.metadata.name).resolve()
        if args.cluster:
            check_colocate_fits(job, cluster=True)
            configs = prepare(job, args.steps, cluster=True)
            locks += lock_run_folders(output, Path(configs.trainer.checkpoint.dir))
            check_startable(job, output)
            trackers = open_trackers(job, output)
        else:
            local_ray_environment()
            check_quickly(job, args.steps, args.rollout_python)
            require_gpu_to_colocate(job)  # imports torch, so only for a colocated job
            checkpoints = Path(job.spec.checkpoint.dir).resolve()
            locks += lock_run_folders(output, checkpoints)
            resume_from(checkpoints, args.resume)  # refuses to start over checkpoints before Ray starts
            check_startable(job, output)  # the trackers' folders and tracking URI, before Ray starts too
            configs, trackers = check_models_while_ray_starts(job, output)
    except (RLJobInvalid, SetupError, TrackerError) as exc:
        print(exc, file=sys.stderr)
        _stop_ray()
        return 2
    rc = 1  # what the trackers are told if the run ends by an exception
    try:
        rc = _run_with_restarts(args, job, configs, output, trackers)
        return rc
    finally:
        trackers.close(rc)


def check_models_while_ray_starts(job: RLJob, output: Path) -> tuple[WorkerConfigs, Trackers]:
    """`prepare`'s last check, that the model folders load, in a thread while this thread starts the
    local Ray node, with the import of the controller and the trackers' start: each takes CPU-seconds,
    Ray's start is mostly waiting on its processes. Returns the pools' configs and the started trackers.

    Ray starts here, not in the thread, because its processes die with the thread that started them
    (PR_SET_PDEATHSIG). A model check's error wins over Ray's: it is the one the user can act on."""
    from rljob_workers.common.auth import TOKEN_FILE_NAME
    from rljob_workers.driver.launcher import worker_env
    from rljob_workers.driver.ray_node import init_local_ray

    spec = job.spec
    with ThreadPoolExecutor(1, thread_name_prefix="rljob-setup") as setup:
        checked = setup.submit(_check_models_and_start_trackers, job, output)
        try:
            env = worker_env(str(output / TOKEN_FILE_NAME))  # where LocalRun writes the token
            init_local_ray(derive_worker_configs(job), spec.rollout.cpus, spec.reward.cpus, spec.trainer.cpus, env)
        except Exception:
            checked.result().close(1)  # a failed check is the error to show
            raise
        trackers = checked.result()
    return resolved_configs(job, cluster=False), trackers


def _check_models_and_start_trackers(job: RLJob, output: Path) -> Trackers:
    check_models(job, without_torch=True)
    import rljob_workers.driver.local_run  # noqa: F401  the controller, while Ray still starts

    return open_trackers(job, output)  # wandb's and mlflow's imports alone take seconds


def _stop_ray() -> None:
    """Stop a Ray node this process started (none on a cluster, or before the checks passed)."""
    if "ray" in sys.modules:
        from rljob_workers.driver.ray_node import shutdown_ray

        shutdown_ray()


def _run_with_restarts(
    args: argparse.Namespace, job: RLJob, configs: WorkerConfigs, output: Path, trackers: Trackers
) -> int:
    """Run the job; a dead trainer group starts again from the last checkpoint, spec.trainer.maxRestarts times.
    The trackers record every attempt as one run."""
    from rljob_workers.driver.local_run import LocalRun
    from rljob_workers.driver.supervisor import EXIT_TRAINER_LOST, RestartHistory

    budget = configs.controller.max_restarts["trainer"]
    token = None  # one token for the whole run, made by the first attempt
    history = RestartHistory()  # one for the whole process: its status lists every replacement
    for restart in range(budget + 1):
        run = LocalRun(
            job,
            configs,
            output,
            resume=args.resume or restart > 0,
            display=not args.no_display,
            metrics_port=args.metrics_port,
            cluster=args.cluster,
            job_file=args.file,
            stop_timeout=args.stop_timeout,
            lock_folders=False,
            token=token,
            history=history,
            rollout_python=None if args.cluster else args.rollout_python,
            trackers=trackers,
        )
        try:
            rc = asyncio.run(run.main())
            token = run.token
        except SetupError as exc:
            print(exc, file=sys.stderr)
            return 2
        if rc != EXIT_TRAINER_LOST:
            return rc
        cause = run.trainer_watch.dead or (run.view.message if run.view else "") or "the trainer group failed"
        history.trainer_lost(cause, run.controller.step if run.controller else 0)
        if restart < budget:
            log.warning("restarting the trainer group from the last checkpoint (%d of %d)", restart + 1, budget)
    print(f"the trainer group died more than spec.trainer.maxRestarts ({budget}) times; see above", file=sys.stderr)
    return 1


async def fetch_status(address: str, token: str | None) -> control_pb.JobStatus:
    from rljob_workers.common.grpc_server import channel

    async with channel(address, token) as ch:
        reply = await control_grpc.ControlServiceStub(ch).GetJobStatus(control_pb.GetJobStatusRequest(), timeout=10)
        return reply.status


def secret_token(name: str, namespace: str) -> str:
    """The token in a job's Secret, read with the kubeconfig (the kubernetes client, rljob[operator])."""
    import base64

    try:
        from kubernetes import client, config
    except ImportError:
        raise TokenError(
            "--secret needs the kubernetes client (pip install 'rljob[operator]'); or use --token-file"
        ) from None
    from kubernetes.client.exceptions import ApiException

    config.load_kube_config()
    try:
        secret = client.CoreV1Api().read_namespaced_secret(name, namespace)
    except ApiException as exc:
        raise TokenError(f"Secret {namespace}/{name}: {exc.status} {exc.reason}") from None
    data = (secret.data or {}).get("token")
    if not data:
        raise TokenError(f"Secret {namespace}/{name} has no key 'token'")
    return base64.b64decode(data).decode().strip()


def print_status(address: str, token_file: Path | None = None, secret: str | None = None, namespace: str = "") -> int:
    import grpc

    from rljob_workers.common.auth import read_token
    from rljob_workers.driver.display import Progress

    try:
        token = read_token(token_file) if token_file else secret_token(secret, namespace) if secret else None
        status = asyncio.run(fetch_status(address, token))
    except TokenError as exc:
        print(exc, file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        hint = ""
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            hint = " (pass --token-file: rljob run writes <output>/token; on a cluster --secret <job>-token)"
        print(f"{address}: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
        return 1
    with contextlib.suppress(Exception):
        Progress("status", live=False).final(status)
    return 0
