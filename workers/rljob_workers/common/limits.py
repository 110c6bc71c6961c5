"""A bound on the calls a server serves at once: past it a call is refused RESOURCE_EXHAUSTED at once, naming
the method and the limit, so that no caller (with the job's token or not) can pin a replica's tasks and memory
without bound. Health checks are never counted or refused.

Written here rather than grpc.aio.server(maximum_concurrent_rpcs=...): grpcio's asyncio server queued the
calls past that limit instead of refusing them (grpc/grpc#30424), and later undercounted after refusals
(grpc/grpc#41531); a call queued there waits for ever, which is what this bound is for.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from rljob_workers.common.auth import OPEN_PREFIXES, refusal

# A call admitted by the interceptor is counted at once (a burst of calls sees the others); should its handler
# never start (the call cancelled in between), its count is returned after this long.
UNSTARTED_SECONDS = 30.0


class ConcurrencyLimit(grpc.aio.ServerInterceptor):
    """Admits at most `limit` calls at once (health checks aside)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a server must take at least one call, got a limit of {limit}")
        self.limit = limit
        self.active = 0

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler: grpc.RpcMethodHandler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        if self.active >= self.limit:
            message = f"{details.method}: the server serves {self.limit} calls at once, and has as many"
            return refusal(handler, message, grpc.StatusCode.RESOURCE_EXHAUSTED)
        return self._counted(handler)

    def _counted(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """`handler`, counted from now until its behavior returns."""
        self.active += 1
        slot = _Slot(self)
        slot.expire = asyncio.get_running_loop().call_later(UNSTARTED_SECONDS, slot.release)
        kinds = (handler.unary_unary, handler.unary_stream, handler.stream_unary, handler.stream_stream)
        behavior: Any = next(kind for kind in kinds if kind is not None)  # an aio handler: async
        serdes = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if not handler.response_streaming:
            make = (
                grpc.stream_unary_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_unary_rpc_method_handler
            )

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with slot:
                    return await behavior(request, context)

            return make(unary, **serdes)
        make = (
            grpc.stream_stream_rpc_method_handler if handler.request_streaming else grpc.unary_stream_rpc_method_handler
        )
        if inspect.isasyncgenfunction(behavior):

            async def streamed(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                with slot:
                    async for response in behavior(request, context):
                        yield response

            return make(streamed, **serdes)

        async def written(request: Any, context: grpc.aio.ServicerContext) -> None:  # writes with context.write
            with slot:
                await behavior(request, context)

        return make(written, **serdes)


class _Slot:
    """One admitted call's place in the count: given back once, when its behavior ends (or never starts)."""

    def __init__(self, limit: ConcurrencyLimit) -> None:
        self.limit = limit
        self.expire: asyncio.TimerHandle | None = None
        self.released = False

    def __enter__(self) -> None:
        if self.expire is not None:
            self.expire.cancel()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.limit.active -= 1
