"""Start an asyncio gRPC server with health checking and reflection, as every rljob server has.

Every service's request messages are parsed leniently: one that does not decode (bad UTF-8 in
a string field, truncated bytes) fails its call with INVALID_ARGUMENT naming the method,
instead of gRPC's UNKNOWN; on a client stream the servicer's iterator raises
`UndecodableRequest` at that message, so it can answer what came before it. Reflection is
served as both grpc.reflection.v1 (what grpcurl asks first) and v1alpha.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

from rljob_workers.common.auth import TokenChannel, TokenCheck
from rljob_workers.common.limits import ConcurrencyLimit

# Large enough for a weight chunk or a long completion; bigger payloads are chunked.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
CLIENT_OPTIONS = SERVER_OPTIONS[:2]
# Concurrent RPCs a server takes by default (a server whose callers need more says so): past it a call is
# refused RESOURCE_EXHAUSTED at once, and one connection carries at most as many streams, so no caller, with the
# token or not, can pin a replica's memory and tasks without bound. Room beyond the work for health and control.
DEFAULT_MAX_RPCS = 256
HEADROOM_RPCS = 16
# v1 and v1alpha reflection have the same messages on the wire; only the service name differs.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


class UndecodableRequest(ValueError):
    """A request message that does not parse; the message names the method and the parse error."""


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


async def start_server(
    services: Sequence[Service],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    token: str | None = None,
    tls: grpc.ServerCredentials | None = None,
    max_rpcs: int = DEFAULT_MAX_RPCS,
) -> RunningServer:
    """Serve `services` plus grpc.health.v1 and reflection; port 0 picks a free port. With a `token`
    every call but a health check must carry it (see auth.py); with `tls` (server_lock.py) the port
    speaks TLS only. At most `max_rpcs` calls at once (and HEADROOM_RPCS more for health checks and
    control calls)."""
    limit = max_rpcs + HEADROOM_RPCS
    # The limit first: a call the token check refuses holds its place only while it is refused.
    interceptors: list[grpc.aio.ServerInterceptor] = [ConcurrencyLimit(limit)]
    if token is not None:
        interceptors.append(TokenCheck(token))
    # Not also HTTP/2's max_concurrent_streams: a client that opens streams past it before it reads the setting
    # (the driver's many episode streams on one connection) has them refused (REFUSED_STREAM), seen in the episodes
    # run; the interceptor's refusal names the method and the limit instead.
    server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=interceptors)
    health = HealthServicer()
    for service in services:
        _add_lenient(service, server)
        await health.set(service.full_name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = [s.full_name for s in services] + [
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        REFLECTION_V1,
        reflection.SERVICE_NAME,
    ]
    _add_reflection(names, server)
    address = f"{host}:{port}"
    bound = server.add_insecure_port(address) if tls is None else server.add_secure_port(address, tls)
    if bound == 0:
        raise OSError(f"cannot bind a gRPC server to {host}:{port}")
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, bound, health)


def _add_reflection(names: list[str], server: grpc.aio.Server) -> None:
    servicer = ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": handler}),)
    )


class _Registrations:
    """Stands in for a server to catch what a generated add_*_to_server registers."""

    def __init__(self) -> None:
        self.name = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, name: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.name, self.handlers = name, dict(handlers)


def _add_lenient(service: Service, server: grpc.aio.Server) -> None:
    caught = _Registrations()
    service.add_to_server(service.servicer, caught)  # type: ignore[arg-type]  # it only registers
    if not caught.handlers:  # registers generic handlers only: serve it as it is
        service.add_to_server(service.servicer, server)
        return
    handlers = {name: _lenient(f"/{caught.name}/{name}", h) for name, h in caught.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(caught.name, handlers),))
    server.add_registered_method_handlers(caught.name, handlers)  # type: ignore[attr-defined]  # missing in grpc-stubs


def _lenient(method: str, handler: Any) -> Any:
    """The handler with a parser that turns a message that does not decode into UndecodableRequest."""
    parse = handler.request_deserializer

    def lenient_parse(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as exc:
            return UndecodableRequest(f"{method}: a request message does not decode: {exc}")

    kind = next(k for k in ("unary_unary", "unary_stream", "stream_unary", "stream_stream") if getattr(handler, k))
    wrap = {"unary_unary": _unary_unary, "unary_stream": _unary_stream, "stream_unary": _stream_unary}
    behaviour = wrap.get(kind, _stream_stream)(getattr(handler, kind))
    return handler._replace(request_deserializer=lenient_parse, **{kind: behaviour})


async def _refuse_undecodable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, UndecodableRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request))


async def _raising(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, UndecodableRequest):
            raise request
        yield request


def _unary_unary(inner: Any) -> Any:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _refuse_undecodable(request, context)
        return await inner(request, context)

    return behaviour


def _unary_stream(inner: Any) -> Any:
    if not inspect.isasyncgenfunction(inner):  # it writes its responses itself (context.write)

        async def writes(request: Any, context: grpc.aio.ServicerContext) -> None:
            await _refuse_undecodable(request, context)
            await inner(request, context)

        return writes

    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _refuse_undecodable(request, context)
        async for response in inner(request, context):
            yield response

    return behaviour


def _stream_unary(inner: Any) -> Any:
    async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        return await inner(_raising(requests), context)

    return behaviour


def _stream_stream(inner: Any) -> Any:
    async def behaviour(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        async for response in inner(_raising(requests), context):
            yield response

    return behaviour


def channel(address: str, token: str | None = None) -> grpc.aio.Channel:
    """An asyncio channel with rljob's message limits; with a `token`, every call carries it."""
    plain = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
    return plain if token is None else TokenChannel(plain, token)
