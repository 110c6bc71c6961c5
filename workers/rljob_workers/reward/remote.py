"""`remote`: a client of external RewardService endpoints (any language).

Each sample is one unary ``ScoreBatch`` call carrying that one sample (HTTP/2 multiplexes the
calls over one channel per endpoint). Unary rather than the bidi ``Score`` stream because every
sample then has what this client needs: its own gRPC deadline, its own status code to classify,
its own retry on another endpoint, and one call outcome to feed the endpoint's breaker. A broken
stream would fail every sample in flight on it at once; a failed call fails one sample.

- Deadline: the job's ``timeoutSeconds`` covers the whole sample, retries and backoff included;
  each call's gRPC deadline is the time left of it.
- Retries: up to ``max_attempts`` calls, with exponential backoff and jitter, each on another
  endpoint when one is available. Retried: UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
  ABORTED, INTERNAL, UNKNOWN, CANCELLED, and answers whose error class is TRANSIENT. Not retried:
  INVALID_ARGUMENT (class INVALID), UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED, ... (class
  FUNCTION), and FUNCTION/INVALID answers, which are passed on as they are.
- Breaker per endpoint (`breaker.py`): retried status codes count as failures; an open breaker
  takes no calls; when every breaker is open the sample fails at once with a TRANSIENT error naming
  the endpoints and when each will be tried again.
- Balancing: least outstanding calls over endpoints whose breaker is not open, ties round-robin.
- Score range: before an endpoint's first sample its ``Info`` is asked (one call, shared by the
  samples that wait for it), and asked again after a call to it failed with a retried status code,
  since it may come back as another version. A finite score outside Info's
  ``[min_score, max_score]`` is a FUNCTION error (not retried) naming the sample, the function, the
  endpoint and the range: never clipped. Both bounds 0 (proto3's unset) declare no range, and so
  does an endpoint without Info (UNIMPLEMENTED, logged): only finiteness is checked then. An Info
  whose min_score is above its max_score fails the samples sent to that endpoint (FUNCTION).
- TLS: ``tls: true`` verifies the endpoint against ``caFile`` (or the system roots without one).
- Token: sent as ``authorization: Bearer <token>`` metadata, read from a file, never from the
  RLJob; the file is read again when it changes (rotated Secrets). ``tokenFile`` is used as given;
  ``tokenSecret`` ``{name, key}`` is read from ``$RLJOB_SECRETS_DIR/<function>/<key>``, with
  ``RLJOB_SECRETS_DIR`` defaulting to ``/var/run/secrets/rljob``: the operator mounts the Secret
  ``name`` read-only at ``/var/run/secrets/rljob/<function>`` in every reward pod.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_api.reward import RemoteReward
from rljob_workers.common.grpc_server import CLIENT_OPTIONS
from rljob_workers.reward.base import FUNCTION, INVALID, TRANSIENT, RewardConfigError, ScoreFailure
from rljob_workers.reward.breaker import Balancer, CircuitBreaker

log = logging.getLogger(__name__)

SECRETS_DIR_ENV = "RLJOB_SECRETS_DIR"
DEFAULT_SECRETS_DIR = "/var/run/secrets/rljob"
RETRIED_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)


def token_path(function: str, config: RemoteReward) -> Path | None:
    """Where the worker reads the bearer token of remote function `function`, if it has one."""
    if config.token_file:
        return Path(config.token_file)
    if config.token_secret:
        return Path(os.environ.get(SECRETS_DIR_ENV, DEFAULT_SECRETS_DIR)) / function / config.token_secret.key
    return None


class _Retry(Exception):
    """This attempt failed in a way another attempt may not."""


@dataclass
class _TokenFile:
    path: Path
    _mtime: float = -1.0
    _token: str = ""

    def read(self) -> str:
        mtime = self.path.stat().st_mtime
        if mtime != self._mtime:
            self._token, self._mtime = self.path.read_text().strip(), mtime
        return self._token


ScoreRange = tuple[float, float]
UNBOUNDED: ScoreRange = (-math.inf, math.inf)


class _BadInfo(Exception):
    """An endpoint's Info declares a range no score can be in."""


def declared_range(info: reward_service_pb2.InfoResponse) -> ScoreRange:
    """The [min, max] an endpoint's Info declares; unbounded when both are 0 (proto3's unset)."""
    low, high = info.min_score, info.max_score
    if low == 0.0 and high == 0.0:
        return UNBOUNDED
    if math.isnan(low) or math.isnan(high) or low > high:
        raise _BadInfo(f"its Info declares the empty score range [{low!r}, {high!r}]")
    return low, high


@dataclass
class _Endpoint:
    address: str
    breaker: CircuitBreaker
    outstanding: int = 0
    stub: reward_service_pb2_grpc.RewardServiceStub | None = field(default=None, repr=False)
    channel: grpc.aio.Channel | None = field(default=None, repr=False)
    # Its declared score range: fetched, or being fetched, by the sample that first needed it.
    info: asyncio.Task[ScoreRange] | None = field(default=None, repr=False)


class RemoteScorer:
    """Scores samples on external RewardService endpoints; see the module docstring."""

    kind = "remote"
    manages_deadline = True

    def __init__(
        self,
        name: str,
        config: RemoteReward,
        *,
        timeout_seconds: float,
        max_attempts: int = 3,
        backoff_seconds: float = 0.05,
        max_backoff_seconds: float = 1.0,
    ) -> None:
        self.name, self.config, self.timeout_seconds = name, config, timeout_seconds
        self.max_attempts = max_attempts
        self.backoff_seconds, self.max_backoff_seconds = backoff_seconds, max_backoff_seconds
        self.credentials = _credentials(name, config)
        path = token_path(name, config)
        if path is not None and not path.is_file():
            raise RewardConfigError(f"reward function {name!r}: bearer token file {str(path)!r} does not exist")
        self.token = _TokenFile(path) if path is not None else None
        breaker = dict(failure_threshold=config.failure_threshold, reset_seconds=config.reset_seconds)
        self.endpoints = [_Endpoint(address, CircuitBreaker(**breaker)) for address in config.endpoints]  # type: ignore[arg-type]
        self.balancer = Balancer(len(self.endpoints))

    async def score_sample(self, sample: sample_pb2.RewardSample) -> float:
        deadline = time.monotonic() + self.timeout_seconds
        sid, tried, last = sample.sample_id, set[int](), ""
        for attempt in range(self.max_attempts):
            if attempt:
                await asyncio.sleep(min(self._backoff(attempt), max(0.0, deadline - time.monotonic())))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            index = self.balancer.pick([e.breaker for e in self.endpoints], self._outstanding(), frozenset(tried))
            if index is None:
                raise ScoreFailure(TRANSIENT, f"{self._who()}: sample {sid!r} not sent: {self._open_breakers()}")
            tried.add(index)
            try:
                return await self._call(self.endpoints[index], sample, remaining)
            except _Retry as exc:
                last = str(exc)
        raise ScoreFailure(
            TRANSIENT,
            f"{self._who()}: sample {sid!r} not scored within {self.timeout_seconds:g}s "
            f"({len(tried)} endpoint(s) tried); last: {last or 'no attempt before the deadline'}",
        )

    async def _call(self, endpoint: _Endpoint, sample: sample_pb2.RewardSample, timeout: float) -> float:
        deadline, sid = time.monotonic() + timeout, sample.sample_id
        stub = self._stub(endpoint)
        request = reward_service_pb2.ScoreBatchRequest(samples=[sample])
        # A half-open trial waits for the connection (within the deadline) instead of failing on a
        # channel still backing off from the failures that opened the breaker.
        trial = endpoint.breaker.trial_in_flight
        endpoint.outstanding += 1
        rpc = "Info"
        try:
            metadata = self._metadata()
            bounds = await self._declared_range(endpoint, metadata, deadline, trial)
            rpc = "ScoreBatch"
            remaining = deadline - time.monotonic()
            reply = await stub.ScoreBatch(request, timeout=remaining, metadata=metadata, wait_for_ready=trial)
        except grpc.aio.AioRpcError as exc:
            return self._failed_call(endpoint, exc, sid, rpc)
        except (asyncio.CancelledError, ScoreFailure):
            endpoint.breaker.release()
            raise
        except asyncio.TimeoutError:  # another sample's Info call outlived this sample's deadline
            endpoint.breaker.release()
            raise _Retry(f"endpoint {endpoint.address}: Info not answered within the deadline") from None
        except _BadInfo as exc:
            endpoint.breaker.record_success()  # it answered: the endpoint is up, its Info is wrong
            raise ScoreFailure(
                FUNCTION, f"{self._who()}: endpoint {endpoint.address}: sample {sid!r} not sent: {exc}"
            ) from None
        finally:
            endpoint.outstanding -= 1
        endpoint.breaker.record_success()
        return self._answer(endpoint, reply, sid, bounds)

    async def _declared_range(
        self, endpoint: _Endpoint, metadata: tuple[tuple[str, str], ...], deadline: float, trial: bool
    ) -> ScoreRange:
        """The score range of the endpoint's Info: one call, shared by the samples that wait for it."""
        if endpoint.info is None:
            endpoint.info = asyncio.create_task(self._fetch_range(endpoint, metadata, deadline, trial))
            endpoint.info.add_done_callback(functools.partial(_forget_failed_info, endpoint))
        if endpoint.info.done():
            return endpoint.info.result()
        # Shielded: a waiter that gives up (its deadline, a cancel) leaves the call to the others.
        return await asyncio.wait_for(asyncio.shield(endpoint.info), max(0.0, deadline - time.monotonic()))

    async def _fetch_range(
        self, endpoint: _Endpoint, metadata: tuple[tuple[str, str], ...], deadline: float, trial: bool
    ) -> ScoreRange:
        assert endpoint.stub is not None
        timeout = max(0.0, deadline - time.monotonic())
        request = reward_service_pb2.InfoRequest()
        try:
            info = await endpoint.stub.Info(request, timeout=timeout, metadata=metadata, wait_for_ready=trial)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise
            log.warning("%s: endpoint %s has no Info: its scores are not range-checked", self._who(), endpoint.address)
            return UNBOUNDED
        return declared_range(info)

    def _failed_call(self, endpoint: _Endpoint, exc: grpc.aio.AioRpcError, sid: str, rpc: str) -> float:
        code, where = exc.code(), f"endpoint {endpoint.address}"
        detail = f"{code.name}: {exc.details()}"
        if rpc != "ScoreBatch":
            detail = f"{rpc} {detail}"
        if code in RETRIED_CODES:
            endpoint.breaker.record_failure()
            if endpoint.info is not None and endpoint.info.done():
                endpoint.info = None  # it may come back as another version: ask its Info again
            if "CERTIFICATE_VERIFY_FAILED" in detail:  # retried (the CA may be fixed), but say what to fix
                detail += " (check caFile: it did not sign the endpoint's certificate)"
            raise _Retry(f"{where}: {detail}")
        endpoint.breaker.record_success()  # it answered: the endpoint is up, the call is wrong
        error_class = INVALID if code == grpc.StatusCode.INVALID_ARGUMENT else FUNCTION
        hint = " (check tokenSecret/tokenFile)" if code == grpc.StatusCode.UNAUTHENTICATED else ""
        raise ScoreFailure(error_class, f"{self._who()}: {where} refused sample {sid!r}: {detail}{hint}")

    def _answer(
        self, endpoint: _Endpoint, reply: reward_service_pb2.ScoreBatchResponse, sid: str, bounds: ScoreRange
    ) -> float:
        where = f"{self._who()}: endpoint {endpoint.address}"
        ids = [s.sample_id for s in reply.scores]
        if ids != [sid]:
            raise ScoreFailure(FUNCTION, f"{where} answered {ids} for sample {sid!r}, not exactly that sample")
        score = reply.scores[0]
        if not score.HasField("error"):
            low, high = bounds
            if math.isfinite(score.score) and not low <= score.score <= high:  # non-finite: the caller's check
                raise ScoreFailure(
                    FUNCTION,
                    f"{where}: sample {sid!r}: score {score.score!r} is outside the range "
                    f"[{low!r}, {high!r}] its Info declares",
                )
            return score.score
        error = score.error
        message = f"{where}: sample {sid!r}: {error.message or 'no message'}"
        if error.function:
            message += f" (its function {error.function!r})"
        if error.error_class == TRANSIENT:
            raise _Retry(message)
        raise ScoreFailure(error.error_class if error.error_class in (INVALID, FUNCTION) else FUNCTION, message)

    def _stub(self, endpoint: _Endpoint) -> reward_service_pb2_grpc.RewardServiceStub:
        if endpoint.stub is None:  # created on the event loop that uses it
            # Reconnect well within resetSeconds, so a trial finds a recovered endpoint.
            backoff_ms = int(min(10.0, max(0.1, self.config.reset_seconds / 2)) * 1000)
            options = [
                *CLIENT_OPTIONS,
                ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
                ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
                ("grpc.max_reconnect_backoff_ms", backoff_ms),
            ]
            if self.credentials is None:
                endpoint.channel = grpc.aio.insecure_channel(endpoint.address, options=options)
            else:
                endpoint.channel = grpc.aio.secure_channel(endpoint.address, self.credentials, options=options)
            endpoint.stub = reward_service_pb2_grpc.RewardServiceStub(endpoint.channel)
        return endpoint.stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self.token is None:
            return ()
        try:
            token = self.token.read()
        except OSError as exc:  # a Secret being re-mounted
            raise ScoreFailure(TRANSIENT, f"{self._who()}: cannot read its bearer token: {exc}") from exc
        return (("authorization", f"Bearer {token}"),)

    def _backoff(self, attempt: int) -> float:
        base = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)  # jitter keeps retries of a burst apart

    def _outstanding(self) -> list[int]:
        return [e.outstanding for e in self.endpoints]

    def _open_breakers(self) -> str:
        parts = [
            f"{e.address} trial call in flight"
            if e.breaker.state == "half-open"
            else f"{e.address} tried again in {e.breaker.retry_in():.1f}s"
            for e in self.endpoints
        ]
        return f"circuit breaker open for every endpoint ({', '.join(parts)})"

    def _who(self) -> str:
        return f"remote reward {self.name!r}"

    async def close(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.info is not None:
                endpoint.info.cancel()
                endpoint.info = None
            if endpoint.channel is not None:
                await endpoint.channel.close(None)
            endpoint.channel = endpoint.stub = None


def _forget_failed_info(endpoint: _Endpoint, task: asyncio.Task[ScoreRange]) -> None:
    """A failed Info call is asked again by the next sample (and its error counts as retrieved)."""
    if (task.cancelled() or task.exception() is not None) and endpoint.info is task:
        endpoint.info = None


def _credentials(name: str, config: RemoteReward) -> grpc.ChannelCredentials | None:
    if not config.tls:
        if config.ca_file:
            raise RewardConfigError(f"reward function {name!r}: caFile is set but tls is false")
        return None
    roots = None
    if config.ca_file:
        try:
            roots = Path(config.ca_file).read_bytes()
        except OSError as exc:
            raise RewardConfigError(f"reward function {name!r}: cannot read caFile {config.ca_file!r}: {exc}") from exc
    return grpc.ssl_channel_credentials(root_certificates=roots)
