"""`rljob run`: a whole RLJob on this machine. Pools are Ray actors on a local Ray cluster; the
controller runs here and serves its ControlService and Prometheus metrics."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_api import RLJob, RLJobInvalid
from rljob_api.workercfg import WorkerConfigs
from rljob_workers.common.auth import TokenError
from rljob_workers.driver.rundir import lock_run_folders
from rljob_workers.driver.setup import SetupError, load_job_file, prepare

log = logging.getLogger("rljob")


def use_loopback_ray() -> None:
    """Keep a local Ray cluster on 127.0.0.1 (by default Ray advertises the machine's outward IP).

    Read by Ray when it is first imported, so this runs before anything imports ray."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def run_local(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        job = load_job_file(args.file)
        configs = prepare(job, args.steps, cluster=args.cluster)
    except (RLJobInvalid, SetupError) as exc:
        print(exc, file=sys.stderr)
        return 2
    output = Path(args.output or Path("rljob-runs") / job.metadata.name).resolve()
    if not args.cluster:
        use_loopback_ray()
    try:
        locks = lock_run_folders(output, Path(configs.trainer.checkpoint.dir))  # held across trainer restarts
    except SetupError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        return _run_with_restarts(args, job, configs, output)
    finally:
        for lock in locks:
            lock.release()


def _run_with_restarts(args: argparse.Namespace, job: RLJob, configs: WorkerConfigs, output: Path) -> int:
    """Run the job; a dead trainer group starts again from the last checkpoint, spec.trainer.maxRestarts times."""
    from rljob_workers.driver.local_run import EXIT_TRAINER_LOST, LocalRun

    budget = configs.controller.max_restarts["trainer"]
    from rljob_workers.driver.supervisor import RestartHistory

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
