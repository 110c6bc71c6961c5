"""`rljob run`: a whole RLJob, from its plan to its exit code. Set-up first (the checks, the folder locks, the
token, the trackers, Ray), every failure of it one line and exit code 2 before any pool starts; then the run
session, started again from the last checkpoint when its trainer group dies (spec.trainer.maxRestarts).

Locally the checks that load the model folders run in a thread while this one starts the local Ray node;
in a KubeRay driver pod (`--cluster`) the session joins the cluster's Ray instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from rljob_api import RLJobInvalid
from rljob_api.spec import clear_text_tokens
from rljob_workers.driver.errors import SetupError, StoppedBeforePoolsUp
from rljob_workers.driver.run.environment_check import check_environment
from rljob_workers.driver.run.gpu_fit import check_colocate_fits, require_gpu_to_colocate, require_gpus_here
from rljob_workers.driver.run.plan import RunPlan
from rljob_workers.driver.run.preflight import check_models, check_quickly, prepare
from rljob_workers.driver.run.rundir import FolderLock, job_token, lock_run_folders, refuse_start_over
from rljob_workers.driver.run.stopping import stop_before_the_pools_are_up
from rljob_workers.driver.telemetry.trackers import TrackerError, Trackers, check_startable, open_trackers

log = logging.getLogger("rljob")


def local_ray_environment() -> None:
    """Keep a local Ray cluster on 127.0.0.1 (by default Ray advertises the machine's outward IP),
    with token authentication.

    Read by Ray when it is first imported, so this runs before anything imports ray."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Token authentication, Ray's default for a local cluster, asked for by name: left to its default,
    # every ray.init prints a warning saying so.
    os.environ.setdefault("RAY_AUTH_MODE", "token")


def run_command(plan: RunPlan) -> int:
    """Run the plan's job to its end; the process's exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    locks: list[FolderLock] = []  # held across trainer restarts
    try:
        with stop_before_the_pools_are_up():
            return _set_up_and_run(plan, locks)
    except StoppedBeforePoolsUp as stopped:
        _stop_ray()
        print(f"{stopped.signal.name} before the pools were up: stopping at once", file=sys.stderr)
        return 128 + int(stopped.signal)
    finally:
        for lock in locks:
            lock.release()


def _set_up_and_run(plan: RunPlan, locks: list[FolderLock]) -> int:
    """Set up, then run; the folder locks taken go into `locks` (released by the caller)."""
    for warning in clear_text_tokens(plan.job):
        log.warning("%s", warning.removeprefix("warning: "))
    try:
        plan, trackers = _set_up_cluster(plan, locks) if plan.cluster else _set_up_locally(plan, locks)
    except (RLJobInvalid, SetupError, TrackerError) as exc:
        print(exc, file=sys.stderr)
        _stop_ray()
        return 2
    rc = 1  # what the trackers are told if the run ends by an exception
    try:
        rc = run_with_restarts(plan, trackers)
        return rc
    finally:
        trackers.close(rc)


def _set_up_cluster(plan: RunPlan, locks: list[FolderLock]) -> tuple[RunPlan, Trackers]:
    check_colocate_fits(plan.job, cluster=True)
    plan = replace(plan, environment=prepare(plan))
    locks += lock_run_folders(plan.output, plan.checkpoints)
    plan = replace(plan, token=job_token(plan.output, cluster=True))
    check_startable(plan.job, plan.output)
    return plan, open_trackers(plan.job, plan.output)


def _set_up_locally(plan: RunPlan, locks: list[FolderLock]) -> tuple[RunPlan, Trackers]:
    local_ray_environment()
    check_quickly(plan)
    plan = replace(plan, environment=check_environment(plan.job))
    require_gpu_to_colocate(plan.job)  # imports torch, so only for a colocated job
    require_gpus_here(plan.job)  # imports torch only for a job that asks for GPUs
    checkpoints = plan.checkpoints
    locks += lock_run_folders(plan.output, checkpoints)
    refuse_start_over(checkpoints, plan.resume)  # refuses to start over checkpoints before Ray starts
    check_startable(plan.job, plan.output)  # the trackers' folders and tracking URI, before Ray starts too
    plan = replace(plan, token=job_token(plan.output, cluster=False))
    return plan, check_models_while_ray_starts(plan)


def check_models_while_ray_starts(plan: RunPlan) -> Trackers:
    """The last set-up check, that the model folders load, in a thread while this thread starts the local Ray
    node, with the import of the run session and the trackers' start: each takes CPU-seconds, Ray's start is
    mostly waiting on its processes. Returns the started trackers.

    Ray starts here, not in the thread, because its processes die with the thread that started them
    (PR_SET_PDEATHSIG). A model check's error wins over Ray's: it is the one the user can act on."""
    from rljob_workers.driver.placement.launcher import local_worker_env
    from rljob_workers.driver.placement.ray_node import init_local_ray

    assert plan.token is not None
    with ThreadPoolExecutor(1, thread_name_prefix="rljob-setup") as setup:
        checked = setup.submit(_check_models_and_start_trackers, plan)
        try:
            init_local_ray(plan.configs, plan.pool_cpus, local_worker_env(plan.configs, plan.output, plan.token.path))
        except Exception:
            checked.result().close(1)  # a failed check is the error to show
            raise
        return checked.result()


def _check_models_and_start_trackers(plan: RunPlan) -> Trackers:
    check_models(plan.job, without_torch=True)
    import rljob_workers.driver.run.session  # noqa: F401  the controller, while Ray still starts

    return open_trackers(plan.job, plan.output)  # wandb's and mlflow's imports take seconds


def _stop_ray() -> None:
    """Stop a Ray node this process started (none on a cluster, or before the checks passed)."""
    if "ray" in sys.modules:
        from rljob_workers.driver.placement.ray_node import shutdown_ray

        shutdown_ray()


def run_with_restarts(plan: RunPlan, trackers: Trackers) -> int:
    """Run the job; a dead trainer group starts again from the last checkpoint, spec.trainer.maxRestarts times.
    The trackers record every attempt as one run."""
    from rljob_workers.driver.run.session import RunSession
    from rljob_workers.driver.run.supervision import EXIT_TRAINER_LOST, RestartHistory

    budget = plan.configs.controller.max_restarts["trainer"]
    history = RestartHistory()  # one for the whole process: its status lists every replacement
    for restart in range(budget + 1):
        session = RunSession(plan if restart == 0 else plan.resumed(), history=history, trackers=trackers)
        session.lock_folders = False  # held here, across the restarts
        try:
            rc = asyncio.run(session.main())
        except SetupError as exc:
            print(exc, file=sys.stderr)
            return 2
        if rc != EXIT_TRAINER_LOST:
            return rc
        cause = session.trainer_lost_cause()
        history.trainer_lost(cause, session.controller.step if session.controller else 0)
        if restart < budget:
            log.warning("restarting the trainer group from the last checkpoint (%d of %d)", restart + 1, budget)
    print(f"the trainer group died more than spec.trainer.maxRestarts ({budget}) times; see above", file=sys.stderr)
    return 1
