"""Episodes as the controller's samples: each one played on one rollout replica (sticky, so that its prefix
stays in the replica's cache) and the least-loaded environment replica, restarted from its start after an
environment error or a lost replica, under spec.environment's retries and onError; excluded, or failing the
run, once those are spent. A sample is only ever a whole episode, played once."""

from __future__ import annotations

import asyncio
import logging
import statistics
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rljob.v1 import sample_pb2
from rljob_workers.driver.controller.data import Prompt
from rljob_workers.driver.controller.episode import EpisodeFailed, NoEnvironmentReplica, Play, Transcript
from rljob_workers.driver.controller.groups import Sample
from rljob_workers.driver.controller.report import Counts
from rljob_workers.driver.pools.rollout import Replica, ReplicaLost

log = logging.getLogger(__name__)

# Kinds of failure another attempt may not meet; an invalid action or a malformed answer is the episode's own.
RESTARTABLE = frozenset({"failure", "timeout", "lost"})
WAIT_BACKOFF_CAP_SECONDS = 5.0


class EpisodeExcluded(Exception):
    """An episode given up under onError: exclude (counted; its group completes without it)."""


class EpisodeFatal(Exception):
    """An episode whose errors end the run under onError: fail or wait (the message names it)."""


def episode_seed(seed: int, prompt_id: str, index: int) -> int:
    """The same episode gets the same seed in every run (and every attempt) of the same job."""
    return zlib.crc32(f"{seed}/{prompt_id}/{index}".encode())


def as_sample(prompt: Prompt, index: int, episode: Transcript) -> Sample:
    first = episode.first_version or 0
    return Sample(
        sample_id=f"{prompt.prompt_id}/{index}",
        prompt_id=prompt.prompt_id,
        index=index,
        prompt_token_ids=episode.prompt_ids,
        token_ids=episode.ids,
        logprobs=episode.logprobs,
        policy_version=first,
        text=episode.last_text,
        truncated=episode.truncated,
        last_version=episode.last_version,
        loss_mask=episode.mask,
        episode=episode,
    )


@dataclass
class EpisodeRunner:
    """Plays the controller's episodes; `halted` says the run is ending (a wait for a replica gives up)."""

    play: Play
    counts: Counts
    halted: Callable[[], bool] = lambda: False
    in_flight: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # since the last step's report, by kind
    _assigned: Counter[str] = field(default_factory=Counter)  # episodes living on each rollout replica

    async def run(self, prompt: Prompt, index: int, sampling: sample_pb2.SamplingParams | None = None) -> Sample:
        """The sample of episode `index` of `prompt`, played to its end (with `sampling` instead of the job's:
        the eval's); EpisodeExcluded or EpisodeFatal."""
        spec = self.play.config.environment
        assert spec is not None
        seed = episode_seed(self.play.config.algorithm.seed, prompt.prompt_id, index)
        attempt, replica = 0, None
        self.in_flight += 1
        try:
            while True:
                replica = replica if replica is not None and replica.alive else await self._rollout_replica()
                await self._environment_replica()
                episode_id = f"{prompt.prompt_id}/{index}" + (f"~{attempt}" if attempt else "")
                try:
                    episode = await self._attempt(prompt, episode_id, seed, replica, sampling)
                    return as_sample(prompt, index, episode)
                except ReplicaLost as exc:  # the rollout's loss, not the environment's: always played again
                    log.warning("%s; episode %s starts again elsewhere", exc, episode_id)
                    replica = None
                except NoEnvironmentReplica:  # it never started: it waits for a replica, as the same attempt
                    continue
                except EpisodeFailed as exc:
                    self.counts.environment_errors += 1
                    self.errors[exc.kind] += 1
                    if not self._may_restart(exc, attempt, spec.retries, spec.on_error):
                        self._give_up(exc, spec.on_error)
                    log.warning("%s; restarting the episode", exc)
                    if attempt >= spec.retries:  # onError: wait
                        await asyncio.sleep(min(0.05 * 2 ** min(attempt, 10), WAIT_BACKOFF_CAP_SECONDS))
                attempt += 1
                self.counts.episode_restarts += 1
        finally:
            self.in_flight -= 1

    async def _attempt(
        self, prompt: Prompt, episode_id: str, seed: int, replica: Replica, sampling: sample_pb2.SamplingParams | None
    ) -> Transcript:
        self._assigned[replica.name] += 1
        try:
            episode = await self.play.play(prompt, episode_id, seed, replica, sampling)
        finally:
            self._assigned[replica.name] -= 1
        self.counts.episodes += 1
        self.counts.turns += episode.turns
        return episode

    @staticmethod
    def _may_restart(exc: EpisodeFailed, attempt: int, retries: int, on_error: str) -> bool:
        if exc.kind not in RESTARTABLE:
            return False
        return attempt < retries or on_error == "wait"

    def _give_up(self, exc: EpisodeFailed, on_error: str) -> None:
        if on_error == "exclude":
            self.counts.excluded_environment_error += 1
            log.warning("excluded %s", exc)
            raise EpisodeExcluded(str(exc))
        raise EpisodeFatal(f"{exc} (spec.environment.onError: {on_error})")

    async def _rollout_replica(self) -> Replica:
        """The live rollout replica with the fewest episodes on it; waits while there is none."""
        while True:
            live = self.play.rollout.live()
            if live:
                return min(live, key=lambda r: (self._assigned[r.name], r.name))
            if self.halted():
                raise EpisodeFatal("the run ended while an episode waited for a rollout replica")
            await asyncio.sleep(0.05)

    async def _environment_replica(self) -> None:
        """Waits while no environment replica is live: the job's own are being replaced by their supervisor
        (which fails the run past maxRestarts), and a lost replica is not the episode's error."""
        if not await self.play.environments.wait_live(self.halted):
            raise EpisodeFatal("the run ended while an episode waited for an environment replica")

    def take_stats(self) -> dict[str, float]:
        """The environment's step latencies and errors since the last call, for the step's report."""
        latencies = self.play.environments.take_latencies()
        stats: dict[str, float] = {f"environment_errors_{kind}": float(n) for kind, n in sorted(self.errors.items())}
        self.errors.clear()
        if latencies:
            ordered = sorted(latencies)
            stats["environment_step_seconds_p50"] = statistics.median(ordered)
            stats["environment_step_seconds_p99"] = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        stats["episodes_in_flight"] = float(self.in_flight)
        return stats
