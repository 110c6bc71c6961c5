"""The job's pools as one run session holds them: each pool's Ray actors, the controller's clients of them
(rollout clients, reward router), the weight sync, the elastic reward pool and the supervisors that replace a
dead replica. Started together, told apart only by what each pool serves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

from rljob_workers.common.auth import JobToken
from rljob_workers.driver.controller.weight_sync import WeightSync
from rljob_workers.driver.placement import runtimes
from rljob_workers.driver.placement.launcher import (
    ActorPool,
    RayTrainer,
    environment_pool,
    pool_started,
    reward_pool,
    rollout_pool,
    worker_env,
)
from rljob_workers.driver.placement.ray_node import environment_replicas
from rljob_workers.driver.pools.elastic import ElasticPool
from rljob_workers.driver.pools.environment import EnvironmentClients
from rljob_workers.driver.pools.reward.router import RewardRouter
from rljob_workers.driver.pools.rollout import RolloutClients
from rljob_workers.driver.run.plan import RunPlan
from rljob_workers.driver.run.supervision import PoolSupervisor, Restart
from rljob_workers.reward.remote import token_path

# Longest wait for the pools' replicas to stop cleanly at the run's end (each is killed after its own grace).
STOP_ALL_SECONDS = 30
# A killed replica's calls fail at once (UNAVAILABLE); its channel closes after this, cancelling any left.
DETACH_GRACE_SECONDS = 30.0


class JobPools:
    """Rollout, reward, trainer and environment: their actors and the controller's clients of them."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        configs, cpus = plan.configs, plan.pool_cpus
        self.rollout: ActorPool = rollout_pool(configs, cpus["rollout"])
        self.rollout.interpreter = runtimes.runtime_env(plan.rollout_python)  # an engine's own runtime
        self.reward: ActorPool = reward_pool(configs, cpus["reward"])
        controller = configs.controller
        self.clients = RolloutClients(
            configs.rollout.max_concurrent_prompts, request_timeout=controller.rollout_request_timeout
        )
        self.router = RewardRouter(
            replica_timeout=controller.reward_timeout_seconds, answer_deadline=controller.reward_answer_deadline
        )
        self.actor_env: dict[str, str] | None = None  # each actor's own environment (a cluster's)
        self.trainer: RayTrainer | None = None
        self.weight_sync: WeightSync | None = None
        self.elastic: ElasticPool | None = None  # the reward pool's
        self.elastic_environment: ElasticPool | None = None
        spec = configs.controller.environment
        # kind python: the job's environment actors; kind remote: the endpoints alone
        self.environment: ActorPool | None = None
        self.environments: EnvironmentClients | None = None
        if spec is not None:
            self.environments = EnvironmentClients(spec.max_episodes_per_replica, spec.step_timeout_seconds)
            if configs.environment is not None:
                self.environment = environment_pool(configs, cpus["environment"])

    def use_token(self, token: JobToken) -> None:
        """Every pool serves with `token`; every client of the run sends it. On a cluster each actor carries
        the pools' environment; locally the Ray node was started with it (`ray_node.init_local_ray`)."""
        self.actor_env = worker_env(token.path) if self.plan.cluster else None
        self.rollout.env = self.reward.env = self.actor_env
        self.clients.token = self.router.token = token.value
        if self.environment is not None:
            self.environment.env = self.actor_env
        if self.environments is not None:
            self.environments.token = token.value

    async def start(self, resume_dir: Path | None) -> RayTrainer:
        """Every pool at once (a replica's start is mostly its process importing and loading); the trainer."""
        c, cpus, model = self.plan.configs, self.plan.pool_cpus, f"spec.model.path: {self.plan.job.spec.model.path}"
        rollouts, rewards = c.controller.rollout_replicas, max(c.controller.reward_replicas.min, 1)
        rewards = rewards if c.controller.reward_functions else 0  # the environment alone gives the reward
        environment = self.environment
        environments = environment_replicas(c) if environment is not None else 0
        group = await self.rollout.share_gpus_with_trainer(c, cpus["trainer"])  # None unless spec.colocate
        replicas = asyncio.gather(
            *(pool_started("rollout", model, self.rollout.add()) for _ in range(rollouts)),
            *(pool_started("reward", "spec.reward.functions", self.reward.add()) for _ in range(rewards)),
            *(
                pool_started("environment", "spec.environment.class", environment.add())
                for _ in range(environments)
                if environment is not None
            ),
        )
        if group is not None:  # colocated: vLLM sizes its share by the memory free at its start, so it goes first
            await replicas
        resume = str(resume_dir) if resume_dir else None
        trainer_started = RayTrainer.start(c, cpus["trainer"], resume, self.actor_env, group)
        started, trainer = await asyncio.gather(replicas, pool_started("trainer", model, trainer_started))
        for name, address in started[:rollouts]:
            self.clients.add(name, address)
        for name, address in started[rollouts : rollouts + rewards]:
            await self.router.add_replica(name, address)
        self._attach_environments(started[rollouts + rewards :])
        self.trainer = trainer
        return trainer

    def _attach_environments(self, started: list[tuple[str, str]]) -> None:
        """The environment replicas just started, or a `kind: remote` environment's endpoints."""
        spec = self.plan.configs.controller.environment
        if self.environments is None or spec is None:
            return
        for name, address in started:
            self.environments.add(name, address)
        if spec.remote is not None:
            path = token_path("environment", spec.remote)
            self.environments.add_remote(spec.remote, path.read_text().strip() if path else None)

    async def sync_first_weights(self, version: int) -> WeightSync:
        """Publish the trainer's weights as `version` and bring every rollout replica to it."""
        c = self.plan.configs
        assert self.trainer is not None
        backend = c.controller.weight_sync.backend
        if backend == "auto":
            backend = "nccl" if c.rollout.gpus > 0 and c.trainer.gpus_per_node > 0 and not c.colocate else "gloo"
        sync = self.weight_sync = WeightSync(
            self.trainer, self.clients, backend, c.controller.weight_sync.timeout_seconds
        )
        await sync.publish_initial(version)
        if version > 0:
            await asyncio.gather(*(sync.catch_up(r, version) for r in self.clients.live()))
        return sync

    def start_elastic(self, arrivals: Callable[[], int]) -> list[ElasticPool]:
        """The reward pool (`arrivals`: samples sent to reward so far; none without reward functions: the
        environment gives the reward) and the environment pool (kind python), sized by the elastic policy
        from now on."""
        c = self.plan.configs.controller
        if c.reward_functions:
            self.elastic = ElasticPool(
                self.router,
                self.reward,
                c.reward_replicas,
                c.reward_scaling,
                arrivals=arrivals,
                drain_timeout=c.reward_timeout_seconds,
            )
            self.elastic.desired = len(self.reward.actors)
        spec, environments = c.environment, self.environments
        if self.environment is not None and environments is not None and spec is not None:
            self.elastic_environment = ElasticPool(
                environments,
                self.environment,
                spec.replicas,
                spec.scaling,
                arrivals=lambda: environments.calls_started,
                # an episode's turns each wait on the model and the environment: room for its whole length
                drain_timeout=spec.step_timeout_seconds * (spec.max_turns + 1) + DETACH_GRACE_SECONDS,
                name="environment",
                done="playing {} episodes",
            )
            self.elastic_environment.desired = len(self.environment.actors)
            self.environment.start_timeout = spec.start_timeout_seconds  # from now on: the run's first are up
        return [e for e in (self.elastic, self.elastic_environment) if e is not None]

    def supervisors(
        self, on_restart: Callable[[Restart], None], wake: Callable[[], Awaitable[None]]
    ) -> list[PoolSupervisor]:
        """Who replaces a dead replica of each gRPC pool (see `supervision`); `wake` tells the controller that
        a new rollout replica serves."""
        restarts = self.plan.configs.controller.max_restarts
        hung_after = self.plan.configs.controller.hung_after_seconds

        async def attach_rollout(name: str, address: str) -> None:
            """A new rollout replica pulls the current weights before the controller may pick it."""
            replica = self.clients.add(name, address)
            replica.alive = False
            assert self.weight_sync is not None
            await self.weight_sync.catch_up(replica, self.weight_sync.published)
            replica.alive = True
            await wake()  # prompts waiting for a replica may go now

        async def detach_reward(name: str, cause: str) -> None:
            self.router.drop_replica(name, cause)

        rollout = PoolSupervisor(
            self.rollout,
            restarts["rollout"],
            lost=lambda name: name in self.clients.replicas and not self.clients.replicas[name].alive,
            attach=attach_rollout,
            detach=lambda name, cause: self.clients.remove(name, grace=DETACH_GRACE_SECONDS),
            on_restart=on_restart,
            hung_after=hung_after,
        )
        reward = PoolSupervisor(
            self.reward,
            restarts["reward"],
            lost=lambda name: not self.router.has_replica(name),
            attach=self.router.add_replica,
            detach=detach_reward,
            on_restart=on_restart,
            lock=self.elastic.lock if self.elastic is not None else asyncio.Lock(),
            hung_after=hung_after,
        )
        supervisors = [rollout, reward]
        environments = self.environments
        if self.environment is not None and environments is not None:
            supervisors.append(
                PoolSupervisor(
                    self.environment,
                    restarts["environment"],
                    lost=lambda name: name in environments.replicas and not environments.replicas[name].alive,
                    attach=lambda name, address: _attached(environments.add(name, address)),
                    detach=lambda name, cause: environments.remove(name),
                    on_restart=on_restart,
                    lock=self.elastic_environment.lock if self.elastic_environment is not None else asyncio.Lock(),
                    hung_after=hung_after,
                )
            )
        return supervisors

    def sizes(self) -> dict[str, tuple[int, int, list[str]]]:
        """Each pool's (desired, ready, drained replicas), as the status reports them."""
        c = self.plan.configs
        reward: tuple[int, int, list[str]] = (len(self.reward.actors), len(self.reward.actors), [])
        if self.elastic is not None:
            reward = (self.elastic.desired, self.elastic.ready(), list(self.elastic.drained))
        sizes = {
            "rollout": (c.controller.rollout_replicas, len(self.clients.live()), []),
            "trainer": (c.trainer.world_size, c.trainer.world_size, []),
            **({"reward": reward} if c.controller.reward_functions else {}),  # none: the environment gives it
            **self._environment_size(),
        }
        return sizes

    def _environment_size(self) -> dict[str, tuple[int, int, list[str]]]:
        if self.environments is None:
            return {}
        elastic = self.elastic_environment
        if elastic is not None:
            return {"environment": (elastic.desired, elastic.ready(), list(elastic.drained))}
        desired = len(self.environment.actors) if self.environment is not None else len(self.environments.replicas)
        return {"environment": (desired, len(self.environments.live()), [])}

    async def stop(self) -> None:
        """Close the clients, then stop every replica (each killed if it does not stop in time)."""
        with contextlib.suppress(Exception):
            await self.router.close()
        with contextlib.suppress(Exception):
            await self.clients.close()
        if self.environments is not None:
            with contextlib.suppress(Exception):
                await self.environments.close()
        pools = [self.rollout, self.reward, *([self.environment] if self.environment is not None else [])]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(pool.stop_all() for pool in pools)), STOP_ALL_SECONDS)


async def _attached(replica: object) -> None:
    """A supervisor's attach is awaited; adding an environment replica's channel is not."""
