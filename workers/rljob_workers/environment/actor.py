"""The environment pool's Ray actor: one replica, the job's environment class behind an EnvironmentService
(`serve_environment_replica`), in the pool's process."""

from __future__ import annotations

import ray

from rljob_workers.common.actor import ServerActor, node_host
from rljob_workers.common.auth import required_job_token


@ray.remote
class EnvironmentActor(ServerActor):
    """One environment replica: the job's environment class behind an EnvironmentService."""

    async def serve(self) -> str:
        from rljob_api.workercfg import EnvironmentWorkerConfig
        from rljob_workers.environment.server import serve_environment_replica

        host = node_host()
        config = EnvironmentWorkerConfig.model_validate_json(self.config_json)
        self.server, self.servicer = await serve_environment_replica(config, host, token=required_job_token())
        return f"{host}:{self.server.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
