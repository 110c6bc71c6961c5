"""DAPO's dynamic sampling in the controller, on the in-process fakes of test_controller_dispatch (exact
and fast; tests/test_algorithm_runs.py runs it for real): a group whose rewards are all equal is dropped
as it completes, counted, its prompt done; another group takes its place within the staleness window;
every step trains promptsPerStep groups with something to learn; a step that cannot find them fails,
naming the field, and keeps what was learned in a checkpoint."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_controller_dispatch import FakeRollout, FakeTrainer, Log

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import sample_pb2
from rljob_api import AlgorithmSpec, parse_rljob, resolve_algorithm
from rljob_api.algorithm import Algorithm
from rljob_api.workercfg import derive_worker_configs
from rljob_operator.status.compute import compute_status
from rljob_operator.status.observe import Observed
from rljob_workers.driver.controller.batch import informative, train_batch
from rljob_workers.driver.controller.data import Prompt, PromptSource, Row
from rljob_workers.driver.controller.groups import Group, Sample
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.controller.report import Counts, NothingToLearn, StepReport
from rljob_workers.driver.telemetry.ledger import read_ledger
from rljob_workers.driver.telemetry.metrics import RunMetrics

from conftest import REPO

NOW = datetime(2026, 1, 2, tzinfo=timezone.utc)


@dataclass
class RowScorer:
    """A prompt "q<row>" for which `flat(row)` holds earns 1 for every sample (nothing to learn); any other
    earns 1 for odd sample indices and 0 for even ones (half right: a group to learn from)."""

    flat: Callable[[int], bool]

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        row = int(sample.prompt.removeprefix("q"))
        reward = 1.0 if self.flat(row) else float(int(sample.completion) % 2)  # the fake's completion: its index
        return sample_pb2.SampleScore(sample_id=sample.sample_id, score=reward)

    async def score_many(self, samples: list[sample_pb2.RewardSample]) -> list[sample_pb2.SampleScore]:
        return [await self.score(sample) for sample in samples]


@dataclass
class Run:
    controller: Controller
    reports: list[StepReport]
    outstanding: list[int]  # groups outstanding (in flight, ready or in training) at each dispatch


@dataclass
class SlowCheckpoints(FakeTrainer):
    """Writes a checkpoint as long as the rollout takes to finish several groups."""

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        await asyncio.sleep(0.1)
        return f"ckpt-{step}"


def dynamic_run(
    flat: Callable[[int], bool], steps: int, per_step: int = 3, n: int = 4, slow: bool = False, **algorithm: Any
) -> Run:
    """A run on the fakes; `slow`: with a slow checkpoint after every step, and each version delivered in the
    background, as the weight service does."""
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["algorithm"].update(
        name="dapo", groupSize=n, promptsPerStep=per_step, totalSteps=steps, overlong={"penalty": 0.0}, **algorithm
    )
    if slow:
        doc["spec"]["checkpoint"]["everySteps"] = 1
    config = derive_worker_configs(parse_rljob(doc)).controller
    log, version = Log(), [0]
    reports: list[StepReport] = []
    outstanding: list[int] = []

    async def sync_weights(new_version: int) -> Awaitable[None] | None:
        if not slow:
            version[0] = new_version
            return None

        async def deliver() -> None:
            await asyncio.sleep(0.005)
            version[0] = new_version

        return asyncio.ensure_future(deliver())

    rollout = FakeRollout(log, version)
    controller = Controller(
        config=config,
        prompts=PromptSource([Row(f"q{i}", {"answer": "1"}) for i in range(200)], seed=0, shuffle=False),
        rollout=rollout,  # type: ignore[arg-type]
        scorer=RowScorer(flat),
        trainer=SlowCheckpoints(log) if slow else FakeTrainer(log),
        sync_weights=sync_weights,
        on_step=reports.append,
    )
    generate = rollout.generate

    def counted(*args: Any, **kwargs: Any) -> AsyncIterator[list[sample_pb2.Completion]]:
        outstanding.append(controller.tracker.outstanding + controller._in_training)
        return generate(*args, **kwargs)

    rollout.generate = counted  # type: ignore[method-assign]
    return Run(controller, reports, outstanding)


def row(prompt_id: str) -> int:
    return int(prompt_id.rsplit("-", 1)[1])


def test_all_equal_groups_are_dropped_counted_and_replaced_within_the_staleness_window() -> None:
    # Two prompts of three earn 1 on every sample: each step drops about two groups per group it trains.
    run = dynamic_run(lambda r: r % 3 != 0, steps=4, maxStaleness=1)
    asyncio.run(asyncio.wait_for(run.controller.run(), 30))
    trained = [p for r in run.reports for p in r.prompt_ids]
    filtered = [p for r in run.reports for p in r.filtered_prompt_ids]
    assert [len(r.prompt_ids) for r in run.reports] == [3, 3, 3, 3]
    assert all(row(p) % 3 == 0 for p in trained) and all(row(p) % 3 for p in filtered)
    assert all(mean == 0.5 for r in run.reports for mean in r.group_reward_means), "every trained group informative"
    assert all(mean == 1.0 for r in run.reports for mean in r.filtered_reward_means)
    assert len(set(trained + filtered)) == len(trained) + len(filtered), "no prompt used twice"
    assert len(filtered) >= 6  # rows 1, 2, 4, 5, 7, 8 came before row 9, the fourth trained
    counts = run.controller.counts
    assert (counts.filtered_groups, counts.filtered) == (len(filtered), 4 * len(filtered))
    assert counts.trained == 4 * 3 * 4 and counts.discarded_stale == 0
    prompts = run.controller.prompts
    assert not set(trained + filtered) & set(prompts.pending), "trained or filtered: done"
    # Nothing lost: every prompt handed out was trained, filtered, or is still pending (in flight at the end).
    assert sorted(row(p) for p in [*trained, *filtered, *prompts.pending]) == list(range(prompts.cursor))
    # The refills stay inside the window: (maxStaleness + 1) * promptsPerStep groups outstanding at most.
    assert max(run.outstanding) <= 2 * 3
    assert max(r.staleness_max for r in run.reports) <= 1
    # The step's reward covers the dropped groups too: the policy's reward on what it was given.
    first = run.reports[0]
    rewards = [0.5] * 3 + [1.0] * len(first.filtered_prompt_ids)
    assert first.reward_mean == pytest.approx(sum(rewards) / len(rewards))


def test_a_step_is_charged_only_the_groups_dropped_before_its_own() -> None:
    # One prompt in four can be learned from: a step's own three groups come with about nine dropped ones. While
    # a step's checkpoint is written, its version is out: the rollout finds two steps' groups (maxStaleness 1),
    # dropping both steps' share. Charging a step every group dropped since the last step charged it both.
    run = dynamic_run(lambda r: r % 4 != 0, steps=8, slow=True, maxStaleness=1, dynamicSampling={"maxExtraGroups": 14})
    asyncio.run(asyncio.wait_for(run.controller.run(), 30))
    drops = [len(r.filtered_prompt_ids) for r in run.reports]
    # Here each step's own share is 9 or 10; charged the next step's too, a step was charged 16 or 17.
    assert len(run.reports) == 8 and max(drops) <= 14, drops
    assert sum(drops) == run.controller.counts.filtered_groups
    prompts = run.controller.prompts
    trained = [p for r in run.reports for p in r.prompt_ids]
    filtered = [p for r in run.reports for p in r.filtered_prompt_ids]
    assert len(set(trained + filtered)) == len(trained) + len(filtered), "no prompt used twice"
    # Nothing lost: every prompt handed out was trained, filtered, or is still pending (in flight at the end).
    assert sorted(row(p) for p in [*trained, *filtered, *prompts.pending]) == list(range(prompts.cursor))


def test_on_policy_refills_wait_for_nothing_and_stay_on_policy() -> None:
    run = dynamic_run(lambda r: r % 2 == 1, steps=3, maxStaleness=0)
    asyncio.run(asyncio.wait_for(run.controller.run(), 30))
    assert [len(r.prompt_ids) for r in run.reports] == [3, 3, 3]
    assert max(run.outstanding) <= 3 and max(r.staleness_max for r in run.reports) == 0
    assert run.controller.counts.filtered_groups >= 6


def test_a_step_that_finds_nothing_to_learn_fails_naming_the_field_and_keeps_a_checkpoint() -> None:
    # The first six prompts can be learned from (two steps of three); every prompt after them cannot.
    run = dynamic_run(lambda r: r >= 6, steps=10, dynamicSampling={"maxExtraGroups": 5})
    with pytest.raises(NothingToLearn) as failure:
        asyncio.run(asyncio.wait_for(run.controller.run(), 30))
    message = str(failure.value)
    found = re.match(r"spec\.algorithm\.dynamicSampling\.maxExtraGroups: step 3 dropped (\d+) prompt groups", message)
    assert found and int(found[1]) > 5, message
    assert "(all 1), more than maxExtraGroups 5" in message and "nothing left to teach this policy" in message
    assert len(run.reports) == 2
    assert run.controller.last_checkpoint == "ckpt-2", "the two steps learned are kept"


def test_the_run_metrics_count_filtered_groups_and_show_the_truncated_share() -> None:
    metrics = RunMetrics("job")
    report = StepReport(
        step=1,
        version=1,
        reward_mean=0.5,
        reward_std=0.5,
        staleness_mean=0.0,
        staleness_max=0,
        samples=8,
        prompt_ids=["e0-1"],
        train_metrics={},
        step_seconds=0.1,
        wait_seconds=0.0,
        elapsed_seconds=1.0,
        counts=Counts(filtered=24, filtered_groups=3, masked_truncated=2),
        truncated_fraction=0.25,
    )
    metrics.update(report)
    value = metrics.registry.get_sample_value
    assert value("rljob_filtered_groups_total", {"job_name": "job"}) == 3
    assert value("rljob_samples_total", {"job_name": "job", "outcome": "filtered"}) == 24
    assert value("rljob_samples_total", {"job_name": "job", "outcome": "masked_truncated"}) == 2
    assert value("rljob_truncated_fraction", {"job_name": "job"}) == 0.25


def test_the_ledger_counts_filtered_prompts_and_finds_one_used_twice(tmp_path: Path) -> None:
    counts = {"generated": 24, "scored": 24, "trained": 8, "discarded_stale": 0, "excluded_reward_error": 0}
    rows: list[dict[str, Any]] = [
        {"prompt_ids": ["a"], "filtered_prompt_ids": ["x", "y"], "counts": dict(counts, filtered=16)},
        {"prompt_ids": ["b"], "filtered_prompt_ids": [], "counts": dict(counts, generated=32, scored=32, trained=16)},
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    books = read_ledger(metrics, 2, 1)
    assert books.clean and books.filtered == 2
    # x filtered again and trained too; the filtered samples counted beyond what was scored
    rows[1].update(prompt_ids=["x"], filtered_prompt_ids=["x"])
    rows[1]["counts"]["filtered"] = 24
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    books = read_ledger(metrics, 2, 1)
    assert (books.filtered_twice, books.scored_twice, books.clean) == (2, 8, False)


def test_the_rljob_status_shows_the_groups_filtered_when_dynamic_sampling_is_on(example_doc: dict) -> None:
    snapshot = control_pb.JobStatus(
        phase=control_pb.RUN_PHASE_RUNNING, step=3, samples=control_pb.SampleCounts(filtered_groups=7)
    )
    for name, shown in (("dapo", 7), ("grpo", None)):
        example_doc["spec"]["algorithm"]["name"] = name
        status = compute_status(parse_rljob(example_doc), Observed(ray_cluster=True), snapshot, now=NOW)
        assert status.filtered_groups == shown
        assert ("filteredGroups" in status.to_wire()) == (shown is not None)


# --- the step's batch: overlong shaping, truncated samples, which groups have something to learn -------


def group_of(rewards: list[float], lengths: list[int], truncated: list[bool]) -> Group:
    group = Group(Prompt("e0-1", "1+1=", {}), n=len(rewards))
    for index, (reward, length, cut) in enumerate(zip(rewards, lengths, truncated, strict=True)):
        sample = Sample(f"e0-1/{index}", "e0-1", index, [1], [5] * length, [-0.1] * length, 0, "", truncated=cut)
        group.add(sample)
        group.set_reward(index, reward, {})
    return group


def dapo(max_new_tokens: int = 6, **overlong: Any) -> Algorithm:
    spec = AlgorithmSpec.model_validate({"name": "dapo", "overlong": {"bufferTokens": 2, **overlong}})
    return resolve_algorithm(spec, max_new_tokens)


def test_overlong_shaping_then_group_advantages_and_truncated_samples_left_out() -> None:
    # maxNewTokens 6, bufferTokens 2, penalty 1: lengths 2, 5, 6, 6 lose 0, 0.5, 1, 1 (DAPO's eq. 13).
    # Shaped rewards 1, 0.5, -1, 0: mean 0.125, population std sqrt(2.1875 / 4) = 0.7395100.
    group = group_of([1.0, 1.0, 0.0, 1.0], [2, 5, 6, 6], [False, False, True, False])
    batch = train_batch([group], version=0, algorithm=dapo(maskTruncated=True), max_new_tokens=6)
    std = (2.1875 / 4) ** 0.5 + 1e-6  # GRPO's (r - mean) / (std + eps)
    # The truncated sample (index 2) counts in the group's mean and std, but is not trained.
    assert [s.advantage for s in batch.samples] == pytest.approx([0.875 / std, 0.375 / std, -0.125 / std])
    assert (batch.truncated, batch.masked, len(batch.lags)) == (1, 1, 3)
    assert batch.rewards == [1.0, 1.0, 0.0, 1.0]  # the reward functions' scores, as reported
    kept = train_batch([group], version=0, algorithm=dapo(), max_new_tokens=6)
    assert len(kept.samples) == 4 and kept.masked == 0 and kept.truncated == 1


def test_an_all_correct_group_with_overlong_answers_still_has_something_to_learn() -> None:
    # Raw rewards all 1, but one answer ran into the buffer: shaped 1 and 0.5 differ, so DAPO keeps the group.
    group = group_of([1.0, 1.0], [2, 5], [False, False])
    assert informative(group, dapo(), 6)
    assert not informative(group, dapo(penalty=0.0), 6)
    assert not informative(group_of([0.0, 0.0, 0.0], [1, 2, 3], [False] * 3), dapo(), 6)
    assert not informative(group_of([1.0], [6], [True]), dapo(penalty=0.0), 6)  # a group of one: nothing to compare
