"""The Ray side of the pools: a replica that will not stop cleanly is killed, on a real local Ray."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray

from rljob_workers.driver.controller.report import RunFailed
from rljob_workers.driver.placement import launcher, ray_node
from rljob_workers.driver.placement.launcher import ActorPool
from rljob_workers.driver.run import supervision
from rljob_workers.driver.run.supervision import EXIT_TRAINER_LOST, TrainerWatch, failed_run_exit_code

pytestmark = pytest.mark.ray


class WedgedReplica:
    """Starts and names itself, but its graceful stop never ends (a thread stuck in a collective)."""

    def __init__(self, config_json: str, cpus: float, index: int) -> None:
        self.index = index

    async def start(self) -> str:
        return f"127.0.0.1:{50000 + self.index}"

    async def pod_name(self) -> str:
        return ""

    async def stop(self) -> None:
        await asyncio.sleep(3600)

    def ping(self) -> int:
        return self.index


@pytest.fixture
def local_ray() -> Iterator[None]:
    ray_node.start_local_ray(2, {"reward": 2})
    try:
        yield
    finally:
        ray_node.shutdown_ray()


def test_a_replica_that_does_not_stop_in_its_grace_period_is_killed(local_ray, monkeypatch):
    monkeypatch.setattr(launcher, "STOP_GRACE_SECONDS", 1.0)
    pool = ActorPool("reward", ray.remote(WedgedReplica), "{}", 0.1, 0)

    async def go() -> tuple[str, float, object]:
        name, _ = await pool.add()
        actor = pool.actors[name]
        started = time.monotonic()
        named = await pool.stop(name)
        return named, time.monotonic() - started, actor

    named, seconds, actor = asyncio.run(go())
    assert named == "reward-0" and pool.actors == {} and pool.addresses == {}
    assert 1.0 <= seconds < 10, seconds
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.ping.remote(), timeout=30)  # type: ignore[attr-defined]


class TrainerRank:
    """Answers pings, like a trainer rank's actor."""

    async def pod_name(self) -> str:
        return ""


class DyingRank:
    """A trainer rank just killed, as Ray tells of it: "unavailable" for the first calls, then "died"."""

    def __init__(self, unavailable: int) -> None:
        self.unavailable, self.calls = unavailable, 0
        self.pod_name = self  # actor.pod_name.remote()

    async def _answer(self) -> str:
        self.calls += 1
        if self.calls <= self.unavailable:
            raise ray.exceptions.ActorUnavailableError("the connection to the actor was lost", None)
        raise ray.exceptions.ActorDiedError()

    def remote(self) -> Any:
        return self._answer()


def test_a_failed_run_waits_for_rays_word_on_a_rank_it_was_just_told_is_unavailable():
    """CI (this stop) saw the run below end 1, not EXIT_TRAINER_LOST: right after the kill Ray's call says
    "unavailable", and only later "died". The failed run asks again, and restarts the trainer."""
    failed = RunFailed("weight delivery to rollout-0 failed: the trainer's stream ended")
    rank = DyingRank(unavailable=3)
    assert asyncio.run(failed_run_exit_code(failed, TrainerWatch([rank]))) == EXIT_TRAINER_LOST
    assert rank.calls == 4
    # the supervision loop's own check asks once a round: "unavailable" is not death there
    assert asyncio.run(TrainerWatch([DyingRank(unavailable=1)]).check()) == ""


class SilentRank:
    """A trainer rank that Ray never declares dead and that never answers (CI's loaded machine: Ray's word on a
    killed rank came after the settle time; a hung rank looks the same)."""

    def __init__(self) -> None:
        self.pod_name = self

    def remote(self) -> Any:
        return asyncio.sleep(3600)


def test_a_failed_run_whose_trainer_rank_stays_silent_restarts_the_trainer(monkeypatch):
    monkeypatch.setattr(supervision, "SETTLE_SECONDS", 1.0)
    failed = RunFailed("weight delivery to rollout-0 failed: the trainer's stream ended")
    watch = TrainerWatch([SilentRank()])
    assert asyncio.run(failed_run_exit_code(failed, watch)) == EXIT_TRAINER_LOST
    assert "answered no ping for 1 s after the run failed" in watch.dead


def test_a_run_failed_by_a_call_that_saw_the_trainer_die_first_restarts_the_trainer(local_ray):
    """A weight delivery's error (RunFailed) reaches the run before the trainer watch's next ping: the run
    still ends with EXIT_TRAINER_LOST (restart from the checkpoint) where a rank is dead, and 1 where not."""
    actor: Any = ray.remote(TrainerRank).remote()
    ray.get(actor.pod_name.remote(), timeout=60)
    failed = RunFailed("weight delivery to rollout-0 failed: the trainer's stream ended")

    async def exit_code() -> int:
        return await failed_run_exit_code(failed, TrainerWatch([actor]))

    assert asyncio.run(exit_code()) == 1  # a live trainer: the run failed for another reason
    ray.kill(actor)
    assert asyncio.run(exit_code()) == EXIT_TRAINER_LOST
