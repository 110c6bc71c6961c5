"""Reward kinds over real gRPC on 127.0.0.1 and real tiny torch models: remote, disrm, genrm, the judge, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import math
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2
from rljob_api.reward import RewardFunction
from rljob_api.workercfg import RewardWorkerConfig
from rljob_workers.common.grpc_server import RunningServer, Service, start_server
from rljob_workers.reward import RewardConfigError, RewardFunctionSet, serve_reward
from rljob_workers.reward.breaker import Balancer, CircuitBreaker
from rljob_workers.reward.disrm import DisRMScorer
from rljob_workers.reward.genrm import GenRMScorer, fill_template, parse_score
from rljob_workers.reward.remote import RemoteScorer
from rljob_workers.reward.server import SERVICE_NAME, RewardServicer, start_reward_server

INVALID = sample_pb2.ERROR_CLASS_INVALID
FUNCTION = sample_pb2.ERROR_CLASS_FUNCTION
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT
CHARS = list("0123456789+-=*/ abcdefghijklmnopqrstuvwxyz?.,:")
T = TypeVar("T")


# -- helpers -------------------------------------------------------------------------------------


# Servers the helpers below started in the current `run`; stopped when it ends, even when a test
# fails half-way (a server left running keeps asyncio.run from returning, so the test would hang).
_started: list[RunningServer] = []


def run(coro: Awaitable[T], timeout: float = 60) -> T:
    async def guarded() -> T:
        try:
            return await asyncio.wait_for(coro, timeout)
        finally:
            servers, _started[:] = list(_started), []
            await asyncio.gather(*(s.stop(None) for s in servers), return_exceptions=True)

    return asyncio.run(guarded())


def fn(name: str, kind: str, weight: float = 1.0, *, judge_only: bool = False, **config: Any) -> RewardFunction:
    spec = {"name": name, "kind": kind, "weight": weight, "judgeOnly": judge_only, kind: config}
    return RewardFunction.model_validate(spec)


def sample(sid: str, completion: str = "42", prompt: str = "6*7=", **fields: str) -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(
        sample_id=sid, prompt_id=sid.split("/")[0], prompt=prompt, completion=completion, fields=fields
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def function_set(*functions: RewardFunction, timeout: float = 5.0) -> AsyncIterator[RewardFunctionSet]:
    fs = await asyncio.to_thread(RewardFunctionSet.from_spec, list(functions), timeout)
    try:
        yield fs
    finally:
        await fs.aclose()


async def rule_server(ref: str = "reward_fns:exact", port: int = 0) -> tuple[RunningServer, RewardServicer]:
    functions = RewardFunctionSet.from_spec([fn("exact", "rule", function=ref)], 10.0)
    running, servicer = await start_reward_server(functions, name="exact", max_in_flight=64, port=port)
    _started.append(running)
    return running, servicer


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
    _started.append(running)
    return running, servicer


def scored_total(servicer: RewardServicer) -> float:
    return servicer.metrics.registry.get_sample_value("rljob_reward_scored_total") or 0.0


def char_tokenizer(path: Path) -> dict[str, int]:
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    special = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(path)
    return vocab


def scripted_judge(path: Path, script: dict[str, str], default: str = "</s>", *, unsure_after: str = "") -> Path:
    """A Llama with no layers: logits depend on the last token only, so `script` (token -> next) is what it says.

    After `unsure_after` it hesitates: the scripted token leads every other by about 0.7 (of logit), so
    it is the greedy choice but only about 4% of the samples at temperature 1.
    """
    vocab = char_tokenizer(path)
    n = len(vocab)
    config = LlamaConfig(
        vocab_size=n, hidden_size=n, intermediate_size=8, num_hidden_layers=0, num_attention_heads=1,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(n))
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(n, n)
        for token, index in vocab.items():
            # Final-norm output of a one-hot embedding is sqrt(n) at its token: 0.1 is a lead of about 0.7.
            head[vocab[script.get(token, default)], index] = 0.1 if token == unsure_after else 30.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    return path


def tiny_rm(path: Path, seed: int = 0) -> Path:
    """A random char-level LlamaForSequenceClassification with one label: a reward model."""
    vocab = char_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    config.num_labels = 1
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).eval().save_pretrained(path)
    return path


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


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_rm(tmp_path_factory.mktemp("rm"))


def test_disrm_batches_concurrent_requests_and_matches_unbatched_scores(rm_dir: Path) -> None:
    async def go() -> None:
        rm = fn("rm", "disrm", modelPath=str(rm_dir), batchSize=4, maxWaitMs=200)
        async with function_set(rm) as fs:
            scorer = fs.scorers[0]
            assert isinstance(scorer, DisRMScorer)
            samples = [sample(f"p/{i}", completion="x" * (i + 1) + str(i)) for i in range(10)]
            scores = await asyncio.gather(*(fs.score(s) for s in samples))
            assert sorted(scorer.batch_sizes) == [2, 4, 4], "10 concurrent requests, batches of at most 4"
            alone = [scorer.forward([(s.prompt, s.completion)])[0] for s in samples]
            assert [s.components["rm"] for s in scores] == pytest.approx(alone, abs=1e-5)
            assert len({round(a, 4) for a in alone}) == 10, "the model tells the samples apart"
            start = time.perf_counter()
            await fs.score(sample("q/0"))  # alone: waits maxWaitMs for company, no longer
            assert 0.2 <= time.perf_counter() - start < 1.0 and scorer.batch_sizes[-1] == 1

    run(go())


def test_disrm_config_errors(tmp_path: Path) -> None:
    with pytest.raises(RewardConfigError, match=r"reward function 'rm': cannot load the disrm model at '/nonexistent'"):
        RewardFunctionSet.from_spec([fn("rm", "disrm", modelPath="/nonexistent")], 1.0)
    vocab = char_tokenizer(tmp_path)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, pad_token_id=0)  # fmt: skip
    config.num_labels = 3
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(RewardConfigError, match=r"'rm': the disrm model at .* has 3 labels"):
        RewardFunctionSet.from_spec([fn("rm", "disrm", modelPath=str(tmp_path))], 1.0)


# -- genrm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("judges")
    return {
        "seven": scripted_judge(root / "seven", {":": "7", "7": "</s>"}),  # answers "7"
        "yes": scripted_judge(root / "yes", {":": "y", "y": "e", "e": "s"}),  # answers "yes"
        "rambles": scripted_judge(root / "rambles", {":": "a", "a": "b", "b": "c"}),  # answers "abc"
    }


def genrm(name: str, path: Path, parser: str = "number", **extra: Any) -> RewardFunction:
    template = "q {prompt} a {completion} ref {answer} score:"
    return fn(name, "genrm", modelPath=str(path), promptTemplate=template, scoreParser=parser, **extra)


@pytest.mark.parametrize(
    ("parser", "text", "pattern", "expected"),
    [
        ("number", "The score is 7/10.", None, 7.0),
        ("number", " -0.5 points", None, -0.5),
        ("number", "score: 1e-3", None, 0.001),
        ("number", "no digits here", None, None),
        ("yes-no", "Yes, it is.", None, 1.0),
        ("yes-no", "NO", None, 0.0),
        ("yes-no", "yesterday maybe", None, None),
        ("regex", "reasoning... SCORE=0.75 done", r"SCORE=(\S+)", 0.75),
        ("regex", "SCORE=high", r"SCORE=(\S+)", None),
        ("regex", "nothing", r"SCORE=(\S+)", None),
    ],
)
def test_score_parsers(parser: Any, text: str, pattern: str | None, expected: float | None) -> None:
    import re

    assert parse_score(parser, text, re.compile(pattern) if pattern else None) == expected


def test_template_fills_prompt_completion_fields_and_escapes() -> None:
    filled = fill_template("{{json}} {prompt}|{completion}|{answer}", {"prompt": "p", "completion": "c", "answer": "a"})
    assert filled == "{json} p|c|a"
    with pytest.raises(KeyError, match="answer"):
        fill_template("{answer}", {"prompt": "p"})


def test_genrm_scores_with_an_hf_judge_and_parse_failures_are_errors(judges: dict[str, Path]) -> None:
    async def go() -> None:
        functions = [
            genrm("seven", judges["seven"]),
            genrm("verdict", judges["yes"], "yes-no"),
            genrm("ratio", judges["yes"], "regex", scorePattern=r"(\d+)"),
        ]
        async with function_set(*functions[:2]) as fs:
            scores = await asyncio.gather(*(fs.score(sample(f"p/{i}", answer="42")) for i in range(4)))
            assert [dict(s.components) for s in scores] == [{"seven": 7.0, "verdict": 1.0}] * 4
            missing = await fs.score(sample("p/9"))  # the template wants {answer}
            assert missing.error.error_class == INVALID
            assert "needs {answer}, which sample 'p/9' does not have" in missing.error.message
        async with function_set(functions[2]) as fs:
            bad = await fs.score(sample("p/0", answer="42"))
            assert bad.error.error_class == FUNCTION and bad.error.function == "ratio" and not bad.score
            assert "no regex score in the judge's answer for sample 'p/0': 'yes'" in bad.error.message
        async with function_set(genrm("judge", judges["rambles"])) as fs:
            bad = await fs.score(sample("p/1", answer="42"))
            assert bad.error.error_class == FUNCTION and "'p/1'" in bad.error.message and "'abc'" in bad.error.message

    run(go())


def test_genrm_bad_pattern_names_the_function(judges: dict[str, Path]) -> None:
    with pytest.raises(RewardConfigError, match=r"reward function 'g': scorePattern '\(': missing \)"):
        RewardFunctionSet.from_spec([genrm("g", judges["yes"], "regex", scorePattern="(")], 1.0)


# -- the judge in rule functions -----------------------------------------------------------------


def test_rule_with_judge_calls_the_replicas_models(judges: dict[str, Path], rm_dir: Path) -> None:
    async def go() -> None:
        functions = [
            fn("answer", "rule", function="rljob_workers.reward.judge:exact_or_judged"),
            fn("rm-penalised", "rule", function="rljob_workers.reward.judge:length_penalised_rm"),
            genrm("judge", judges["yes"], "yes-no", weight=0.0),
            fn("rm", "disrm", 0.0, modelPath=str(rm_dir), maxWaitMs=1),
        ]
        async with function_set(*functions) as fs:
            exact, judged = await asyncio.gather(
                fs.score(sample("p/0", "42", answer="42")), fs.score(sample("p/1", "41", answer="42"))
            )
            assert (exact.components["answer"], judged.components["answer"]) == (1.0, 0.5)
            assert exact.components["rm-penalised"] == pytest.approx(exact.components["rm"], abs=1e-6)
            assert judged.score == pytest.approx(0.5 + judged.components["rm"], abs=1e-6)

    run(go())


def test_judge_grade_uses_the_genrm_template_and_parse_failures_name_the_rule(judges: dict[str, Path]) -> None:
    async def go() -> None:
        gated = fn("gated", "rule", function="rljob_workers.reward.judge:gated_grade")
        async with function_set(gated, genrm("seven", judges["seven"], weight=0.0)) as fs:
            graded, empty = await asyncio.gather(
                fs.score(sample("p/0", "41", answer="42")), fs.score(sample("p/1", " "))
            )
            assert (graded.components["gated"], empty.components["gated"]) == (7.0, 0.0)
        async with function_set(gated, genrm("rambles", judges["rambles"], weight=0.0)) as fs:
            bad = await fs.score(sample("p/2", "41", answer="42"))
            assert (bad.error.error_class, bad.error.function) == (FUNCTION, "gated")  # the first failure in job order
            assert bad.error.message.startswith("rule 'gated' on sample 'p/2': reward function 'rambles': no number")
            assert "this judge.grade call: 'abc'" in bad.error.message

    run(go())


def sync_judged(prompt: str, completion: str, judge: Any, **_: str) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("test_reward_kinds:sync_judged", "takes a judge, so it must be async"),
        ("rljob_workers.reward.judge:exact_or_judged", "takes a judge, but the job has no disrm or genrm function"),
    ],
)
def test_judge_config_errors(ref: str, says: str) -> None:
    with pytest.raises(RewardConfigError, match=f"reward function 'r': {ref} {says}"):
        RewardFunctionSet.from_spec([fn("r", "rule", function=ref)], 1.0)


def test_judge_only_model_serves_the_judge_and_scores_no_sample(rm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    async def go() -> None:
        functions = [
            fn("rm-penalised", "rule", function="rljob_workers.reward.judge:length_penalised_rm"),
            fn("rm", "disrm", 5.0, modelPath=str(rm_dir), maxWaitMs=1, judge_only=True),  # its weight is ignored
        ]
        async with function_set(*functions) as fs:
            assert fs.names == ["rm-penalised"]
            [scorer] = fs.scorers
            assert isinstance(scorer, DisRMScorer) and fs.judge_only == [scorer]
            samples = [sample(f"p/{i}", "x" * (i + 1)) for i in range(6)]
            scores = [await fs.score(s) for s in samples]
            assert [dict(s.components) for s in scores] == [{"rm-penalised": s.score} for s in scores]
            expected = [scorer.forward([(s.prompt, s.completion)])[0] for s in samples]
            assert [s.score for s in scores] == pytest.approx(expected, abs=1e-5), "the judge called the model"
            assert sum(scorer.batch_sizes) == len(samples), "once per sample, by the judge only"
            close = scorer.close

            async def spy() -> None:
                closed.append(scorer.name)
                await close()

            monkeypatch.setattr(scorer, "close", spy)

    run(go())
    assert closed == ["rm"], "closing the function set closes its judge-only models"


@pytest.mark.parametrize(
    ("functions", "says"),
    [
        (
            [("exact", "rule", {"function": "reward_fns:exact"}), ("rm", "disrm", {"modelPath": "/nonexistent"})],
            "reward function 'rm' is judgeOnly, but no rule function takes a judge to call it",
        ),
        ([("rm", "disrm", {"modelPath": "/nonexistent"})], "every reward function is judgeOnly (['rm'])"),
    ],
    ids=["no rule takes a judge", "nothing scores the samples"],
)
def test_judge_only_config_errors_name_the_function(functions: list[tuple[str, str, Any]], says: str) -> None:
    """Refused before any model is loaded: the model path does not even exist."""
    specs = [fn(name, kind, judge_only=kind == "disrm", **config) for name, kind, config in functions]
    with pytest.raises(RewardConfigError) as info:
        RewardFunctionSet.from_spec(specs, 1.0)
    assert says in str(info.value)


def test_genrm_decodes_greedily_by_default(tmp_path: Path) -> None:
    unsure = scripted_judge(tmp_path / "unsure", {":": "7"}, unsure_after=":")  # "7" is likeliest, yet rarely drawn

    async def go() -> None:
        async with function_set(genrm("g", unsure, sampling={"maxNewTokens": 2})) as fs:  # temperature: default
            one_by_one = [await fs.score(sample(f"p/{i}", answer="42")) for i in range(4)]
            batched = await asyncio.gather(*(fs.score(sample(f"q/{i}", answer="42")) for i in range(4)))
            assert [dict(s.components) for s in [*one_by_one, *batched]] == [{"g": 7.0}] * 8
        async with function_set(genrm("g", unsure, sampling={"temperature": 1, "maxNewTokens": 2})) as fs:
            [scorer] = fs.scorers
            assert isinstance(scorer, GenRMScorer)
            answers = [await scorer.generate("score:", request_id=f"r{i}") for i in range(8)]
            assert len(set(answers)) > 1, f"sampled, this judge's answers vary ({answers}): 7s above are no luck"

    run(go())


# -- the server's metrics ------------------------------------------------------------------------


def test_reward_server_metrics_backlog_latency_errors(rm_dir: Path) -> None:
    async def go() -> None:
        config = RewardWorkerConfig(
            functions=[
                fn("rm", "disrm", modelPath=str(rm_dir), maxWaitMs=1),
                fn("flaky", "rule", 0.0, function="reward_fns:fails_on_odd_length"),
            ],
            timeout_seconds=5,
            max_in_flight=16,
            gpus=0,
        )
        running, servicer = await serve_reward(config, metrics_port=0)
        try:
            from rljob_workers.driver.reward_router import RewardRouter

            router = RewardRouter()
            await router.add_replica("r0", f"127.0.0.1:{running.port}")
            results = await asyncio.gather(*(router.score(sample(f"p/{i}", "x" * i)) for i in range(8)))
            await router.close()
            assert sum(not r.HasField("error") for r in results) == 4
            get = servicer.metrics.registry.get_sample_value
            assert get("rljob_reward_scored_total") == 4 and get("rljob_reward_backlog") == 0
            assert (
                get("rljob_reward_errors_total", {"kind": "rule", "function": "flaky", "error_class": "function"}) == 4
            )
            count = {"kind": "disrm", "function": "rm"}
            assert get("rljob_reward_function_latency_seconds_count", count) == 8
            quantiles = servicer.metrics.latency_quantiles()
            assert set(quantiles) == {"disrm", "rule"} and 0 < quantiles["disrm"]["p50"] <= quantiles["disrm"]["p99"]
            assert servicer.metrics_port is not None
            url = f"http://127.0.0.1:{servicer.metrics_port}/metrics"
            text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
            assert 'rljob_reward_latency_recent_seconds{kind="disrm",quantile="0.99"}' in text
            assert "rljob_reward_backlog 0.0" in text
        finally:
            await running.stop(None)
            await servicer.functions.aclose()

    run(go())
