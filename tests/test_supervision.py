"""Pool supervision on a real local Ray: past spec.<pool>.maxRestarts the run fails naming the replica.
A replica killed and replaced, and a killed trainer restarting from the last checkpoint, are
test_faults_bench's: the shipped example's run survives all three with its ledger clean.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray
from test_local_run import job_doc, run_job

from rljob_workers.driver.controller.report import StepReport
from rljob_workers.driver.run.session import RunSession

pytestmark = pytest.mark.ray

RUN_SECONDS = 240  # a run that hangs fails here instead of holding the suite


def _kill_at(step: int, pool: str) -> tuple[Any, list[int]]:
    killed: list[int] = []

    def hook(run: RunSession, report: StepReport) -> None:
        actors = run.pools.rollout if pool == "rollout" else run.pools.reward
        if not killed and report.step >= step and f"{pool}-0" in actors.actors:
            ray.kill(actors.actors[f"{pool}-0"])  # the process dies; the driver's books are not told
            killed.append(report.step)

    return hook, killed


@pytest.mark.timeout(RUN_SECONDS)
def test_past_max_restarts_the_run_fails_naming_the_replica(assets, tmp_path):
    doc = job_doc(assets, tmp_path, maxStaleness=1, totalSteps=40)
    doc["spec"]["reward"].update(replicas={"min": 1, "max": 1}, maxRestarts=0)
    hook, _ = _kill_at(2, "reward")
    rc, run = run_job(doc, tmp_path, hook)
    assert rc == 1
    assert run.view is not None
    assert "reward replica reward-0 died" in run.view.message
    assert "spec.reward.maxRestarts 0" in run.view.message
