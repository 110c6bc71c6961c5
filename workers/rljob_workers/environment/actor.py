"""The environment pool's Ray actor: one replica. Of a `kind: python` environment it serves the job's class behind
an EnvironmentService (`serve_environment_replica`), in the pool's process; of a `kind: image` one it stands for
the environment's own container in its pod (any language, serving EnvironmentService at `container_port`): it waits
for the container's health before the pool routes episodes to it, and it is the replica the driver supervises."""

from __future__ import annotations

import asyncio
import time

import grpc
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rljob_workers.common.actor import ServerActor, node_host
from rljob_workers.common.auth import required_job_token

# How often the actor asks its pod's environment container whether it serves yet.
HEALTH_EVERY_SECONDS = 0.5


@ray.remote
class EnvironmentActor(ServerActor):
    """One environment replica: the job's environment class, or its pod's own environment container."""

    async def serve(self) -> str:
        from rljob_api.workercfg import EnvironmentWorkerConfig
        from rljob_workers.environment.server import serve_environment_replica

        host = node_host()
        config = EnvironmentWorkerConfig.model_validate_json(self.config_json)
        if config.container_port is not None:  # the pod's own container serves it: wait until it does
            await container_serving(f"127.0.0.1:{config.container_port}")
            return f"{host}:{config.container_port}"
        self.server, self.servicer = await serve_environment_replica(config, host, token=required_job_token())
        return f"{host}:{self.server.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


async def container_serving(address: str, timeout: float | None = None) -> None:
    """Return once the server at `address` answers its grpc.health.v1 check SERVING (the kubelet restarts a
    container that exits; the pool's start timeout, spec.environment.startTimeoutSeconds, bounds the wait)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass  # not up yet
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the environment container at {address} did not serve within {timeout:g} s")
            await asyncio.sleep(HEALTH_EVERY_SECONDS)
