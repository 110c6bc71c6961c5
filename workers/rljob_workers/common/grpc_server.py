"""Start an asyncio gRPC server with health checking and reflection, as every rljob server has."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

# Large enough for a weight chunk or a long completion; bigger payloads are chunked.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
CLIENT_OPTIONS = SERVER_OPTIONS[:2]


@dataclass(frozen=True)
class Service:
    """One servicer, the generated function that registers it, and its full name."""

    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    full_name: str


@dataclass
class RunningServer:
    """A started server, its bound port and its health servicer (to mark it NOT_SERVING on drain)."""

    server: grpc.aio.Server
    port: int
    health: HealthServicer

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.health.set("", status)

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.set_serving(False)
        await self.server.stop(grace)


async def start_server(services: Sequence[Service], host: str = "127.0.0.1", port: int = 0) -> RunningServer:
    """Serve `services` plus grpc.health.v1 and reflection; port 0 picks a free port."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    health = HealthServicer()
    for service in services:
        service.add_to_server(service.servicer, server)
        await health.set(service.full_name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [s.full_name for s in services] + [
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    ]
    reflection.enable_server_reflection(names, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind a gRPC server to {host}:{port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, bound, health)


def channel(address: str) -> grpc.aio.Channel:
    """An asyncio channel with rljob's message limits."""
    return grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
