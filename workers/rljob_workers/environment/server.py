"""An environment class behind an EnvironmentService: the environment pool's replica, and `serve_environment`,
which serves a class in one line for a job's `kind: remote` environment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from rljob.v1 import environment_service_pb2 as pb
from rljob.v1 import environment_service_pb2_grpc as pb_grpc
from rljob_api.workercfg import EnvironmentWorkerConfig
from rljob_workers.common.grpc_server import RunningServer, Service, UndecodableRequest, start_server
from rljob_workers.common.server_lock import LoadedLock, ServerLock, load_lock
from rljob_workers.common.serving import serve_until_signalled
from rljob_workers.environment.episode import Episode as EpisodeState
from rljob_workers.environment.episode import (
    InvalidAction,
    MalformedAnswer,
    check_args,
    describe,
    load_class,
)

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvironmentService"].full_name
ERROR_KIND = pb.EnvironmentErrorKind
# How long a new episode waits for a slot on a full replica before it is refused. The client never has more
# than max_episodes on a replica, so a full one only has not yet seen an episode's end: a cancel in transit.
SLOT_WAIT_SECONDS = 5.0


def error_response(kind: int, message: str) -> pb.EpisodeResponse:
    return pb.EpisodeResponse(error=pb.EnvironmentError(kind=kind, message=message))  # type: ignore[arg-type]


class EnvironmentServicer(pb_grpc.EnvironmentServiceServicer):
    """Plays each Episode stream with a fresh instance of the class; at most `max_episodes` at once."""

    def __init__(
        self,
        cls: type,
        ref: str,
        *,
        args: Mapping[str, Any] | None = None,
        max_episodes: int = 64,
        step_timeout_seconds: float = 30.0,
    ) -> None:
        self.cls, self.ref, self.info = cls, ref, describe(cls, ref)
        self.args = dict(args or {})
        check_args(cls, ref, self.args)
        self.info.max_episodes = max_episodes
        self.max_episodes, self.step_timeout = max_episodes, step_timeout_seconds
        self.in_flight = 0
        self.episodes_played = 0
        self._freed = asyncio.Event()  # an episode ended: one waiting for a slot looks again

    async def Info(
        self, request: pb.EnvironmentServiceInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnvironmentServiceInfoResponse:
        return self.info

    async def Episode(
        self, request_iterator: AsyncIterator[pb.EpisodeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EpisodeResponse]:
        await self._admit(context)
        ended = False

        def end(_: Any = None) -> None:
            # Once per episode, at the first of: its last answer, its stream's end as gRPC sees it (a cancel
            # while an answer is being written leaves this generator suspended until it is collected), the finally.
            nonlocal ended
            if not ended:
                ended = True
                self.in_flight -= 1
                self.episodes_played += 1
                self._freed.set()

        context.add_done_callback(end)  # type: ignore[arg-type]  # grpc-stubs want a class; grpc takes a callable
        episode = EpisodeState(self.cls, self.args)  # the class's instance for this stream
        try:
            async for request in request_iterator:
                response = await self._answer(episode, request)
                if response.done or response.HasField("error"):
                    end()  # before the answer: the client frees the slot as it reads it, and may start the next
                    yield response
                    return
                yield response
        except UndecodableRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        finally:
            end()
            with contextlib.suppress(Exception):  # a close that fails must not end the stream with an error
                await episode.close()

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        """Count a new episode in, once a slot is free (within SLOT_WAIT_SECONDS; refused after)."""
        deadline = asyncio.get_running_loop().time() + SLOT_WAIT_SECONDS
        while self.max_episodes and self.in_flight >= self.max_episodes:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self.max_episodes} episodes in flight")
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), left)
        self.in_flight += 1

    async def _answer(self, episode: EpisodeState, request: pb.EpisodeRequest) -> pb.EpisodeResponse:
        which = request.WhichOneof("kind")
        if (which == "start") != (episode.instance is None):
            message = "an episode starts with `start`, then one `action` per turn"
            return error_response(ERROR_KIND.ENVIRONMENT_ERROR_KIND_INVALID_ACTION, message)
        try:
            call = episode.reset(request.start) if which == "start" else episode.step(request.action)
            return await asyncio.wait_for(call, self.step_timeout)
        except TimeoutError:
            message = f"{self.info.name}: no answer within {self.step_timeout:g}s"
            return error_response(ERROR_KIND.ENVIRONMENT_ERROR_KIND_TIMEOUT, message)
        except InvalidAction as exc:
            return error_response(ERROR_KIND.ENVIRONMENT_ERROR_KIND_INVALID_ACTION, f"{self.info.name}: {exc}")
        except MalformedAnswer as exc:
            return error_response(ERROR_KIND.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE, f"{self.info.name}: {exc}")
        except Exception as exc:  # the user's code failed: the episode's error, not the server's
            log.warning("%s: %s failed: %r", self.info.name, which, exc)
            detail = f"{self.info.name}: {which} raised {type(exc).__name__}: {exc}"
            return error_response(ERROR_KIND.ENVIRONMENT_ERROR_KIND_ENVIRONMENT_FAILURE, detail)


async def start_environment_server(
    ref: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    tls: grpc.ServerCredentials | None = None,
    args: Mapping[str, Any] | None = None,
    max_episodes: int = 64,
    step_timeout_seconds: float = 30.0,
) -> tuple[RunningServer, EnvironmentServicer]:
    """Serve the class at `ref` (module.path:Class); port 0 picks a free one. With a `token` every call must
    carry it (the job's own replicas, and a served class given one); with `tls` the port speaks TLS."""
    servicer = EnvironmentServicer(
        load_class(ref), ref, args=args, max_episodes=max_episodes, step_timeout_seconds=step_timeout_seconds
    )
    service = Service(pb_grpc.add_EnvironmentServiceServicer_to_server, servicer, SERVICE_NAME)
    running = await start_server([service], host, port, token=token, tls=tls, max_rpcs=max_episodes)
    return running, servicer


async def serve_environment_replica(
    config: EnvironmentWorkerConfig, host: str, *, token: str
) -> tuple[RunningServer, EnvironmentServicer]:
    """One replica of the job's environment pool, from its worker config (the Ray actor's entry point)."""
    assert config.class_ref is not None, "a kind image environment's container serves itself"
    return await start_environment_server(
        config.class_ref,
        host=host,
        token=token,
        args=config.args,
        max_episodes=config.max_episodes,
        step_timeout_seconds=config.step_timeout_seconds,
    )


async def _serve_until_signalled(
    ref: str, host: str, port: int, max_episodes: int, timeout: float, lock: LoadedLock
) -> None:
    running, servicer = await start_environment_server(
        ref,
        host=host,
        port=port,
        token=lock.token,
        tls=lock.tls,
        max_episodes=max_episodes,
        step_timeout_seconds=timeout,
    )
    line = f"environment {servicer.info.name!r} serving on {host}:{running.port}"
    await serve_until_signalled(running, line, lock)


def serve_environment(
    ref: str,
    *,
    port: int = 50055,
    host: str = "0.0.0.0",
    max_episodes: int = 64,
    step_timeout_seconds: float = 30.0,
    lock: ServerLock | None = None,
) -> None:
    """Serve an environment class (``module.path:Class``) as an EnvironmentService until SIGINT or SIGTERM.

    Binds every interface by default, since the point is to be reached by a job's `kind: remote` environment;
    port 0 picks a free port (printed).

    `lock` is the job's token calls must carry (UNAUTHENTICATED without it) and the TLS certificate and key
    to serve with: ``ServerLock(token_file=..., tls_cert=..., tls_key=...)``. Without one, RLJOB_TOKEN_FILE
    (what the operator sets in a `kind: image` container), RLJOB_TLS_CERT and RLJOB_TLS_KEY give it; none set,
    the server is open. Its files are read before the port is bound: a missing one raises, naming it."""
    loaded = load_lock(lock)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_signalled(ref, host, port, max_episodes, step_timeout_seconds, loaded))
