"""The controller's reward side: each sample scored once, retried, waited for or excluded under the
reward pool's onError policy. The controller hands a sample over once it is generated and learns the
outcome through the group tracker it shares, under the condition it waits on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from rljob.v1 import sample_pb2
from rljob_api.workercfg import ControllerConfig
from rljob_workers.driver.controller.data import Prompt
from rljob_workers.driver.controller.groups import GroupTracker, Sample
from rljob_workers.driver.controller.messages import reward_request
from rljob_workers.driver.controller.protocols import Scorer
from rljob_workers.driver.controller.report import Counts

log = logging.getLogger(__name__)

# Longest pause between two tries of a sample under onError: wait (an endpoint's breaker reopens
# for a trial call after its resetSeconds; waiting far longer than that only delays recovery).
WAIT_BACKOFF_CAP_SECONDS = 5.0


def with_environment(
    config: ControllerConfig, sample: Sample, score: float, components: dict[str, float]
) -> tuple[float, dict[str, float]]:
    """An episode's reward: the reward functions' weighted sum plus its return (turn and final rewards), weighted
    by spec.environment.rewardWeight and named rewardName among the components."""
    environment = config.environment
    if environment is None or sample.episode is None:
        return score, components
    value = sample.episode.episode_return
    return score + environment.reward_weight * value, {**components, environment.reward_name: value}


class RewardScoring:
    """Scores the controller's samples. `changed` is the controller's condition: every score, exclusion and
    failure is recorded under it and wakes its waiters; `fail` ends the run (the controller's)."""

    def __init__(
        self,
        config: ControllerConfig,
        scorer: Scorer,
        counts: Counts,
        tracker: GroupTracker,
        changed: asyncio.Condition,
        fail: Callable[[str], None],
    ) -> None:
        self.config, self.scorer, self.counts, self.tracker = config, scorer, counts, tracker
        self._changed, self.fail = changed, fail
        self._waiting: set[str] = set()  # samples retried under onError: wait
        self._wait_reason = ""  # the newest reward error that made a sample wait

    async def score(self, prompt: Prompt, samples: list[Sample]) -> None:
        """Score samples ready together in one call to the scorer and one update of their group; a
        sample whose reward failed is retried, waited for or excluded on its own (onError)."""
        if not self.config.reward_functions:  # the environment's return is the whole reward
            await self._record_scores(
                [(sample, sample_pb2.SampleScore(sample_id=sample.sample_id)) for sample in samples]
            )
            return
        requests = [reward_request(prompt, sample) for sample in samples]
        results = await self.scorer.score_many(requests)
        await self._record_scores([(s, r) for s, r in zip(samples, results, strict=True) if not r.HasField("error")])
        failed = [(s, q, r) for s, q, r in zip(samples, requests, results, strict=True) if r.HasField("error")]
        await asyncio.gather(*(self._retry(sample, request, result) for sample, request, result in failed))

    async def _record_scores(self, scored: list[tuple[Sample, sample_pb2.SampleScore]]) -> None:
        if not scored:
            return
        async with self._changed:
            for sample, result in scored:
                self.counts.scored += 1
                score, components = with_environment(self.config, sample, result.score, dict(result.components))
                self.tracker.score(sample.prompt_id, sample.index, score, components)
            self._changed.notify_all()

    async def _retry(self, sample: Sample, request: sample_pb2.RewardSample, result: sample_pb2.SampleScore) -> None:
        """A sample whose reward failed: tried again (rewardRetries, onError: wait) until scored, or
        failing the run or excluded (onError)."""
        policy = self.config.reward_on_error
        attempt = 0
        waiting_since: float | None = None
        waited_out = ""
        while result.HasField("error"):
            error_class = result.error.error_class
            # A malformed sample stays malformed: retrying cannot help.
            retry = attempt < self.config.reward_retries and error_class != sample_pb2.ERROR_CLASS_INVALID
            wait = policy == "wait" and error_class == sample_pb2.ERROR_CLASS_TRANSIENT
            if not (retry or wait):
                break
            if not retry:
                if waiting_since is None:
                    waiting_since = time.monotonic()
                    log.warning("waiting for reward (onError: wait): %s", result.error.message)
                waited, limit = time.monotonic() - waiting_since, self.config.reward_wait_timeout
                if limit is not None and waited > limit:
                    waited_out = f" (waited {waited:.1f}s, over waitTimeoutSeconds {limit:g})"
                    break
                self._waiting.add(sample.sample_id)
                self._wait_reason = result.error.message
            self.counts.reward_retries += 1
            # The exponent is capped: under onError: wait, 2**attempt would outgrow a float in time.
            await asyncio.sleep(min(0.05 * 2 ** min(attempt, 10), WAIT_BACKOFF_CAP_SECONDS if wait else 2.0))
            attempt += 1
            result = await self.scorer.score(request)
        self._waiting.discard(sample.sample_id)
        if result.HasField("error"):
            await self._reward_failed(sample, result.error, waited_out)
        else:
            await self._record_scores([(sample, result)])

    async def _reward_failed(self, sample: Sample, error: sample_pb2.ScoreError, waited_out: str) -> None:
        detail = error.message
        if sample.sample_id not in detail:  # servers in other languages may not name the sample
            detail = f"sample {sample.sample_id}: reward function {error.function or '?'} failed: {detail}"
        detail += waited_out
        if self.config.reward_on_error in ("fail", "wait"):
            self.fail(detail)
            return
        log.warning("excluded %s", detail)
        async with self._changed:
            self.counts.excluded_reward_error += 1
            self.tracker.exclude(sample.prompt_id, sample.index)
            self._changed.notify_all()

    @property
    def waiting_for_reward(self) -> tuple[int, str]:
        """Samples whose reward is retried under onError: wait now, and the newest error that made one wait."""
        return len(self._waiting), self._wait_reason if self._waiting else ""
