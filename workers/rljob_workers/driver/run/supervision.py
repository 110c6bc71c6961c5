"""Pool supervision: a replica that dies is found within seconds and replaced.

Every `INTERVAL` seconds each replica of the rollout and reward pools is asked for its pod
name over Ray (cheap), and the data path's own view is read (a rollout stream or a reward
stream that broke marks its replica lost at once). A dead replica is taken out of the data
path (its in-flight work goes elsewhere: the controller regenerates its prompts under the same
prompt ids, the router re-sends its samples), and a new one is started after a backoff; a new
rollout replica pulls the current weights before it serves. Each pool may replace
`spec.<pool>.maxRestarts` replicas in a run; one more death fails the run, naming the pool,
the replica and the cause. Trainer ranks are pinged the same way: a dead rank fails the step
in progress, and `rljob run` restarts the trainer group from the last checkpoint (`local`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import ray

from rljob.v1 import control_service_pb2 as control_pb
from rljob_workers.driver.placement.launcher import ActorPool

log = logging.getLogger(__name__)

# A trainer rank died: the run ends here and `rljob run` starts it again from the last checkpoint.
EXIT_TRAINER_LOST = 75
INTERVAL = 1.0  # seconds between two checks
PING_TIMEOUT = 10.0  # longest wait for one answer; no answer is not death (see `ping`)
# A failed run asks a silent trainer rank again this long: Ray says "unavailable" before it says "died".
SETTLE_SECONDS = 30.0
BACKOFF_BASE, BACKOFF_CAP = 0.5, 30.0  # seconds before the n-th restart: base * 2**(n-1), capped


class RestartBudgetSpent(RuntimeError):
    """A pool lost one replica more than spec.<pool>.maxRestarts allows."""


@dataclass(frozen=True)
class Restart:
    """One replaced replica: what died, why, and how long finding and replacing it took."""

    pool: str
    replica: str
    cause: str
    replacement: str
    detected_after: float  # seconds from the previous check that found it alive
    replaced_in: float  # seconds from detection until the replacement served


@dataclass
class RestartHistory:
    """Every replacement one driver process made, across its trainer-group restarts, for its status:
    the operator posts an Event on the RLJob for each entry (run_id tells a new driver process)."""

    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    entries: list[control_pb.Restart] = field(default_factory=list)
    _trainer_lost: tuple[str, int, float] | None = None  # cause, step, when

    def replaced(self, restart: Restart, step: int) -> None:
        self.entries.append(
            control_pb.Restart(
                pool=restart.pool,
                replica=restart.replica,
                cause=restart.cause,
                replacement=restart.replacement,
                seconds=restart.replaced_in,
                step=step,
            )
        )

    def trainer_lost(self, cause: str, step: int) -> None:
        """The trainer group died; its entry is made when the next group has resumed (`trainer_back`)."""
        self._trainer_lost = (cause, step, time.monotonic())

    def trainer_back(self, step: int) -> None:
        if self._trainer_lost is not None:
            cause, lost_at, since = self._trainer_lost
            self._trainer_lost = None
            self.entries.append(
                control_pb.Restart(
                    pool="trainer",
                    replica="trainer group",
                    cause=cause,
                    replacement=f"a new trainer group resumed at step {step}",
                    seconds=time.monotonic() - since,
                    step=lost_at,
                )
            )


async def ping(actor: Any) -> str | None:
    """Why the actor is dead, in a few words; None while it is alive, or may be.

    Only Ray's word that the process died counts: a slow answer (a replica busy on a loaded
    machine) or a temporarily unreachable actor is looked at again next round, since replacing
    a live replica would cost its in-flight work for nothing.
    """
    return (await _ask(actor, PING_TIMEOUT))[1]


async def settled_ping(actor: Any, deadline: float) -> str | None:
    """`ping` asked again while the actor neither answers nor is known dead, until `deadline` (monotonic).
    For a run that has already failed: right after a kill, Ray's call fails with ActorUnavailableError and
    only later, once the death is published, with ActorDiedError. An actor silent until the deadline is taken
    for lost all the same (on a loaded machine Ray's word came later than that, CI saw; and a hung rank is as
    good as a dead one to a run that must restart its trainer)."""
    started = time.monotonic()
    while True:
        answered, cause, _ = await _ask(actor, max(0.1, min(PING_TIMEOUT, deadline - time.monotonic())))
        if answered or cause is not None:
            return cause
        if time.monotonic() >= deadline:
            return f"it answered no ping for {time.monotonic() - started:.0f} s after the run failed"
        await asyncio.sleep(0.2)


async def _ask(actor: Any, timeout: float, method: str = "pod_name") -> tuple[bool, str | None, Any]:
    """One call to the actor's cheap `method`: (it answered, why it is dead where Ray says it died, the
    answer)."""
    try:
        answer = await asyncio.wait_for(getattr(actor, method).remote(), timeout)
    except (asyncio.TimeoutError, ray.exceptions.ActorUnavailableError):
        return False, None, None
    except ray.exceptions.RayActorError:
        return False, "its process died", None
    return True, None, answer


@dataclass
class PoolSupervisor:
    """Keeps one gRPC pool (rollout or reward) at strength."""

    pool: ActorPool
    max_restarts: int
    lost: Callable[[str], bool]  # the data path already lost this replica
    attach: Callable[[str, str], Awaitable[None]]  # bring a new replica (name, address) into the data path
    detach: Callable[[str, str], Awaitable[None]]  # take a dead replica (name, cause) out of it
    on_restart: Callable[[Restart], None] = lambda restart: None  # told of each replacement
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # shared with whatever else resizes the pool
    hung_after: float = float("inf")  # seconds without an answer to any ping that make a replica lost
    restarts: list[Restart] = field(default_factory=list)
    blocked: tuple[float, str] = (0.0, "")  # the newest report of a replica's blocked event loop: when, what
    _seen_alive: float = field(default_factory=time.monotonic)
    _answered: dict[str, float] = field(default_factory=dict)  # by replica: when it last answered a ping

    async def check(self) -> None:
        """One round: replace every replica found dead (raises RestartBudgetSpent past the budget)."""
        names = list(self.pool.actors)
        causes = await asyncio.gather(*(self._cause_of_death(name) for name in names))
        for name, cause in zip(names, causes, strict=True):
            if cause is not None:
                await self._replace(name)
        self._seen_alive = time.monotonic()

    async def _cause_of_death(self, name: str) -> str | None:
        actor = self.pool.actors.get(name)
        if actor is None:
            return None
        # The ping asks the replica whether its event loop was blocked since (common.loop_watch): the answer is
        # logged and kept for the status.
        answered, cause, report = await _ask(actor, min(PING_TIMEOUT, self.hung_after), "loop_blocked")
        now = time.monotonic()
        if answered:
            self._answered[name] = now
            if report:
                self.blocked = (now, f"{self.pool.pool} replica {name}: {report}")
                log.warning("%s", self.blocked[1])
        elif cause is None and now - self._answered.setdefault(name, now) >= self.hung_after:
            # Alive to Ray, answering nothing (a SIGSTOPped process, a wedged event loop): hung, and lost.
            cause = f"it answered no ping for {now - self._answered[name]:.0f} s (spec.supervision.hungAfterSeconds)"
        if cause is None and self.lost(name):
            cause = "its gRPC stream broke"
        return cause

    async def _replace(self, name: str) -> None:
        async with self.lock:
            # Looked at again under the lock: a replica being added or drained (elastic scaling) is
            # briefly in the pool but not in the data path, and must not be taken for dead.
            cause = await self._cause_of_death(name)
            if cause is None:
                return
            detected = time.monotonic()
            self.pool.kill(name)
            self._answered.pop(name, None)
            await self.detach(name, cause)
            used = len(self.restarts)
            if used >= self.max_restarts:
                raise RestartBudgetSpent(
                    f"{self.pool.pool} replica {name} died ({cause}) and spec.{self.pool.pool}.maxRestarts "
                    f"{self.max_restarts} replacements are used up"
                )
            log.warning("%s replica %s died (%s); starting a replacement", self.pool.pool, name, cause)
            await asyncio.sleep(min(BACKOFF_BASE * 2**used, BACKOFF_CAP))
            new, address = await self.pool.add()
            await self.attach(new, address)
            restart = Restart(
                self.pool.pool, name, cause, new, detected - self._seen_alive, time.monotonic() - detected
            )
            self.restarts.append(restart)
            self.on_restart(restart)
            log.warning("%s replica %s replaced by %s in %.1fs", self.pool.pool, name, new, restart.replaced_in)


@dataclass
class TrainerWatch:
    """Pings the trainer ranks; the first dead one is reported once (the run restarts the group)."""

    actors: list[Any]
    dead: str = ""

    async def check(self, settle: float = 0.0) -> str:
        """The first dead rank, once found. `settle`: seconds to wait for Ray's word on a rank that does not
        answer (0: one ping each, as the supervision loop asks every INTERVAL)."""
        if not self.dead:
            deadline = time.monotonic() + settle
            causes = await asyncio.gather(
                *(settled_ping(actor, deadline) if settle else ping(actor) for actor in self.actors)
            )
            for rank, cause in enumerate(causes):
                if cause is not None:
                    self.dead = f"trainer rank {rank} died ({cause})"
                    break
        return self.dead


async def failed_run_exit_code(exc: BaseException, trainer: TrainerWatch) -> int:
    """The exit code of a run that failed with `exc`: EXIT_TRAINER_LOST where a trainer rank died, whichever
    call saw the death first (a weight delivery's error may reach the controller before the watch's next
    ping, and before Ray has published the death: a silent rank is asked again for SETTLE_SECONDS), else 1."""
    if isinstance(exc, ray.exceptions.RayActorError) or await trainer.check(settle=SETTLE_SECONDS):
        return EXIT_TRAINER_LOST
    return 1


async def supervise(pools: list[PoolSupervisor], trainer: TrainerWatch, fail: Callable[[str], None]) -> None:
    """Check every pool each INTERVAL until cancelled; a spent budget or a dead trainer fails the run."""
    while True:
        await asyncio.sleep(INTERVAL)
        try:
            await asyncio.gather(*(p.check() for p in pools))
        except RestartBudgetSpent as exc:
            fail(str(exc))
            return
        dead = await trainer.check()
        if dead:
            fail(dead)
            return
