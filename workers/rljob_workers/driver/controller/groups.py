"""Prompt groups as their samples stream in, and the staleness rules (pure bookkeeping, no I/O)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rljob_workers.driver.controller.data import Prompt

if TYPE_CHECKING:
    from rljob_workers.driver.controller.episode import Transcript


@dataclass
class Sample:
    """One generated sample and, once scored, its reward."""

    sample_id: str
    prompt_id: str
    index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    policy_version: int  # of its first token: the oldest it spans, what its staleness counts from
    text: str
    truncated: bool = False  # cut at maxNewTokens (finish reason LENGTH)
    last_version: int | None = None  # of its last token, when a version came in flight (None: policy_version)
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    loss_mask: list[int] | None = None  # an episode's: 0 for its observations' tokens
    episode: Transcript | None = None  # an episode's whole record (its conversation, turns, rewards)


@dataclass
class Group:
    """The n samples of one prompt; complete when every index is scored or excluded."""

    prompt: Prompt
    n: int
    dispatched_version: int = 0  # the controller's policy version when the group was dispatched
    received: dict[int, Sample] = field(default_factory=dict)
    excluded: set[int] = field(default_factory=set)
    dispatched_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None  # when its last sample was scored or excluded
    # Dynamic sampling: the groups dropped since the group to learn from completed before this one. The step
    # that trains it is charged them: with two steps' groups sought at once, a step is charged its own share.
    dropped_before: list[Group] = field(default_factory=list)
    # Kept as samples come in, so that neither costs a pass over the group per sample.
    _done: int = field(default=0, init=False, repr=False)  # received samples scored or excluded
    _oldest: int | None = field(default=None, init=False, repr=False)  # oldest policy version received

    @property
    def latency(self) -> float | None:
        """Seconds from dispatch until the whole group was scored; None while it is not."""
        return None if self.ready_at is None else self.ready_at - self.dispatched_at

    @property
    def scored(self) -> list[Sample]:
        return [s for i, s in sorted(self.received.items()) if s.reward is not None and i not in self.excluded]

    @property
    def complete(self) -> bool:
        return self._done == self.n

    def missing(self) -> list[int]:
        """Indices not yet received (to be generated again after a rollout replica failed)."""
        return [i for i in range(self.n) if i not in self.received and i not in self.excluded]

    def oldest_version(self) -> int:
        """The oldest policy version among its samples (the dispatch version before any arrived)."""
        return self.dispatched_version if self._oldest is None else self._oldest

    def add(self, sample: Sample) -> None:
        self.received[sample.index] = sample
        self._oldest = sample.policy_version if self._oldest is None else min(self._oldest, sample.policy_version)

    def set_reward(self, index: int, reward: float, components: dict[str, float]) -> None:
        sample = self.received[index]
        if not self._is_done(index):
            self._done += 1
        sample.reward, sample.components = reward, components

    def exclude(self, index: int) -> None:
        if index in self.excluded:
            return
        if index not in self.received or not self._is_done(index):  # an episode excluded before it was received
            self._done += 1
        self.excluded.add(index)

    def _is_done(self, index: int) -> bool:
        return self.received[index].reward is not None or index in self.excluded


def dispatch_allowed(outstanding_groups: int, prompts_per_step: int, max_staleness: int) -> bool:
    """May one more prompt group start generating?

    Groups in flight or waiting for the trainer are trained at most `max_staleness` steps
    after the version current when they were dispatched, as long as no more than
    (max_staleness + 1) batches are outstanding: 0 gives synchronous on-policy training.
    """
    return outstanding_groups < (max_staleness + 1) * prompts_per_step


def staleness(sample_version: int, trainer_version: int) -> int:
    """How many versions the sample lags the policy about to be trained."""
    return trainer_version - sample_version


@dataclass
class GroupTracker:
    """Every group in flight; complete groups wait, in completion order, for the trainer.

    With an `informative` test (dynamic sampling), a complete group that fails it goes to `filtered`
    instead: it no longer counts as outstanding, so another group may start in its place at once. The next
    informative group to complete takes them along (`Group.dropped_before`).
    """

    groups: dict[str, Group] = field(default_factory=dict)
    ready: deque[Group] = field(default_factory=deque)
    duplicates: int = 0
    informative: Callable[[Group], bool] | None = None
    filtered: list[Group] = field(default_factory=list)

    def start(self, prompt: Prompt, n: int, version: int = 0) -> Group:
        if prompt.prompt_id in self.groups:
            raise KeyError(f"prompt {prompt.prompt_id} already in flight")
        group = self.groups[prompt.prompt_id] = Group(prompt, n, version)
        return group

    def take_for_batch(self, version: int, max_staleness: int, room: int) -> Group | None:
        """The next group for the batch trained at `version` with `room` places left; None: wait.

        Oldest first. A group still in flight that the step after this one could no longer
        train (dispatched `max_staleness` or more versions ago) is waited for rather than
        passed over by newer ready groups, while the batch has no room for more than those:
        taking completion order alone lets newer groups fill batch after batch until the slow
        old one is too stale and its work is thrown away.
        """
        if not self.ready:
            return None
        group = min(self.ready, key=Group.oldest_version)
        urgent_in_flight = sum(1 for g in self.groups.values() if version - g.dispatched_version >= max_staleness)
        if version - group.oldest_version() < max_staleness and urgent_in_flight >= room:
            return None
        self.ready.remove(group)
        return group

    def receive(self, sample: Sample) -> bool:
        """Record a generated sample; False (and counted) for a duplicate or unknown sample."""
        group = self.groups.get(sample.prompt_id)
        if group is None or sample.index in group.received or not 0 <= sample.index < group.n:
            self.duplicates += 1
            return False
        group.add(sample)
        return True

    def score(self, prompt_id: str, index: int, reward: float, components: dict[str, float]) -> None:
        self.groups[prompt_id].set_reward(index, reward, components)
        self._maybe_ready(prompt_id)

    def exclude(self, prompt_id: str, index: int) -> None:
        self.groups[prompt_id].exclude(index)
        self._maybe_ready(prompt_id)

    def _maybe_ready(self, prompt_id: str) -> None:
        group = self.groups[prompt_id]
        if group.complete:
            group.ready_at = time.monotonic()
            del self.groups[prompt_id]
            if self.informative is None or self.informative(group):
                group.dropped_before, self.filtered = self.filtered, []
                self.ready.append(group)
            else:
                self.filtered.append(group)

    def step_drops(self, batch: list[Group]) -> list[Group]:
        """The groups dropped for the step gathering `batch`: its groups' own, and those dropped since the
        last group to learn from completed (the next one, this step's if it still has room, takes them)."""
        return [dropped for group in batch for dropped in group.dropped_before] + self.filtered

    def drops_for(self, batch: list[Group]) -> int:
        """len(step_drops(batch)), counted, not listed: asked at every wake-up while the batch is gathered."""
        return len(self.filtered) + sum(len(group.dropped_before) for group in batch)

    def drop(self, prompt_id: str) -> Group:
        """Forget a group in flight (its prompt will be handed out again)."""
        return self.groups.pop(prompt_id)

    @property
    def outstanding(self) -> int:
        return len(self.groups) + len(self.ready)
