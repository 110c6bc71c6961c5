"""User servers with a lock (#66): `serve_function` and `serve_environment` take the job's token and TLS (a
`ServerLock`, or RLJOB_TOKEN_FILE, RLJOB_TLS_CERT and RLJOB_TLS_KEY), each started here as a process of its own
with a certificate made here. A call without the token, or with a wrong one, is refused UNAUTHENTICATED; a
plain-text call gets nowhere; and the real `rljob run`, with the job's `tls: true`, `caFile` and token
(`tokenSecret` for the reward, `tokenFile` for the environment), trains against each to a 5-step mean of 0.8."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from example_job import example_job
from lock_doors import (
    TOKEN,
    Lock,
    doors,
    environment_episode,
    environment_info,
    expected,
    make_lock,
    reward_info,
    reward_score,
)

from rljob_api.workercfg import TOKEN_FILE_ENV
from rljob_workers.common.auth import TokenError
from rljob_workers.common.server_lock import TLS_CERT_ENV, TLS_KEY_ENV, LockError, ServerLock, load_lock
from rljob_workers.driver.telemetry.metrics import first_reaching, read_metrics

from conftest import REPO, run_until_learned

RLJOB = str(Path(sys.executable).parent / "rljob")


@pytest.fixture(scope="module")
def lock(tmp_path_factory: pytest.TempPathFactory) -> Lock:
    return make_lock(tmp_path_factory.mktemp("lock"))


# -- the lock's options: refused in one line naming what is wrong ----------------------------------------


def test_a_lock_that_cannot_be_used_is_refused_naming_the_argument_variable_or_file(lock: Lock, tmp_path: Path) -> None:
    with pytest.raises(LockError, match="token or token_file, not both"):
        ServerLock(token="a", token_file=lock.token)
    with pytest.raises(LockError, match="token is empty"):
        ServerLock(token=" ")
    with pytest.raises(LockError, match="tls_cert is set but tls_key is not"):
        ServerLock(tls_cert=lock.tls.cert)
    with pytest.raises(LockError, match="RLJOB_TLS_KEY is set but RLJOB_TLS_CERT is not"):
        ServerLock.from_env({"RLJOB_TLS_KEY": str(lock.tls.key)})
    with pytest.raises(TokenError, match="job token file '/nonexistent/token' does not exist"):
        load_lock(ServerLock(token_file="/nonexistent/token"))
    with pytest.raises(LockError, match=r"tls_cert: cannot read '/nonexistent/cert\.pem'"):
        load_lock(ServerLock(tls_cert="/nonexistent/cert.pem", tls_key=lock.tls.key))
    with pytest.raises(LockError, match="are not a PEM certificate chain and its private key"):
        load_lock(ServerLock(tls_cert=lock.tls.ca, tls_key=lock.tls.key))  # the CA's certificate, the server's key
    encrypted = tmp_path / "encrypted.key"
    key = serialization.load_pem_private_key(lock.tls.key.read_bytes(), None)
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(LockError, match="is encrypted: gRPC takes a key without a passphrase"):
        load_lock(ServerLock(tls_cert=lock.tls.cert, tls_key=encrypted))  # never a prompt on the terminal


def test_the_environment_names_the_lock_and_without_it_the_server_says_it_is_open(lock: Lock) -> None:
    named = ServerLock.from_env(lock.env())
    assert named == ServerLock(token_file=str(lock.token), tls_cert=str(lock.tls.cert), tls_key=str(lock.tls.key))
    loaded = load_lock(named)
    assert loaded.token == TOKEN and loaded.tls is not None
    assert loaded.summary == f"calls need the job's token (from {str(lock.token)!r}); TLS ({str(lock.tls.cert)!r})"
    assert ServerLock.from_env({}) == ServerLock() and load_lock(ServerLock()).token is None
    assert load_lock(ServerLock()).summary.startswith("open: no token, no TLS")


def test_the_docs_name_the_locks_arguments_and_variables_as_the_code_does() -> None:
    variables = (TOKEN_FILE_ENV, TLS_CERT_ENV, TLS_KEY_ENV)
    assert variables == ("RLJOB_TOKEN_FILE", "RLJOB_TLS_CERT", "RLJOB_TLS_KEY")
    guides = ["docs/security.md", "docs/rewards.md", "docs/environments.md"]
    readmes = [f"examples/{name}-server-ts/README.md" for name in ("reward", "environment")]
    for doc in guides + readmes:
        text = (REPO / doc).read_text()
        assert all(f"`{name}`" in text for name in variables), doc
    for doc in guides:
        text = (REPO / doc).read_text()
        assert "ServerLock(" in text and "lock=" in text, doc
    security = (REPO / "docs" / "security.md").read_text()
    assert all(f"{field.name}=" in security for field in dataclasses.fields(ServerLock))


def test_the_typescript_examples_share_one_lock_file() -> None:
    """examples/*-server-ts/src/lock.ts read the same variables the same way: one file, copied, kept equal."""
    reward, environment = (
        REPO / "examples" / f"{name}-server-ts" / "src" / "lock.ts" for name in ("reward", "environment")
    )
    assert reward.read_text() == environment.read_text(), "copy one examples/*/src/lock.ts over the other"
    for name in ("RLJOB_TOKEN_FILE", "RLJOB_TLS_CERT", "RLJOB_TLS_KEY"):
        assert f'"{name}"' in reward.read_text(), name


# -- a user's servers, each a process of its own -------------------------------------------------------

REWARD_SERVER = """
import sys
from rljob_workers.reward import ServerLock, serve_function
from rljob_workers.tasks.arithmetic import exact_match

token, cert, key = sys.argv[1:]
serve_function(exact_match, name="exact-match", port=0, host="127.0.0.1",
               lock=ServerLock(token_file=token, tls_cert=cert, tls_key=key))
"""
ENVIRONMENT_SERVER = (
    "from rljob_workers.environment import serve_environment; "
    "serve_environment('rljob_workers.tasks.calculator:Calculator', port=0, host='127.0.0.1')"
)


@contextlib.contextmanager
def server(command: list[str], env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """A user's server process; yields its host:port and what it said of its lock; stopped with SIGTERM."""
    with subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True, cwd=REPO) as proc:
        try:
            assert proc.stdout is not None
            line, summary = proc.stdout.readline(), proc.stdout.readline()
            assert " serving on 127.0.0.1:" in line, line
            yield line.split()[-1], summary.strip()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, "the server stops cleanly on SIGTERM"
        finally:
            proc.kill()


@pytest.fixture(scope="module")
def reward_server(lock: Lock) -> Iterator[str]:
    """serve_function locked by its arguments (a ServerLock)."""
    args = [str(lock.token), str(lock.tls.cert), str(lock.tls.key)]
    with server([sys.executable, "-c", REWARD_SERVER, *args], {}) as (address, summary):
        assert summary.startswith("calls need the job's token") and "TLS" in summary, summary
        yield address


@pytest.fixture(scope="module")
def environment_server(lock: Lock) -> Iterator[str]:
    """serve_environment locked by the environment variables the docs name (no argument)."""
    with server([sys.executable, "-c", ENVIRONMENT_SERVER], lock.env()) as (address, summary):
        assert summary.startswith("calls need the job's token") and "TLS" in summary, summary
        yield address


def test_serve_function_refuses_a_call_without_the_jobs_token(reward_server: str, lock: Lock) -> None:
    calls = [reward_info, reward_score]
    assert doors(reward_server, lock, calls) == expected(calls)


def test_serve_environment_refuses_a_call_without_the_jobs_token(environment_server: str, lock: Lock) -> None:
    calls = [environment_info, environment_episode]
    assert doors(environment_server, lock, calls) == expected(calls)


# -- a job against each, under the real `rljob run` ------------------------------------------------------


def learn(job: Path, out: Path) -> list[dict[str, Any]]:
    """`rljob run` the job until its 5-step mean reward reaches 0.8 (then SIGINT, a graceful stop); its steps."""
    metrics, log = out / "metrics.jsonl", out.parent / f"{out.name}.log"
    command = [RLJOB, "run", str(job), "--no-display", "--output", str(out)]
    rc = run_until_learned(command, log, metrics, 0.8, 5).returncode
    assert rc in (0, 128 + signal.SIGINT), log.read_text()[-3000:]
    records = read_metrics(metrics)
    print(f"{job.parent.name}: rewards {[round(r['reward_mean'], 2) for r in records]}")
    assert records[0]["reward_mean"] <= 0.3, records[0]["reward_mean"]  # it starts weak
    assert first_reaching(records, 0.8, 5) is not None, [r["reward_mean"] for r in records[-5:]]
    return records


@pytest.mark.ray
def test_a_job_trains_against_serve_function_over_tls_with_its_token_secret(
    reward_server: str, lock: Lock, example_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped example scored by the user's server only: `tls: true`, `caFile` and `tokenSecret` (read, as
    in a pod, from the Secret's mount: $RLJOB_SECRETS_DIR/<function>/<key>)."""
    secrets = tmp_path / "secrets"
    (secrets / "exact-match").mkdir(parents=True)
    (secrets / "exact-match" / "token").write_text(TOKEN)
    remote = {
        "endpoints": [reward_server],
        "tls": True,
        "caFile": str(lock.tls.ca),
        "tokenSecret": {"name": "judge-token", "key": "token"},
    }
    reward = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())["spec"]["reward"]
    reward["functions"] = [{"name": "exact-match", "kind": "remote", "remote": remote}]
    job = example_job(tmp_path / "reward-tls", example_model, {"totalSteps": 100}, reward=reward)
    monkeypatch.setenv("RLJOB_SECRETS_DIR", str(secrets))  # the run's environment, as the operator's mount is
    learn(job, tmp_path / "reward-tls" / "out")


@pytest.mark.ray
def test_a_job_trains_against_serve_environment_over_tls_with_its_token_file(
    environment_server: str, lock: Lock, calculator: dict[str, Path], tmp_path: Path
) -> None:
    """The tool example with its calculator served by the user's process: `tls: true`, `caFile`, `tokenFile`."""
    doc = yaml.safe_load((REPO / "examples" / "calculator.yaml").read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(calculator["model"]), str(calculator["data"])
    spec["data"].pop("eval")
    spec["checkpoint"]["dir"] = str(tmp_path / "checkpoints")
    remote = {"endpoints": [environment_server], "tls": True, "caFile": str(lock.tls.ca), "tokenFile": str(lock.token)}
    spec["environment"] = {**spec["environment"], "kind": "remote", "remote": remote}
    del spec["environment"]["class"]
    job = tmp_path / "environment-tls" / "job.yaml"
    job.parent.mkdir()
    job.write_text(yaml.safe_dump(doc))
    learn(job, tmp_path / "environment-tls" / "out")
