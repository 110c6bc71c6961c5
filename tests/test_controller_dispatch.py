"""When the controller sends samples to reward (spec.reward.dispatch), on in-process fakes of the pools.

The fakes stand in for gRPC and Ray only to make the order of events observable and exact:
each records (sequence number, event) in one log, so "scored before its group was generated"
is a comparison of two integers, not of clocks.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from rich.console import Console

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import rollout_service_pb2 as rollout_pb
from rljob.v1 import sample_pb2
from rljob_api import parse_rljob
from rljob_api.workercfg import derive_worker_configs
from rljob_workers.driver.controller.data import PromptSource, Row
from rljob_workers.driver.controller.loop import Controller
from rljob_workers.driver.controller.report import RunFailed, StepReport
from rljob_workers.driver.controller.status import RunView
from rljob_workers.driver.telemetry.display import status_table
from rljob_workers.trainer.samples import TrainSample

from conftest import REPO


@dataclass
class Log:
    counter: itertools.count = field(default_factory=itertools.count)
    generated: dict[str, int] = field(default_factory=dict)  # sample id -> sequence number
    scored: dict[str, int] = field(default_factory=dict)
    trained: list[tuple[int, list[str]]] = field(default_factory=list)  # (sequence number, prompt ids)

    def tick(self) -> int:
        return next(self.counter)


@dataclass
class FakeReplica:
    name: str = "rollout-0"
    in_flight: int = 0


@dataclass
class FakeRollout:
    """Generates a group's samples one by one; later prompts and later indices take longer."""

    log: Log
    version: list[int]
    replica: FakeReplica = field(default_factory=FakeReplica)
    started: int = 0

    def pick(self) -> FakeReplica:
        return self.replica

    def live(self) -> list[FakeReplica]:
        return [self.replica]

    async def generate(
        self, replica: FakeReplica, request: rollout_pb.GenerateRequest, *, reserved: bool = False
    ) -> AsyncIterator[list[sample_pb2.Completion]]:
        version = self.version[0]  # a request is generated under one version
        finished: asyncio.Queue[sample_pb2.Completion] = asyncio.Queue()
        # Each prompt of a call at its own pace, as an engine batching them finishes them apart.
        tasks = [asyncio.create_task(self._one_prompt(prompt, version, finished)) for prompt in request.prompts]
        try:
            for _ in range(sum(prompt.n for prompt in request.prompts)):
                yield [await finished.get()]  # one per message, as a replica that finishes them apart sends them
        finally:
            for task in tasks:
                task.cancel()

    async def _one_prompt(
        self, prompt: rollout_pb.PromptRequest, version: int, finished: asyncio.Queue[sample_pb2.Completion]
    ) -> None:
        self.started += 1
        delay = 0.002 * (self.started % 3 + 1)  # groups finish at different times
        for index in range(prompt.first_index, prompt.first_index + prompt.n):
            await asyncio.sleep(delay)
            sample_id = f"{prompt.prompt_id}/{index}"
            # A stale group is generated again under the same ids: log each generation apart.
            self.log.generated[f"{sample_id}@v{version}"] = self.log.tick()
            finished.put_nowait(
                sample_pb2.Completion(
                    sample_id=sample_id,
                    prompt_id=prompt.prompt_id,
                    index=index,
                    prompt_token_ids=[1, 2],
                    token_ids=[3, index % 5 + 4],
                    logprobs=[-0.5, -0.7],
                    policy_version=version,
                    text=str(index),
                )
            )


@dataclass
class FakeScorer:
    log: Log

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        key = f"{sample.sample_id}@v{sample.policy_version}"
        assert key not in self.log.scored, f"{key} scored twice"
        self.log.scored[key] = self.log.tick()
        await asyncio.sleep(0.001)
        return sample_pb2.SampleScore(sample_id=sample.sample_id, score=float(len(sample.completion)))

    async def score_many(self, samples: list[sample_pb2.RewardSample]) -> list[sample_pb2.SampleScore]:
        return list(await asyncio.gather(*(self.score(sample) for sample in samples)))


@dataclass
class FakeTrainer:
    log: Log

    async def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        await asyncio.sleep(0.003)
        return {"loss": 0.0}

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        return f"ckpt-{step}"


def make_controller(
    log: Log, dispatch: str, max_staleness: int, steps: int, per_step: int, n: int, scorer: Any = None, **reward: Any
) -> Controller:
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["algorithm"].update(groupSize=n, promptsPerStep=per_step, totalSteps=steps, maxStaleness=max_staleness)
    doc["spec"]["reward"].update(dispatch=dispatch, **reward)
    config = derive_worker_configs(parse_rljob(doc)).controller
    version = [0]

    async def sync_weights(new_version: int) -> None:
        version[0] = new_version

    def on_step(report: Any) -> None:
        log.trained.append((log.tick(), report.prompt_ids))

    return Controller(
        config=config,
        prompts=PromptSource([Row(f"q{i}", {"answer": "1"}) for i in range(40)], seed=0),
        rollout=FakeRollout(log, version),  # type: ignore[arg-type]
        scorer=scorer or FakeScorer(log),
        trainer=FakeTrainer(log),
        sync_weights=sync_weights,
        on_step=on_step,
    )


def run_controller(dispatch: str, max_staleness: int, steps: int = 4, per_step: int = 3, n: int = 4) -> Log:
    log = Log()
    controller = make_controller(log, dispatch, max_staleness, steps, per_step, n)
    asyncio.run(asyncio.wait_for(controller.run(), 30))
    trained = [p for _, prompts in log.trained for p in prompts]
    assert len(trained) == len(set(trained)) == steps * per_step, "each prompt is trained exactly once"
    assert controller.counts.trained == steps * per_step * n
    assert controller.counts.scored >= controller.counts.trained
    # Groups finish out of order here; the oldest are still trained in time, none is thrown away.
    assert controller.counts.discarded_stale == 0
    assert set(log.scored) <= set(log.generated), "only generated samples are scored"
    return log


def group_of(key: str) -> str:
    """The generation of a group a log key belongs to: "<prompt_id>@v<version>"."""
    sample_id, version = key.split("@")
    return f"{sample_id.split('/')[0]}@{version}"


def last_generated(log: Log, groups: set[str]) -> int:
    return max(seq for key, seq in log.generated.items() if group_of(key) in groups)


def trained_groups(log: Log, prompt_ids: list[str]) -> set[str]:
    """The generations a step trained on: the newest generation of each of its prompts."""
    newest: dict[str, str] = {}
    for key in log.generated:  # in generation order
        group = group_of(key)
        newest[group.split("@")[0]] = group
    return {newest[p] for p in prompt_ids}


def test_sample_dispatch_scores_while_the_group_is_still_generating():
    log = run_controller("sample", max_staleness=1)
    early = [key for key, seq in log.scored.items() if seq < last_generated(log, {group_of(key)})]
    assert early, "streaming dispatch never scored a sample before its group was complete"


def test_group_dispatch_waits_for_the_whole_group_only():
    log = run_controller("group", max_staleness=1)
    for key, seq in log.scored.items():
        assert seq > last_generated(log, {group_of(key)}), f"{key} scored before its group was generated"
    # ...but not for the rest of the batch: a group is scored while another of its step is still generating.
    first_step = trained_groups(log, log.trained[0][1])
    assert min(log.scored[k] for k in log.scored if group_of(k) in first_step) < last_generated(log, first_step)


def test_batch_dispatch_with_max_staleness_0_is_generate_then_score_then_train():
    log = run_controller("batch", max_staleness=0)
    previous_train = -1
    for train_seq, prompt_ids in log.trained:
        batch = trained_groups(log, prompt_ids)
        generated = [seq for key, seq in log.generated.items() if group_of(key) in batch]
        scored = [seq for key, seq in log.scored.items() if group_of(key) in batch]
        assert previous_train < min(generated), "generation starts after the previous step trained"
        assert max(generated) < min(scored), f"{sorted(batch)} was scored before all of it was generated"
        assert max(scored) < train_seq
        previous_train = train_seq


def test_batch_dispatch_releases_whole_batches_when_pipelined():
    """With maxStaleness 1 generation never pauses, so samples go out promptsPerStep groups at a time."""
    per_step = 3
    log = run_controller("batch", max_staleness=1, per_step=per_step)
    order = sorted(log.scored.items(), key=lambda item: item[1])
    released: list[set[str]] = []  # groups sent to reward between two generation events
    last_seen = -1
    for key, seq in order:
        generated_since = any(last_seen < g < seq for g in log.generated.values())
        if not released or generated_since:
            released.append(set())
        released[-1].add(group_of(key))
        last_seen = seq
    assert all(len(groups) >= per_step for groups in released[:-1]), released


@dataclass
class DownForAWhile(FakeScorer):
    """An endpoint that is down (a TRANSIENT error, as an open breaker answers) for its first `down` calls."""

    down: int = 30
    calls: int = 0

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        self.calls += 1
        if self.calls <= self.down:
            error = sample_pb2.ScoreError(
                error_class=sample_pb2.ERROR_CLASS_TRANSIENT,
                message=f"remote reward 'judge': sample {sample.sample_id!r} not sent: circuit breaker open",
                function="judge",
            )
            return sample_pb2.SampleScore(sample_id=sample.sample_id, error=error)
        return await super().score(sample)


def run_with_outage(on_error: str) -> tuple[Controller, str | None]:
    log = Log()
    controller = make_controller(log, "sample", 1, 3, 2, 4, DownForAWhile(log), onError=on_error, retries=1)
    try:
        asyncio.run(asyncio.wait_for(controller.run(), 60))
    except RunFailed as failed:
        return controller, str(failed)
    return controller, None


def test_on_error_wait_rides_out_a_dead_endpoint():
    controller, failure = run_with_outage("wait")
    assert failure is None
    counts = controller.counts
    assert counts.trained == 3 * 2 * 4 and counts.excluded_reward_error == 0
    assert counts.reward_retries >= 30, "every failed try was retried, none given up"


def test_samples_waiting_for_reward_show_in_the_status_snapshot():
    log = Log()
    controller = make_controller(log, "sample", 1, 3, 2, 4, DownForAWhile(log), onError="wait", retries=1)
    view = RunView(controller, total_steps=3, pools=dict)
    seen: list[tuple[int, str]] = []
    waiting_status: list[control_pb.JobStatus] = []

    async def run_and_watch() -> None:
        run = asyncio.create_task(controller.run())
        while not run.done():
            status = view.snapshot()
            seen.append((status.samples.waiting_for_reward, status.reward_wait_reason))
            if status.samples.waiting_for_reward:
                waiting_status[:] = [status]
            await asyncio.sleep(0.005)
        await run

    asyncio.run(asyncio.wait_for(run_and_watch(), 60))
    waiting = [reason for count, reason in seen if count > 0]
    assert waiting, "the outage never showed in the status"
    assert all("circuit breaker open" in reason for reason in waiting)
    final = view.snapshot()
    assert (final.samples.waiting_for_reward, final.reward_wait_reason) == (0, "")
    assert final.samples.reward_retries == controller.counts.reward_retries >= 30
    # `rljob run`'s live table shows the wait and its reason.
    console = Console(record=True, width=200)
    console.print(status_table("job", waiting_status[-1]))
    assert "sample(s) for reward: remote reward 'judge'" in console.export_text()


def test_on_error_wait_gives_up_after_wait_timeout_seconds():
    log = Log()
    never_back = DownForAWhile(log, down=10**9)
    controller = make_controller(
        log, "sample", 1, 3, 2, 4, never_back, onError="wait", retries=0, waitTimeoutSeconds=0.3
    )
    started = time.monotonic()
    with pytest.raises(RunFailed, match=r"circuit breaker open \(waited \d+\.\ds, over waitTimeoutSeconds 0.3\)"):
        asyncio.run(asyncio.wait_for(controller.run(), 30))
    # Backoff doubles from 50 ms: the limit is noticed at the first retry after it, well within a second.
    assert time.monotonic() - started < 5


def test_on_error_exclude_counts_and_fail_names_the_sample():
    controller, failure = run_with_outage("exclude")
    assert failure is None and controller.counts.excluded_reward_error > 0
    _, failure = run_with_outage("fail")
    assert failure is not None and "circuit breaker open" in failure and "sample 'e0-" in failure


def test_on_error_wait_still_fails_on_a_function_error():
    class Broken(FakeScorer):
        async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
            error = sample_pb2.ScoreError(
                error_class=sample_pb2.ERROR_CLASS_FUNCTION, message=f"sample {sample.sample_id!r}: boom"
            )
            return sample_pb2.SampleScore(sample_id=sample.sample_id, error=error)

    log = Log()
    controller = make_controller(log, "sample", 0, 1, 1, 2, Broken(log), onError="wait", retries=0)
    with pytest.raises(RunFailed, match="boom"):
        asyncio.run(asyncio.wait_for(controller.run(), 30))


@dataclass
class FirstSampleSlowScorer(FakeScorer):
    """Takes `delay` seconds over the first sample it scores."""

    delay: float = 0.2
    slow_prompt: str | None = None

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        if self.slow_prompt is None:
            self.slow_prompt = sample.prompt_id
            await asyncio.sleep(self.delay)
        return await super().score(sample)


def test_step_report_gives_the_slowest_group_latency_of_its_batch():
    log, reports = Log(), list[StepReport]()
    scorer = FirstSampleSlowScorer(log)
    controller = make_controller(log, "sample", 1, steps=4, per_step=3, n=4, scorer=scorer)
    controller.on_step = reports.append
    asyncio.run(asyncio.wait_for(controller.run(), 30))
    [slow_step] = [r for r in reports if scorer.slow_prompt in r.prompt_ids]
    assert slow_step.group_latency_max >= scorer.delay
    others = [r.group_latency_max for r in reports if r is not slow_step]
    assert others and all(0 < latency < scorer.delay for latency in others)


def test_a_run_leaves_its_setup_out_of_the_collectors_scans_and_hands_the_collector_back():
    """What exists when the run starts (imports, configs, clients) lives for the run: frozen, the
    collector's scans skip it (a fifth of the controller's CPU per sample in benchmarks/controller).
    The run unfreezes it when it ends, so a later collection can free it again."""
    log, frozen_during = Log(), list[int]()
    before = gc.get_freeze_count()
    controller = make_controller(log, "sample", 1, steps=3, per_step=2, n=2)
    controller.on_step = lambda report: frozen_during.append(gc.get_freeze_count())
    asyncio.run(asyncio.wait_for(controller.run(), 30))
    assert len(frozen_during) == 3 and min(frozen_during) > before + 1000, (before, frozen_during)
    assert gc.get_freeze_count() == before


@dataclass
class DiesAfterCommit(FakeTrainer):
    """Killed once its checkpoint is on disk, before its answer reaches the driver."""

    committed: list[int] = field(default_factory=list)

    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str:
        self.committed.append(step)
        raise ConnectionError("the trainer actor died")


def test_a_step_whose_checkpoint_is_written_has_its_line_even_if_the_trainer_dies_then():
    # A resume starts after the checkpoint's step and keeps the lines up to it: a line written
    # after the checkpoint would be lost for good when the trainer dies in between.
    log, reports = Log(), list[StepReport]()
    controller = make_controller(log, "sample", 1, steps=2, per_step=2, n=2)
    controller.trainer = trainer = DiesAfterCommit(log)
    controller.on_step = reports.append
    with pytest.raises(ConnectionError):
        asyncio.run(asyncio.wait_for(controller.run(), 30))
    assert trainer.committed == [2]
    assert [r.step for r in reports] == [1, 2]
    assert reports[-1].checkpoint and reports[-1].checkpoint.endswith("step-000002")
