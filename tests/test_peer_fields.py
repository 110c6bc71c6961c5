"""A verl or TRL user's setting names in an RLJob: `rljob validate` refuses each in one line naming the field,
and says which RLJob field the peer's setting is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO

RLJOB = str(Path(sys.executable).parent / "rljob")


@pytest.mark.parametrize(
    ("where", "key", "field", "peer"),
    [
        ("rollout", "n", "spec.algorithm.groupSize", "verl's actor_rollout_ref.rollout.n"),
        ("algorithm", "num_generations", "spec.algorithm.groupSize", "TRL's num_generations"),
        ("algorithm", "kl_loss_coef", "spec.algorithm.klCoef", "verl's actor.kl_loss_coef"),
        ("rollout", "max_completion_length", "spec.rollout.sampling.maxNewTokens", "TRL's max_completion_length"),
        ("algorithm", "ppo_epochs", "spec.algorithm.updateEpochs", "verl's actor.ppo_epochs"),
        ("algorithm", "warmup_steps", "spec.algorithm.schedule.warmupSteps", "TRL's warmup_steps"),
    ],
)
def test_a_peers_setting_name_is_refused_with_the_rljob_field(
    tmp_path: Path, where: str, key: str, field: str, peer: str
) -> None:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"][where][key] = 8
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([RLJOB, "validate", str(job)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    [line] = [line for line in done.stderr.splitlines() if f"spec.{where}.{key}" in line]
    assert (
        line.strip()
        == f"spec.{where}.{key}: unknown field (check its spelling and indentation); {peer} is {field} here"
    )


def test_a_misspelled_field_that_no_peer_uses_gets_no_hint(tmp_path: Path) -> None:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["rollout"]["replicaz"] = 2
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([RLJOB, "validate", str(job)], capture_output=True, text=True, timeout=60)
    assert "spec.rollout.replicaz: unknown field (check its spelling and indentation)\n" in done.stderr + "\n"
