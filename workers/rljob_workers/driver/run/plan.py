"""One run's plan, built once from the command line and handed whole to everything that runs the job: the
job (its local paths made absolute, `--steps` applied), the worker configs derived from it once, where the
run writes, and how it runs. Frozen: set-up checks read it and never change the job; a trainer restart
runs the same plan again, resumed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rljob_api import RLJob, derive_worker_configs, load_rljob
from rljob_api.workercfg import Pool, WorkerConfigs
from rljob_workers.common.auth import JobToken
from rljob_workers.driver.errors import SetupError
from rljob_workers.driver.pools.environment import EnvironmentInfo

RUNS_FOLDER = "rljob-runs"  # the default output is <this>/<job name>, under the current folder


@dataclass(frozen=True)
class RunPlan:
    """Everything one `rljob run` (or `rljob validate --deep`) needs to know before it starts."""

    job: RLJob
    configs: WorkerConfigs
    output: Path
    job_file: Path | None = None
    resume: bool = False
    cluster: bool = False  # drive the Ray cluster of a KubeRay driver pod instead of starting one
    display: bool = True  # the live table (False: plain log lines)
    metrics_port: int = 0  # locally 0 picks a free port; on a cluster the workers' fixed one
    stop_timeout: float = 60.0  # seconds a SIGINT/SIGTERM stop may take (`stopping`)
    rollout_python: str | None = None  # the rollout replicas' interpreter (None: this one)
    token: JobToken | None = None  # the job's, once the run folder is locked (`rundir.job_token`)
    environment: EnvironmentInfo | None = None  # what spec.environment's Info said (`preflight.check_environment`)

    @property
    def checkpoints(self) -> Path:
        """The checkpoint folder (spec.checkpoint.dir, absolute)."""
        return Path(self.job.spec.checkpoint.dir)

    @property
    def pool_cpus(self) -> dict[Pool, float]:
        """The CPUs each replica of each pool asks for (spec.<pool>.cpus)."""
        spec = self.job.spec
        environment = spec.environment.cpus if spec.environment is not None else 0.0
        return {
            "rollout": spec.rollout.cpus,
            "reward": spec.reward.cpus,
            "trainer": spec.trainer.cpus,
            "environment": environment,
        }

    @property
    def serve_host(self) -> str:
        """Where the controller's ControlService and metrics listen: on a cluster the operator and dashboards
        reach them from other pods."""
        return "0.0.0.0" if self.cluster else "127.0.0.1"

    def resumed(self) -> RunPlan:
        """The same plan, continuing from its newest checkpoint (a restarted trainer group)."""
        return replace(self, resume=True)


def load_job_file(path: Path) -> RLJob:
    """The RLJob in `path`; a file that cannot be read is one line naming it (RLJobInvalid for a bad spec)."""
    try:
        return load_rljob(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SetupError(f"{path}: {reason}") from None


def resolved_job(job: RLJob, steps: int | None = None) -> RLJob:
    """A copy of `job` with its local paths made absolute and `steps` (--steps) as algorithm.totalSteps."""
    if steps is not None and steps < 1:
        raise SetupError(f"--steps: {steps} is not a number of steps (at least 1)")
    job = job.model_copy(deep=True)
    spec = job.spec
    if steps is not None:
        spec.algorithm.total_steps = steps
    spec.model.path = str(Path(spec.model.path).resolve())
    spec.data.path = str(Path(spec.data.path).resolve())
    if spec.data.eval is not None:
        spec.data.eval.path = str(Path(spec.data.eval.path).resolve())
    spec.checkpoint.dir = str(Path(spec.checkpoint.dir).resolve())
    remote = spec.environment.remote if spec.environment is not None else None
    if remote is not None:
        for name in ("ca_file", "token_file"):
            if getattr(remote, name):
                setattr(remote, name, str(Path(getattr(remote, name)).resolve()))
    return job


def plan_job(
    job: RLJob,
    *,
    output: Path | None = None,
    steps: int | None = None,
    job_file: Path | None = None,
    resume: bool = False,
    cluster: bool = False,
    display: bool = True,
    metrics_port: int = 0,
    stop_timeout: float = 60.0,
    rollout_python: str | None = None,
) -> RunPlan:
    """The plan of running `job`; its worker configs are derived here, once."""
    job = resolved_job(job, steps)
    configs = derive_worker_configs(job)
    return RunPlan(
        job=job,
        configs=configs,
        output=Path(output or Path(RUNS_FOLDER) / job.metadata.name).resolve(),
        job_file=job_file,
        resume=resume,
        cluster=cluster,
        display=display,
        metrics_port=metrics_port or (configs.ports.metrics if cluster else 0),
        stop_timeout=stop_timeout,
        rollout_python=None if cluster else rollout_python,
    )
