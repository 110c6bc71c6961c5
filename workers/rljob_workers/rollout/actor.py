"""The rollout pool's Ray actor: one replica, an engine behind a RolloutService (`serve_rollout`), in the
pool's process. Its actors require the pool's custom resource, so the same code places them on the rollout
nodes of a KubeRay cluster and on one local machine."""

from __future__ import annotations

import ray

from rljob_workers.common.actor import ServerActor, collector_paused, node_host
from rljob_workers.common.auth import required_job_token


@ray.remote
class RolloutActor(ServerActor):
    """One rollout replica: an engine behind a RolloutService."""

    async def serve(self) -> str:
        with collector_paused():
            from rljob_api.workercfg import RolloutWorkerConfig
            from rljob_workers.rollout.server import serve_rollout

            config = RolloutWorkerConfig.model_validate_json(self.config_json)
            # Replicas sample differently: the same seed everywhere would duplicate their samples.
            config.seed += 1_000_003 * self.index
            host = node_host()
            self.server, self.servicer = await serve_rollout(config, host, 0, token=required_job_token())
        return f"{host}:{self.server.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            await self.servicer.close()
