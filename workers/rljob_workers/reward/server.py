"""The RewardService server: samples stream in, each is scored concurrently, answered as it finishes.

Refusals on the Score stream are answered per sample, not by aborting the call, so that one
refused sample does not take down the stream and every other sample in flight on it:

- an empty sample_id, or one already in flight on the stream: an INVALID error;
- more than ``max_in_flight`` samples in flight on the stream: a TRANSIENT error naming the
  sample, with ``refusal`` REFUSAL_REASON_RESOURCE_EXHAUSTED;
- a sample that arrives while the replica drains: the same, with REFUSAL_REASON_DRAINING.

A refusal (the ``refusal`` field of the ScoreError, part of the contract) means "not computed,
send it elsewhere": the router re-sends such samples instead of counting them as failures.

Info declares ``max_samples_per_message``: a stream whose requests carry ``samples`` gets its
answers in ``scores``, those that finished together in one message (a message costs the same
CPU for one sample as for many).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from importlib import metadata

import grpc

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_api.workercfg import RewardWorkerConfig
from rljob_workers.common.grpc_server import RunningServer, Service, UndecodableRequest, start_server
from rljob_workers.common.server_lock import LoadedLock, ServerLock, load_lock
from rljob_workers.common.serving import serve_until_signalled
from rljob_workers.reward.functions import (
    INVALID,
    TRANSIENT,
    RewardCallable,
    RewardFunctionSet,
    WeightedFunction,
    error_score,
)

SERVICE_NAME = reward_service_pb2.DESCRIPTOR.services_by_name["RewardService"].full_name


def _version() -> str:
    try:
        return metadata.version("rljob")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def refused_score(sample_id: str, reason: sample_pb2.RefusalReason, message: str) -> sample_pb2.SampleScore:
    """The answer for a sample declined without being scored: a TRANSIENT error whose `refusal` says why."""
    score = error_score(sample_id, TRANSIENT, message)
    score.error.refusal = reason
    return score


def refusal_label(reason: sample_pb2.RefusalReason) -> str:
    """The `reason` label of rljob_reward_refused_total: REFUSAL_REASON_DRAINING -> "draining"."""
    return sample_pb2.RefusalReason.Name(reason).removeprefix("REFUSAL_REASON_").lower()


class _ScoreStream:
    """State of one Score call: samples in flight on it and the answers waiting to be sent.

    The answers wait in a bounded queue: a client that writes samples and reads no answers fills it, the
    stream then stops reading its requests (its writes stall by HTTP/2 flow control), and no more work or
    memory is taken for it."""

    def __init__(self, servicer: RewardServicer) -> None:
        self.servicer = servicer
        self.in_flight: dict[str, asyncio.Task[None]] = {}
        # Room for every sample in flight and as many refusals; then the reader waits.
        limit = 2 * max(1, servicer.max_in_flight) + servicer.max_samples_per_message
        self.answers: asyncio.Queue[sample_pb2.SampleScore | None] = asyncio.Queue(maxsize=limit)
        self.undecodable = ""  # why the stream ends with INVALID_ARGUMENT once its answers are sent
        self.batched = False  # the client sends `samples`, so it reads `scores`

    async def read(self, requests: AsyncIterator[reward_service_pb2.ScoreRequest]) -> None:
        """Accept samples until the client half-closes (or sends a message that does not decode),
        then wait for the in-flight ones: every sample accepted is answered."""
        received = 0
        try:
            async for request in requests:
                received += 1
                if request.samples:
                    await self.accept_several(request.samples)
                else:  # one sample (an empty message is an empty sample, answered INVALID)
                    await self.accept(request.sample)
        except UndecodableRequest as exc:
            self.undecodable = (
                f"message {received + 1} on this stream does not decode; the ones before it are answered: {exc}"
            )
            await self.finish()
        except Exception:  # the client broke the stream: nobody is left to answer
            self.cancel()
        else:
            await self.finish()
        finally:
            await self.answers.put(None)

    async def finish(self) -> None:
        # Reading is over, so no task is added while these are awaited.
        await asyncio.gather(*self.in_flight.values(), return_exceptions=True)

    async def accept_several(self, samples: Sequence[sample_pb2.RewardSample]) -> None:
        self.batched = True
        limit = self.servicer.max_samples_per_message
        for sample in samples[:limit]:
            await self.accept(sample)
        for sample in samples[limit:]:
            self.servicer.metrics.observe_invalid()
            message = f"sample {sample.sample_id!r} is over Info's max_samples_per_message {limit} in its message"
            await self.answers.put(error_score(sample.sample_id, INVALID, message))

    async def replies(self) -> AsyncIterator[reward_service_pb2.ScoreResponse]:
        """The answers as they come; on a batched stream, the ones ready together share a message."""
        done = False
        while not done and (score := await self.answers.get()) is not None:
            if not self.batched:
                yield reward_service_pb2.ScoreResponse(score=score)
                continue
            scores = [score]
            while not self.answers.empty():
                more = self.answers.get_nowait()
                if more is None:  # the stream's end, after these
                    done = True
                    break
                scores.append(more)
            yield reward_service_pb2.ScoreResponse(scores=scores)

    async def accept(self, sample: sample_pb2.RewardSample) -> None:
        refusal = self.servicer.refusal(sample, self.in_flight)
        if refusal is not None:
            await self.answers.put(refusal)
            return
        self.servicer.begin()
        self.in_flight[sample.sample_id] = asyncio.create_task(self.score(sample))

    async def score(self, sample: sample_pb2.RewardSample) -> None:
        try:
            result = await self.servicer.score_one(sample)
            # In flight until its answer is queued: `finish` waits for it, so the stream's end cannot overtake
            # an answer waiting for room in the queue.
            await self.answers.put(result)
        finally:
            self.in_flight.pop(sample.sample_id, None)
            self.servicer.end()

    def cancel(self) -> None:
        for task in self.in_flight.values():
            task.cancel()


class RewardServicer(reward_service_pb2_grpc.RewardServiceServicer):
    """rljob.v1.RewardService over a RewardFunctionSet, with per-stream limits and drain."""

    def __init__(
        self,
        functions: RewardFunctionSet,
        *,
        name: str,
        max_in_flight: int,
        max_batch_size: int | None = None,
        version: str | None = None,
    ) -> None:
        self.functions = functions
        self.name = name
        self.max_in_flight = max_in_flight
        self.max_batch_size = max_batch_size or max_in_flight
        self.max_samples_per_message = max_in_flight  # never more than a stream may have in flight
        self.version = version or _version()
        self.draining = False
        self.metrics = functions.metrics
        self.metrics_port: int | None = None  # where /metrics is served, when it is
        self._active = 0  # samples being scored, over every stream and batch
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def backlog(self) -> int:
        """Samples accepted and not yet answered, over every stream and batch."""
        return self._active

    def begin(self) -> None:
        self._active += 1
        self.metrics.backlog.inc()
        self._idle.clear()

    def end(self) -> None:
        self._active -= 1
        self.metrics.backlog.dec()
        if self._active == 0:
            self._idle.set()

    async def score_one(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore:
        try:
            result = await self.functions.score(sample)
        except Exception as exc:  # a bug here must still answer the sample, per the contract
            message = f"reward server failed on sample {sample.sample_id!r}: {exc}"
            result = error_score(sample.sample_id, TRANSIENT, message)
        self.metrics.observe_answer(result)
        return result

    def refusal(
        self, sample: sample_pb2.RewardSample, in_flight: dict[str, asyncio.Task[None]]
    ) -> sample_pb2.SampleScore | None:
        """The error answer for a sample this stream will not score, or None to score it."""
        sid = sample.sample_id
        if not sid or sid in in_flight:
            self.metrics.observe_invalid()
            message = f"sample {sid!r} is already in flight on this stream" if sid else "sample has an empty sample_id"
            return error_score(sid, INVALID, message)
        if self.draining:
            return self._refuse(sid, sample_pb2.REFUSAL_REASON_DRAINING, "reward replica draining")
        if len(in_flight) >= self.max_in_flight:
            why = f"{len(in_flight)} samples already in flight on this stream (max_in_flight {self.max_in_flight})"
            return self._refuse(sid, sample_pb2.REFUSAL_REASON_RESOURCE_EXHAUSTED, why)
        return None

    def _refuse(self, sid: str, reason: sample_pb2.RefusalReason, why: str) -> sample_pb2.SampleScore:
        self.metrics.refused.labels(refusal_label(reason)).inc()
        return refused_score(sid, reason, f"sample {sid!r} refused: {why}")

    async def Score(
        self,
        request_iterator: AsyncIterator[reward_service_pb2.ScoreRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[reward_service_pb2.ScoreResponse]:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reward replica {self.name!r} is draining")
        stream = _ScoreStream(self)
        reader = asyncio.create_task(stream.read(request_iterator))
        try:
            async for reply in stream.replies():
                yield reply
            if stream.undecodable:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, stream.undecodable)
        finally:
            # The client went away or the server stops: nobody is left to receive these answers.
            reader.cancel()
            stream.cancel()

    async def ScoreBatch(
        self, request: reward_service_pb2.ScoreBatchRequest, context: grpc.aio.ServicerContext
    ) -> reward_service_pb2.ScoreBatchResponse:
        samples = list(request.samples)
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"reward replica {self.name!r} is draining")
        if len(samples) > self.max_batch_size:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch of {len(samples)} samples is over max_batch_size {self.max_batch_size}",
            )
        seen: set[str] = set()
        for i, sample in enumerate(samples):
            if not sample.sample_id:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"samples[{i}] has an empty sample_id")
            if sample.sample_id in seen:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"samples[{i}]: duplicate sample_id {sample.sample_id!r}"
                )
            seen.add(sample.sample_id)
        for _ in samples:
            self.begin()
        try:
            scores = await asyncio.gather(*(self.score_one(s) for s in samples))
        finally:
            for _ in samples:
                self.end()
        return reward_service_pb2.ScoreBatchResponse(scores=scores)

    async def Info(
        self, request: reward_service_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reward_service_pb2.InfoResponse:
        # Rule functions declare no bounds: both 0 is the contract's "no range"; finiteness is still enforced.
        return reward_service_pb2.InfoResponse(
            name=self.name,
            version=self.version,
            max_batch_size=self.max_batch_size,
            max_in_flight=self.max_in_flight,
            min_score=0.0,
            max_score=0.0,
            functions=self.functions.names,
            max_samples_per_message=self.max_samples_per_message,
        )

    async def drain(self, timeout: float | None = None) -> bool:
        """Refuse new streams and samples, wait for in-flight ones; True if all finished in time."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True


async def start_reward_server(
    functions: RewardFunctionSet,
    *,
    name: str,
    max_in_flight: int,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    tls: grpc.ServerCredentials | None = None,
) -> tuple[RunningServer, RewardServicer]:
    """Serve `functions` as a RewardService (plus health and reflection); port 0 picks a free port. With a
    `token` every call must carry it (the job's own replicas, and a served function given one); with `tls`
    the port speaks TLS."""
    servicer = RewardServicer(functions, name=name, max_in_flight=max_in_flight)
    service = Service(reward_service_pb2_grpc.add_RewardServiceServicer_to_server, servicer, SERVICE_NAME)
    running = await start_server([service], host, port, token=token, tls=tls, max_rpcs=max_in_flight)
    return running, servicer


async def serve_reward(
    config: RewardWorkerConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    metrics_port: int | None = None,
    token: str | None = None,
) -> tuple[RunningServer, RewardServicer]:
    """Start a reward replica from its worker config (the Ray launcher's entry point).

    Models are loaded in a thread, so the caller's event loop keeps running. With `metrics_port`
    (0 picks a free one) the replica's Prometheus metrics are served on http://host:port/metrics;
    either way they are in ``servicer.metrics.registry``.

    To retire it: ``await running.set_serving(False); await servicer.drain(t); await running.stop()``,
    then ``await servicer.functions.aclose()`` to release its models, channels and thread pool.
    """
    functions = await asyncio.to_thread(
        RewardFunctionSet.from_spec, config.functions, config.timeout_seconds, gpus=config.gpus
    )
    name = "+".join(functions.names)
    running, servicer = await start_reward_server(
        functions, name=name, max_in_flight=config.max_in_flight, host=host, port=port, token=token
    )
    if metrics_port is not None:
        servicer.metrics_port = functions.metrics.serve(metrics_port, host)
    return running, servicer


async def _serve_until_signalled(
    fn: RewardCallable, name: str, host: str, port: int, timeout_seconds: float, max_in_flight: int, lock: LoadedLock
) -> None:
    functions = RewardFunctionSet([WeightedFunction(name, fn)], timeout_seconds)
    try:
        running, servicer = await start_reward_server(
            functions, name=name, max_in_flight=max_in_flight, host=host, port=port, token=lock.token, tls=lock.tls
        )

        async def drain() -> None:  # a signalled stop drains: samples in flight are answered before the server goes
            await servicer.drain(timeout_seconds)

        await serve_until_signalled(running, f"reward {name!r} serving on {host}:{running.port}", lock, drain)
    finally:
        functions.close()


def serve_function(
    fn: RewardCallable,
    *,
    name: str,
    port: int = 50052,
    host: str = "0.0.0.0",
    timeout_seconds: float = 60.0,
    max_in_flight: int = 64,
    lock: ServerLock | None = None,
) -> None:
    """Serve a plain function ``fn(prompt, completion, **fields) -> float`` (sync or async) as a RewardService.

    Blocks until SIGINT or SIGTERM, then drains. Binds every interface by default, since the
    point is to be reached by a job's `remote` reward; port 0 picks a free port (printed).

    `lock` is the job's token calls must carry (UNAUTHENTICATED without it) and the TLS certificate and key
    to serve with: ``ServerLock(token_file=..., tls_cert=..., tls_key=...)``. Without one, RLJOB_TOKEN_FILE,
    RLJOB_TLS_CERT and RLJOB_TLS_KEY give it; none set, the server is open. Its files are read before the
    port is bound: a missing one raises, naming it.
    """
    loaded = load_lock(lock)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_signalled(fn, name, host, port, timeout_seconds, max_in_flight, loaded))
