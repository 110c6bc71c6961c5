"""The shipped example learns: GRPO through the whole local system lifts the exact-match reward
of the weak tiny base model (about 0.1) clearly, on a shortened run of examples/arithmetic.yaml."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from rljob_api import parse_rljob
from rljob_workers.driver.local_run import LocalRun
from rljob_workers.driver.setup import prepare
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO
from tiny_models import example_model

pytestmark = pytest.mark.ray


def test_example_reward_rises(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("learn")
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"] = str(example_model(tmp_path_factory))
    spec["data"]["path"] = str(write_jsonl(root / "train.jsonl", make_problems(2048, seed=10_000)))
    spec["checkpoint"]["dir"] = str(root / "ckpt")
    job = parse_rljob(doc)
    run = LocalRun(job, prepare(job, 40), root / "out", resume=False, display=False, metrics_port=0)
    assert asyncio.run(run.main()) == 0
    rewards = [r.reward_mean for r in run.reports]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"mean reward: first 5 steps {first:.3f}, last 5 steps {last:.3f}")
    assert first <= 0.3
    assert last >= first + 0.3, rewards
    assert Path(run.reports[-1].checkpoint or "").is_dir()
