"""The job's token: every internal gRPC call carries it, every internal server checks it.

A run has one random token. On a cluster the operator keeps it in a Secret owned by the RLJob and
mounts it into the driver and every pool pod; `rljob run` writes one into its output folder. Either
way the file's path is in `RLJOB_TOKEN_FILE`, which is how a pool's Ray actor finds it. Servers
answer UNAUTHENTICATED to a call without it (grpc.health.v1 stays open for probes); clients send it
as `authorization: Bearer <token>`, the header remote reward endpoints already take.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rljob_api.workercfg import TOKEN_FILE_ENV

TOKEN_FILE_NAME = "token"
AUTH_HEADER = "authorization"
# Probes (the kubelet's grpc probe, grpcurl health checks) carry no credential.
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
# A refused client stream is read (and dropped) for at most this long or this many messages before the
# refusal is sent: see `_read_out`.
REFUSAL_READ_SECONDS, REFUSAL_READ_MESSAGES = 1.0, 1024


class TokenError(ValueError):
    """The job's token cannot be read; the message names the file."""


def read_token(path: str | Path) -> str:
    """The token in `path`, stripped of surrounding whitespace; a clear error if it is missing or empty."""
    try:
        token = Path(path).read_text().strip()
    except FileNotFoundError:
        raise TokenError(f"job token file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise TokenError(f"cannot read job token file {str(path)!r}: {exc.strerror}") from None
    if not token:
        raise TokenError(f"job token file {str(path)!r} is empty")
    return token


def token_file() -> str | None:
    """Where this process's job token is (`RLJOB_TOKEN_FILE`), if it has one."""
    return os.environ.get(TOKEN_FILE_ENV) or None


def required_job_token() -> str:
    """This process's job token (`RLJOB_TOKEN_FILE`): a pool replica never serves without one."""
    path = token_file()
    if not path:
        raise TokenError(f"{TOKEN_FILE_ENV} is not set: an rljob pool serves only with its job's token")
    return read_token(path)


@dataclass(frozen=True)
class JobToken:
    """A run's token and the file that holds it (the file is how the pools' processes find it)."""

    path: str
    value: str

    @classmethod
    def from_env(cls) -> JobToken:
        """The token the pod was given (the operator's Secret, mounted at `RLJOB_TOKEN_FILE`)."""
        return cls(token_file() or "", required_job_token())

    @classmethod
    def new(cls, folder: Path) -> JobToken:
        """A fresh random token in `folder/token`, readable by its owner only."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / TOKEN_FILE_NAME
        value = secrets.token_urlsafe(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(value + "\n")
        os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
        return cls(str(path), value)


def bearer(token: str) -> tuple[str, str]:
    return (AUTH_HEADER, f"Bearer {token}")


def refusal(
    handler: grpc.RpcMethodHandler, message: str, code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers `code` without reading a request."""

    async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
        if handler.request_streaming:
            await _read_out(request)
        await context.abort(code, message)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if handler.request_streaming:
            await _read_out(request)
        await context.abort(code, message)
        yield  # pragma: no cover  # makes this an async generator, as a streaming handler must be

    if handler.response_streaming:
        make = (
            grpc.stream_stream_rpc_method_handler if handler.request_streaming else grpc.unary_stream_rpc_method_handler
        )
        return make(deny_stream)
    make = grpc.stream_unary_rpc_method_handler if handler.request_streaming else grpc.unary_unary_rpc_method_handler
    return make(deny)


async def _read_out(requests: AsyncIterator[bytes]) -> None:
    """Read a refused client stream to its half-close (bounded in time and count; the raw messages are
    dropped), so that the refusal is what the client sees: grpcio's aio client reports INTERNAL
    instead of the server's status when the server ends a call while the client is still writing
    (grpc/grpc#36066)."""

    async def read() -> None:
        count = 0
        async for _ in requests:
            count += 1
            if count >= REFUSAL_READ_MESSAGES:
                return

    with contextlib.suppress(Exception):  # a stream that breaks or stalls is refused all the same
        await asyncio.wait_for(read(), REFUSAL_READ_SECONDS)


class TokenCheck(grpc.aio.ServerInterceptor):
    """Lets a call through only with `authorization: Bearer <token>` (compared in constant time)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise TokenError("an empty job token would let every caller in")
        self.expected = f"Bearer {token}".encode()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler: grpc.RpcMethodHandler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        sent = [value for key, value in details.invocation_metadata or () if key == AUTH_HEADER]
        if not sent:
            return refusal(handler, f"{details.method}: no job token (authorization: Bearer <token>)")
        given = sent[0].encode() if isinstance(sent[0], str) else sent[0]
        if not hmac.compare_digest(given, self.expected):
            return refusal(handler, f"{details.method}: wrong job token")
        return handler


class _Authorized:
    """A multi-callable whose every call carries `header` after the caller's own metadata."""

    def __init__(self, call: Any, header: tuple[str, str]) -> None:
        self._call, self._header = call, header

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._call(*args, metadata=(*(metadata or ()), self._header), **kwargs)


class TokenChannel(grpc.aio.Channel):
    """`channel` with the job token in every call's metadata, after the caller's own. Not client
    interceptors: an aio channel with interceptors runs every call, and every message of a stream, through
    an intercepted call of its own, which costs client and server CPU on every reward Score message and
    holds the driver's GIL while it runs."""

    def __init__(self, channel: grpc.aio.Channel, token: str) -> None:
        self._channel, self._header = channel, bearer(token)

    async def __aenter__(self) -> TokenChannel:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Authorized(self._channel.unary_unary(*args, **kwargs), self._header)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Authorized(self._channel.unary_stream(*args, **kwargs), self._header)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Authorized(self._channel.stream_unary(*args, **kwargs), self._header)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Authorized(self._channel.stream_stream(*args, **kwargs), self._header)
