"""The RL loop: dispatch prompts to rollout, stream each sample to reward, train on fresh groups.

Three kinds of asyncio tasks share one `asyncio.Condition`:
- the dispatcher starts a Generate stream per prompt group while staleness allows;
- one task per sample scores it: as soon as its generation finishes (reward dispatch `sample`),
  once its whole group is generated (`group`), or once the batch being generated is (`batch`);
- the train loop takes `promptsPerStep` complete groups, drops (and regenerates) groups
  older than `maxStaleness`, trains, publishes the new version and checkpoints.
Under dynamic sampling (DAPO) a group whose rewards are all equal is dropped as it completes, and its
place in the staleness window is free at once for another group.
Every sample is counted on its way: generated, scored, trained, discarded as stale,
excluded after a reward error, regenerated after a replica was lost, dropped by dynamic sampling,
left out of the loss as truncated, or set aside with its prompt (too long, failed by the engine).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rljob.v1 import sample_pb2
from rljob_api.algorithm import Algorithm
from rljob_api.workercfg import ControllerConfig
from rljob_workers.driver.controller.batch import informative, nothing_to_learn, train_batch
from rljob_workers.driver.controller.data import Prompt, PromptSource
from rljob_workers.driver.controller.episodes import EpisodeExcluded, EpisodeFatal, EpisodeRunner
from rljob_workers.driver.controller.evaluation import Evaluation
from rljob_workers.driver.controller.groups import Group, GroupTracker, Sample, dispatch_allowed, staleness
from rljob_workers.driver.controller.messages import contiguous_runs, generate_request, received_sample
from rljob_workers.driver.controller.protocols import Scorer, Trainer
from rljob_workers.driver.controller.report import Counts, NothingToLearn, RunFailed, StepReport
from rljob_workers.driver.controller.scoring import RewardScoring
from rljob_workers.driver.controller.set_aside import PromptGuard, PromptLimit, SetAside
from rljob_workers.driver.controller.step_report import step_report
from rljob_workers.driver.pools.busy import BusyClock
from rljob_workers.driver.pools.rollout import Replica, ReplicaLost, RolloutClients
from rljob_workers.trainer.checkpoint import step_dir

log = logging.getLogger(__name__)


@dataclass
class Controller:
    config: ControllerConfig
    prompts: PromptSource
    rollout: RolloutClients
    scorer: Scorer
    trainer: Trainer
    # Publishes a version to the rollout pool; what it returns, if awaitable, is the delivery still
    # under way (WeightSync.overlapped), which the next train step may overlap.
    sync_weights: Callable[[int], Awaitable[Any]]
    on_step: Callable[[StepReport], None] = lambda report: None
    evaluation: Evaluation | None = None  # the held-out eval (spec.data.eval)
    episodes: EpisodeRunner | None = None  # spec.environment: each sample is an episode it plays
    set_aside: SetAside | None = None  # where prompts too long or failed by the engine go (failed.jsonl)
    prompt_limit: PromptLimit | None = None  # data.maxPromptTokens
    step: int = 0
    version: int = 0
    counts: Counts = field(default_factory=Counts)
    tracker: GroupTracker = field(default_factory=GroupTracker)
    last_checkpoint: str | None = None
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _failure: str | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _started: float = field(default_factory=time.monotonic)
    _trained_groups: int = 0
    _in_training: int = 0
    trainer_busy: BusyClock = field(default_factory=BusyClock)  # a train step or its weight sync is running
    _held: dict[str, list[Sample]] = field(default_factory=dict)  # generated, not yet sent to reward
    _release: asyncio.Task[None] | None = None  # the last step's groups, released once its version is out
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        parts = (self.config, self.prompts, self.tracker, self.counts, self.fail)
        self.guard = PromptGuard(*parts, self.set_aside, self.prompt_limit)  # poison input: set aside, not fatal
        self.scoring = RewardScoring(self.config, self.scorer, self.counts, self.tracker, self._changed, self.fail)
        if self.algo.dynamic_sampling.enabled:  # DAPO: a group with nothing to learn frees its place at once
            budget = self.config.sampling.max_new_tokens
            self.tracker.informative = lambda group: informative(group, self.algo, budget)
        halted = lambda: self._failure is not None or self.stop.is_set()  # noqa: E731
        if self.evaluation is not None:  # a round waiting for a rollout replica gives up when the run ends
            self.evaluation.halted = halted
        if self.episodes is not None:
            self.episodes.halted = halted

    @property
    def algo(self) -> Algorithm:
        return self.config.algorithm

    # ---- the train loop -------------------------------------------------------------
    async def run(self) -> None:
        """Train until totalSteps; raises RunFailed if a sample's reward fails under onError: fail."""
        self._started = time.monotonic()
        # What exists now (imports, configs, clients) lives for the run: frozen, it is left out of the
        # collector's scans, which would otherwise walk it again and again (benchmarks/controller).
        gc.collect()
        gc.freeze()
        dispatcher = asyncio.create_task(self._dispatch_loop())
        stop_watch = asyncio.create_task(self._wake_on_stop())
        try:
            if self.evaluation is not None and self.step == 0:  # the policy before its first update
                await self.evaluation.at_step(0, self.algo.total_steps, None, self.wake)
            while self.step < self.algo.total_steps and not self.stop.is_set():
                await self._train_one_step()
            if self._release is not None and not self.stop.is_set():
                await self._release  # the last version is out when the run ends
            self._raise_if_failed()
            if self.stop.is_set() and not self._checkpointed_now():
                self.last_checkpoint = await self.trainer.save_checkpoint(self.step, self.version, self.state())
        except NothingToLearn:
            if self.step and not self._checkpointed_now():  # the pools are fine: keep what was learned
                self.last_checkpoint = await self.trainer.save_checkpoint(self.step, self.version, self.state())
            raise
        finally:
            stop_watch.cancel()
            dispatcher.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(dispatcher, *self._tasks, return_exceptions=True)
            gc.unfreeze()

    async def _wake_on_stop(self) -> None:
        """A stop wakes whatever waits: the batch being gathered is dropped, dispatch ends."""
        await self.stop.wait()
        await self._notify()

    async def _train_one_step(self) -> None:
        waited = time.monotonic()
        groups, filtered = await self._next_batch()
        if self.stop.is_set():
            return  # the step in progress is dropped; its prompts stay pending, so a resume trains them
        started = time.monotonic()
        batch = train_batch(groups, self.version, self.algo, self.config.sampling.max_new_tokens)
        with self.trainer_busy.busy():
            metrics = await self.trainer.train_step(batch.samples)
            self.step += 1
            self.version += 1
            self.counts.trained += len(batch.samples)
            self.counts.masked_truncated += batch.masked
            for prompt_id in batch.prompt_ids:
                self.prompts.trained(prompt_id)
            self._count_filtered(filtered)
            synced, delivery = time.monotonic(), None
            if self.version % self.config.weight_sync.every_steps == 0:
                if self._release is not None:
                    await self._release  # one version on its way at a time
                delivery = await self.sync_weights(self.version)
            synced = time.monotonic() - synced
        # Only once the new version is out may the next groups start: dispatched earlier, they would be
        # generated by the old policy and be one version staler than maxStaleness allows when their turn
        # comes. The next step may train meanwhile, on groups generated already.
        self._release = self._spawn(self._release_groups(len(groups), delivery))
        if delivery is None:
            await self._release
        checkpoint_due = self._checkpointed_now()
        written = str(step_dir(Path(self.config.checkpoint.dir), self.step)) if checkpoint_due else self.last_checkpoint
        times = {"step_seconds": time.monotonic() - started, "wait_seconds": started - waited, "sync_seconds": synced}
        report = step_report(
            *(groups, filtered, batch, metrics),
            step=self.step,
            version=self.version,
            counts=Counts(**vars(self.counts)),
            elapsed_seconds=time.monotonic() - self._started,
            checkpoint=written,
            times=times,
            log_samples=self.config.logging.samples,
            episode_stats=self.episodes.take_stats() if self.episodes is not None else None,
        )
        self.on_step(report)
        if self.evaluation is not None:  # when due, on the version just published once it is out
            await self.evaluation.at_step(self.step, self.algo.total_steps, self._release, self.wake)
        # The line before its checkpoint: a trainer dying in between leaves a line the resume cuts.
        if checkpoint_due:
            self.last_checkpoint = await self.trainer.save_checkpoint(self.step, self.version, self.state())

    def _count_filtered(self, filtered: list[Group]) -> None:
        """Groups dynamic sampling dropped for the step just trained: counted, their prompts done."""
        self.counts.filtered_groups += len(filtered)
        self.counts.filtered += sum(len(group.scored) for group in filtered)
        for group in filtered:
            self.prompts.filtered(group.prompt.prompt_id)

    async def _release_groups(self, count: int, delivery: Awaitable[None] | None) -> None:
        if inspect.isawaitable(delivery):
            try:
                await delivery
            except Exception as exc:  # the pool could not take the version: the run ends here
                self.fail(str(exc))
                return
        async with self._changed:
            self._trained_groups, self._in_training = self._trained_groups + count, self._in_training - count
            self._changed.notify_all()

    async def _next_batch(self) -> tuple[list[Group], list[Group]]:
        """promptsPerStep complete groups, each within maxStaleness of the version to train; and the groups
        dynamic sampling dropped before each of them completed (the tracker drops them as they complete)."""
        batch: list[Group] = []
        taken: list[Group] = []

        def take() -> bool:
            room = self.algo.prompts_per_step - len(batch)
            group = self.tracker.take_for_batch(self.version, self.algo.max_staleness, room)
            if group is not None:
                taken.append(group)
            stopped = self._failure is not None or self.stop.is_set() or self._too_many_filtered(batch)
            return group is not None or stopped

        async with self._changed:
            while len(batch) < self.algo.prompts_per_step:
                await self._changed.wait_for(take)
                self._raise_if_failed()
                if self._too_many_filtered(batch):
                    raise NothingToLearn(nothing_to_learn(self.tracker.step_drops(batch), self.step + 1, self.algo))
                if not taken:  # stopped
                    return batch, []
                group = taken.pop()
                if group.received and staleness(group.oldest_version(), self.version) > self.algo.max_staleness:
                    # Too old to train on: regenerate the prompt with the current policy.
                    self.counts.discarded_stale += len(group.received)
                    self.prompts.retry(group.prompt)
                    self.tracker.filtered[:0] = group.dropped_before  # the next group to learn from takes them
                    self._changed.notify_all()
                    continue
                batch.append(group)
                self._in_training += 1
        return batch, [dropped for group in batch for dropped in group.dropped_before]

    def _too_many_filtered(self, batch: list[Group]) -> bool:
        return self.tracker.drops_for(batch) > self.algo.dynamic_sampling.max_extra_groups

    def _checkpointed_now(self) -> bool:
        """Whether the step just finished is one that gets a checkpoint."""
        return self.step % self.config.checkpoint.every_steps == 0 or self.step == self.algo.total_steps

    # ---- dispatch ---------------------------------------------------------------------
    def _may_dispatch(self) -> bool:
        # Groups taken for the step in progress stay outstanding until its new version is out.
        outstanding = self.tracker.outstanding + self._in_training
        return (
            not self.stop.is_set()
            and self._failure is None
            and (
                dispatch_allowed(outstanding, self.algo.prompts_per_step, self.algo.max_staleness)
                and self._trained_groups + outstanding < self.algo.total_steps * self.algo.prompts_per_step
            )
        )

    async def _dispatch_loop(self) -> None:
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._may_dispatch() and self.rollout.pick() is not None)
                # One prompt group per Generate call: a call shared among every prompt that may start
                # would make generation bursty (the whole staleness window out of one engine batch),
                # and the reward pool's backlog with it. The slot is taken here, so that the next pick
                # sees it.
                replica = self.rollout.pick()
                assert replica is not None  # the wait's condition
                prompt = self.guard.draw(self.step)
                if prompt is None:  # the run failed on it
                    continue
                self.tracker.start(prompt, self.algo.group_size, self.version)
                if self.episodes is not None:  # each episode takes a slot for each of its turns, as it goes
                    for index in range(self.algo.group_size):
                        self._spawn(self._episode(prompt, index))
                    continue
                replica.in_flight += 1
                self._spawn(self._generate(prompt, list(range(self.algo.group_size)), replica))

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fail(f"internal error: {task.exception()!r}")

    async def _generate(
        self, prompt: Prompt, indices: list[int], replica: Replica | None = None, avoid: str = ""
    ) -> None:
        """Generate samples `indices` of `prompt` on `replica` (its slot taken), else the first with room
        (another than `avoid` where one is live)."""
        reserved = replica is not None
        while replica is None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.rollout.pick() is not None or self._failure is not None)
                if self._failure:
                    return
                replica = self.rollout.pick(avoid)
        try:
            request = generate_request(self.config, prompt, indices)
            async for completions in self.rollout.generate(replica, request, reserved=reserved):
                self._received(prompt, completions)
        except ReplicaLost as exc:
            log.warning("%s; regenerating the rest of prompt %s elsewhere", exc, prompt.prompt_id)
            await self._regenerate_missing(prompt)
        except grpc.aio.AioRpcError as exc:  # the engine failed this request (one long sample out of memory, ...)
            error = f"{exc.code().name}: {exc.details()}"
            for run in self.guard.engine_failed(prompt, replica.name, error, self.step):  # on another replica
                self._spawn(self._generate(prompt, run, avoid=replica.name))
        async with self._changed:
            self._changed.notify_all()

    async def _regenerate_missing(self, prompt: Prompt) -> None:
        group = self.tracker.groups.get(prompt.prompt_id)
        if group is None:
            return
        missing = group.missing()
        if missing:
            self.counts.lost_replica += len(missing)
            for run in contiguous_runs(missing):
                self._spawn(self._generate(prompt, run))

    async def _episode(self, prompt: Prompt, index: int) -> None:
        """Episode `index` of `prompt`, played to its end, as its group's sample (or excluded from it)."""
        assert self.episodes is not None
        try:
            sample = await self.episodes.run(prompt, index)
        except EpisodeExcluded:
            async with self._changed:
                self.tracker.exclude(prompt.prompt_id, index)
                self._changed.notify_all()
            return
        except EpisodeFatal as exc:
            self.fail(str(exc))
            return
        self._accept(prompt, [sample])

    def _received(self, prompt: Prompt, completions: list[sample_pb2.Completion]) -> None:
        """Completions that came in one message: new samples of their group go to reward together."""
        self._accept(prompt, [received_sample(completion) for completion in completions])

    def _accept(self, prompt: Prompt, received: list[Sample]) -> None:
        samples = [sample for sample in received if self.tracker.receive(sample)]
        self.counts.generated += len(samples)
        if not samples:
            return
        if self.config.reward_dispatch == "sample":
            self._spawn(self.scoring.score(prompt, samples))
        else:
            self._held.setdefault(prompt.prompt_id, []).extend(samples)
            self._release_held()

    def _release_held(self) -> None:
        """Send held samples to reward: a whole group once generated (`group`); every generated group once
        promptsPerStep of them are, or once nothing else is being generated (`batch`)."""
        generated = [pid for pid in self._held if not self.tracker.groups[pid].missing()]
        batch_incomplete = len(generated) < self.algo.prompts_per_step and any(
            group.missing() for group in self.tracker.groups.values()
        )
        if self.config.reward_dispatch == "batch" and batch_incomplete:
            return  # the batch is still being generated
        for prompt_id in generated:
            self._spawn(self.scoring.score(self.tracker.groups[prompt_id].prompt, self._held.pop(prompt_id)))

    # ---- failure and state ---------------------------------------------------------------
    def fail(self, message: str) -> None:
        """End the run with RunFailed(message) at the train loop's next wait; the first failure wins."""
        if self._failure is None:
            self._failure = message
            asyncio.get_running_loop().create_task(self._notify())

    async def wake(self) -> None:
        """Something the loop may wait for changed outside it (a replica joined the rollout pool)."""
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RunFailed(self._failure)

    def state(self) -> dict[str, Any]:
        """The controller's part of a checkpoint: step, version, data position and the sample counts."""
        return {
            "step": self.step,
            "policy_version": self.version,
            "data": self.prompts.state(),
            "counts": asdict(self.counts),
        }

    @property
    def waiting_for_reward(self) -> tuple[int, str]:
        """Samples whose reward is retried under onError: wait now, and the newest error that made one wait."""
        return self.scoring.waiting_for_reward
