"""The reward pool's Ray actor: one replica, the job's reward functions behind a RewardService
(`serve_reward`), in the pool's process."""

from __future__ import annotations

import ray

from rljob_workers.common.actor import ServerActor, collector_paused, node_host
from rljob_workers.common.auth import required_job_token


@ray.remote
class RewardActor(ServerActor):
    """One reward replica: the job's reward functions behind a RewardService."""

    async def serve(self) -> str:
        with collector_paused():  # a reward model's pool loads torch and transformers too
            from rljob_api.workercfg import RewardWorkerConfig
            from rljob_workers.reward.server import serve_reward

            host = node_host()
            config = RewardWorkerConfig.model_validate_json(self.config_json)
            self.server, self.servicer = await serve_reward(config, host, 0, token=required_job_token())
        return f"{host}:{self.server.port}"

    def blocking_suspects(self) -> list[str]:
        return self.servicer.functions.async_rules if self.servicer is not None else []

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.set_serving(False)
            await self.servicer.drain(30.0)
            await self.server.stop(None)
            await self.servicer.functions.aclose()
