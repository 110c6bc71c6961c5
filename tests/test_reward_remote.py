"""The `remote` reward kind over real gRPC on 127.0.0.1: its breaker and balancer, fail-over, deadlines,
the score range an endpoint's Info declares, TLS and the bearer token."""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from reward_helpers import (
    FUNCTION,
    INVALID,
    TRANSIENT,
    fn,
    free_port,
    function_set,
    rule_server,
    run,
    sample,
    scored_total,
    started,
)

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.reward import RewardConfigError, RewardFunctionSet
from rljob_workers.reward.breaker import Balancer, CircuitBreaker
from rljob_workers.reward.remote import RemoteScorer
from rljob_workers.reward.server import SERVICE_NAME, RewardServicer


class RangedServicer(RewardServicer):
    """rljob's RewardService whose Info declares `score_range` (None: Info answers UNIMPLEMENTED)."""

    def __init__(self, functions: RewardFunctionSet, score_range: tuple[float, float] | None) -> None:
        super().__init__(functions, name="len", max_in_flight=64)
        self.score_range = score_range
        self.info_calls = 0

    async def Info(
        self, request: reward_service_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reward_service_pb2.InfoResponse:
        self.info_calls += 1
        if self.score_range is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this service has no Info")
        info = await super().Info(request, context)
        info.min_score, info.max_score = self.score_range
        return info


async def ranged_server(score_range: tuple[float, float] | None, port: int = 0) -> tuple[RunningServer, RangedServicer]:
    """A RewardService scoring len(completion), whose Info declares `score_range`."""
    functions = RewardFunctionSet.from_spec([fn("len", "rule", function="reward_fns:length")], 10.0)
    servicer = RangedServicer(functions, score_range)
    service = Service(reward_service_pb2_grpc.add_RewardServiceServicer_to_server, servicer, SERVICE_NAME)
    running = await start_server([service], "127.0.0.1", port)
    started.append(running)
    return running, servicer


# -- remote: breaker and balancer (pure) ----------------------------------------------------------


def test_breaker_opens_half_opens_once_and_closes() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failure_threshold=2, reset_seconds=10, clock=lambda: now[0])
    breaker.record_failure()
    assert breaker.state == "closed" and breaker.acquire()
    breaker.record_failure()
    assert breaker.state == "open" and not breaker.acquire() and breaker.retry_in() == 10
    now[0] = 10.0
    assert breaker.state == "half-open" and breaker.acquire()
    assert not breaker.acquire(), "one trial call at a time"
    breaker.record_failure()  # the trial failed: open again for another resetSeconds
    assert breaker.state == "open" and breaker.retry_in() == 10
    now[0] = 20.0
    assert breaker.acquire()
    breaker.release()  # the trial's caller gave up: someone else may try
    assert breaker.acquire()
    breaker.record_success()
    assert (breaker.state, breaker.failures) == ("closed", 0)


def test_balancer_least_outstanding_round_robin_skips_open() -> None:
    breakers = [CircuitBreaker(1, 60) for _ in range(3)]
    balancer = Balancer(3)
    assert [balancer.pick(breakers, [0, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]
    assert balancer.pick(breakers, [3, 1, 2]) == 1
    breakers[1].record_failure()
    assert balancer.pick(breakers, [3, 1, 2]) == 2
    assert balancer.pick(breakers, [0, 0, 0], avoid=frozenset({0, 2})) == 0  # only avoided ones are left
    for b in breakers:
        b.record_failure()
    assert balancer.pick(breakers, [0, 0, 0]) is None


# -- remote over gRPC ----------------------------------------------------------------------------


def test_remote_scores_and_passes_function_errors_on() -> None:
    async def go() -> None:
        good, good_servicer = await rule_server()
        bad, _ = await rule_server("reward_fns:boom")
        remote = [
            fn("far", "remote", endpoints=[f"127.0.0.1:{good.port}"]),
            fn("boom", "remote", 0.0, endpoints=[f"127.0.0.1:{bad.port}"]),
        ]
        async with function_set(remote[0]) as fs:
            ok = await fs.score(sample("p/0", answer="42"))
            assert (ok.score, dict(ok.components), ok.HasField("error")) == (1.0, {"far": 1.0}, False)
            invalid = await fs.score(sample(""))  # the endpoint refuses the call: INVALID_ARGUMENT
            assert invalid.error.error_class == INVALID and "empty sample_id" in invalid.error.message
        async with function_set(remote[1]) as fs:
            failed = await fs.score(sample("p/1"))
            assert failed.error.error_class == FUNCTION and failed.error.function == "boom"
            message = failed.error.message
            assert f"remote reward 'boom': endpoint 127.0.0.1:{bad.port}: sample 'p/1'" in message
            assert "raised ValueError" in message and "its function 'exact'" in message
        assert scored_total(good_servicer) == 1
        for server in (good, bad):
            await server.stop(None)

    run(go())


def test_remote_fails_over_and_an_open_breaker_fails_fast() -> None:
    async def go() -> None:
        live, servicer = await rule_server()
        dead = f"127.0.0.1:{free_port()}"
        judge = fn("judge", "remote", endpoints=[dead, f"127.0.0.1:{live.port}"], failureThreshold=2, resetSeconds=60)
        async with function_set(judge) as fs:
            scores = [await fs.score(sample(f"p/{i}", answer="42")) for i in range(6)]
            assert [s.score for s in scores] == [1.0] * 6 and not any(s.HasField("error") for s in scores)
            scorer = fs.scorers[0]
            assert isinstance(scorer, RemoteScorer)
            assert [e.breaker.state for e in scorer.endpoints] == ["open", "closed"]
            assert scorer.endpoints[0].breaker.failures == 2, "calls stop going to an open endpoint"
        assert scored_total(servicer) == 6
        await live.stop(None)

        only_dead = fn("judge", "remote", endpoints=[dead], failureThreshold=1, resetSeconds=60)
        async with function_set(only_dead) as fs:
            first = await fs.score(sample("p/0"))
            assert first.error.error_class == TRANSIENT and dead in first.error.message
            start = time.perf_counter()
            second = await fs.score(sample("p/1"))
            assert time.perf_counter() - start < 0.1, "an open breaker does not wait for the endpoint"
            assert second.error.error_class == TRANSIENT and second.error.function == "judge"
            assert f"sample 'p/1' not sent: circuit breaker open for every endpoint ({dead} tried again in" in (
                second.error.message
            )

    run(go())


def test_remote_half_open_trial_closes_the_breaker_when_the_endpoint_is_back() -> None:
    async def go() -> None:
        port = free_port()
        judge = fn("judge", "remote", endpoints=[f"127.0.0.1:{port}"], failureThreshold=1, resetSeconds=0.5)
        async with function_set(judge) as fs:
            assert (await fs.score(sample("p/0"))).error.error_class == TRANSIENT
            scorer = fs.scorers[0]
            assert isinstance(scorer, RemoteScorer) and scorer.endpoints[0].breaker.state == "open"
            server, _ = await rule_server(port=port)  # the endpoint comes back
            assert "circuit breaker open" in (await fs.score(sample("p/1"))).error.message
            await asyncio.sleep(0.55)
            trial = await fs.score(sample("p/2", answer="42"))
            assert trial.score == 1.0 and not trial.HasField("error")
            assert scorer.endpoints[0].breaker.state == "closed"
            await server.stop(None)

    run(go())


def test_remote_deadline_is_the_jobs_timeout() -> None:
    async def go() -> None:
        slow, _ = await rule_server("reward_fns:slow")
        judge = fn("judge", "remote", endpoints=[f"127.0.0.1:{slow.port}"])
        async with function_set(judge, timeout=0.3) as fs:
            start = time.perf_counter()
            result = await fs.score(sample("p/0", delay="3"))
            assert 0.3 <= time.perf_counter() - start < 1.0
            assert result.error.error_class == TRANSIENT
            assert "sample 'p/0' not scored within 0.3s" in result.error.message
            assert "DEADLINE_EXCEEDED" in result.error.message
        await slow.stop(None)

    run(go())


def test_remote_spreads_concurrent_samples_over_endpoints() -> None:
    async def go() -> None:
        servers = [await rule_server("reward_fns:slow") for _ in range(2)]
        judge = fn("judge", "remote", endpoints=[f"127.0.0.1:{s.port}" for s, _ in servers])
        async with function_set(judge) as fs:
            scores = await asyncio.gather(*(fs.score(sample(f"p/{i}", delay="0.2")) for i in range(20)))
            assert all(s.score == 1.0 for s in scores)
        assert [scored_total(servicer) for _, servicer in servers] == [10, 10]
        for server, _ in servers:
            await server.stop(None)

    run(go())


def test_remote_refuses_a_score_outside_the_range_its_info_declares() -> None:
    async def go() -> None:
        port = free_port()
        address = f"127.0.0.1:{port}"
        server, servicer = await ranged_server((0.0, 3.0), port)
        servers = [server]
        remote = fn("len", "remote", endpoints=[address], failureThreshold=1, resetSeconds=0.5)
        try:
            async with function_set(remote) as fs:
                inside = await asyncio.gather(*(fs.score(sample(f"p/{i}", "abc"[:i])) for i in range(4)))
                assert [s.score for s in inside] == [0.0, 1.0, 2.0, 3.0], "both bounds are inside"
                assert not any(s.HasField("error") for s in inside)
                assert servicer.info_calls == 1, "concurrent first samples share one Info call"
                over = await fs.score(sample("p/4", "12345"))
                assert (over.error.error_class, over.error.function, dict(over.components)) == (FUNCTION, "len", {})
                assert over.error.message == (
                    f"remote reward 'len': endpoint {address}: sample 'p/4': score 5.0 is outside the range "
                    "[0.0, 3.0] its Info declares"
                )
                assert servicer.info_calls == 1, "Info is asked once, not per sample"
                await server.stop(None)
                assert (await fs.score(sample("p/5"))).error.error_class == TRANSIENT
                server, servicer = await ranged_server((0.0, 10.0), port)  # back, as a version with a wider range
                servers.append(server)
                await asyncio.sleep(0.55)  # resetSeconds: the next call is the breaker's trial
                back = await fs.score(sample("p/6", "12345"))
                assert back.score == 5.0 and not back.HasField("error"), back.error.message
                assert servicer.info_calls == 1, "the endpoint that came back was asked its Info again"
        finally:
            for running in servers:
                await running.stop(None)

    run(go())


@pytest.mark.parametrize(
    ("score_range", "says"),
    [
        ((0.0, 0.0), ""),  # both bounds unset: no range declared
        (None, ""),  # no Info at all (UNIMPLEMENTED)
        ((-math.inf, math.inf), ""),
        ((3.0, 1.0), "sample 'p/0' not sent: its Info declares the empty score range [3.0, 1.0]"),
    ],
    ids=["unset", "unimplemented", "unbounded", "empty"],
)
def test_remote_without_a_usable_info_range(score_range: tuple[float, float] | None, says: str) -> None:
    async def go() -> None:
        server, servicer = await ranged_server(score_range)
        try:
            async with function_set(fn("len", "remote", endpoints=[f"127.0.0.1:{server.port}"])) as fs:
                results = [await fs.score(sample(f"p/{i}", "12345")) for i in range(2)]
        finally:
            await server.stop(None)
        if not says:  # only finiteness is checked
            assert [r.score for r in results] == [5.0, 5.0] and not any(r.HasField("error") for r in results)
            assert servicer.info_calls == 1
            return
        assert [r.error.error_class for r in results] == [FUNCTION, FUNCTION] and not results[0].score
        assert says in results[0].error.message and "remote reward 'len'" in results[0].error.message
        assert servicer.info_calls == 2, "a bad Info is asked again: the endpoint may have been fixed"
        assert scored_total(servicer) == 0, "no sample is sent to an endpoint whose range is empty"

    run(go())


# -- remote: TLS and bearer token ----------------------------------------------------------------


def self_signed(tmp: Path) -> tuple[bytes, bytes, Path]:
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "rljob-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp / "ca.pem").write_bytes(cert_pem)
    return key_pem, cert_pem, tmp / "ca.pem"


class _RequireToken(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_service(self, continuation: Callable[..., Any], details: grpc.HandlerCallDetails) -> Any:
        if ("authorization", f"Bearer {self.token}") in tuple(details.invocation_metadata or ()):
            return await continuation(details)

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad or missing bearer token")

        return grpc.unary_unary_rpc_method_handler(deny)


async def tls_server(key: bytes, cert: bytes, token: str) -> tuple[grpc.aio.Server, int]:
    functions = RewardFunctionSet.from_spec([fn("exact", "rule", function="reward_fns:exact")], 5.0)
    server = grpc.aio.server(interceptors=[_RequireToken(token)])
    reward_service_pb2_grpc.add_RewardServiceServicer_to_server(
        RewardServicer(functions, name="exact", max_in_flight=8), server
    )
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    return server, port


@pytest.fixture
def secrets_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "secrets"
    monkeypatch.setenv("RLJOB_SECRETS_DIR", str(root))
    yield root


def test_remote_tls_and_bearer_token_from_file_and_secret(tmp_path: Path, secrets_dir: Path) -> None:
    key, cert, ca = self_signed(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    (secrets_dir / "judge").mkdir(parents=True)
    (secrets_dir / "judge" / "api-key").write_text("s3cret")

    async def go() -> None:
        server, port = await tls_server(key, cert, "s3cret")
        common: dict[str, Any] = {"endpoints": [f"127.0.0.1:{port}"], "tls": True, "caFile": str(ca)}
        from_file = fn("judge", "remote", **common, tokenFile=str(token_file))
        from_secret = fn("judge", "remote", **common, tokenSecret={"name": "judge-token", "key": "api-key"})
        for function in (from_file, from_secret):
            async with function_set(function) as fs:
                result = await fs.score(sample("p/0", answer="42"))
                assert result.score == 1.0 and not result.HasField("error"), result.error.message
        async with function_set(from_file) as fs:
            token_file.write_text("rotated-wrong")  # a rotated Secret is read again
            denied = await fs.score(sample("p/1", answer="42"))
            assert denied.error.error_class == FUNCTION
            assert "UNAUTHENTICATED: bad or missing bearer token (check tokenSecret/tokenFile)" in denied.error.message
        await server.stop(None)

    run(go())


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"tokenFile": "/nonexistent/token"}, "bearer token file '/nonexistent/token' does not exist"),
        ({"tokenSecret": {"name": "s", "key": "k"}}, "bearer token file '{secrets}/judge/k' does not exist"),
        ({"caFile": "/x/ca.pem"}, "caFile is set but tls is false"),
        ({"tls": True, "caFile": "/nonexistent/ca.pem"}, "cannot read caFile '/nonexistent/ca.pem'"),
    ],
)
def test_remote_config_errors_name_the_function(config: dict[str, Any], says: str, secrets_dir: Path) -> None:
    with pytest.raises(RewardConfigError, match="reward function 'judge'") as info:
        RewardFunctionSet.from_spec([fn("judge", "remote", endpoints=["127.0.0.1:1"], **config)], 1.0)
    assert says.format(secrets=secrets_dir) in str(info.value)


# -- disrm ---------------------------------------------------------------------------------------
