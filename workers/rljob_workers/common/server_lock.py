"""The lock on a server a user runs for a job (`serve_function`, `serve_environment`, and the helpers to come):
the job's bearer token, and TLS. One set of options, read one way, so that every helper takes the same.

A job's `remote` reward or environment sends its token (`tokenSecret`, `tokenFile`) over TLS (`tls`, `caFile`).
The server checks it with the interceptor rljob's own servers use (`auth.TokenCheck`: UNAUTHENTICATED without it,
`grpc.health.v1` open for probes) and serves TLS with the given certificate and key. Given no lock, a helper reads
it from the environment: `RLJOB_TOKEN_FILE` (the variable the operator sets in a `kind: image` environment's
container), `RLJOB_TLS_CERT` and `RLJOB_TLS_KEY`; none set, the server is open (and says so).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

from rljob_api.workercfg import TOKEN_FILE_ENV
from rljob_workers.common.auth import read_token

# The server's certificate chain and its private key (PEM files), when it serves TLS.
TLS_CERT_ENV = "RLJOB_TLS_CERT"
TLS_KEY_ENV = "RLJOB_TLS_KEY"

StrPath = str | os.PathLike[str]


class LockError(ValueError):
    """A server lock that cannot be used; the message names the argument, variable or file."""


@dataclass(frozen=True)
class ServerLock:
    """The job's token callers must send (`token`, or `token_file` holding it) and the TLS certificate chain
    and key the server serves with (`tls_cert`, `tls_key`, PEM files; both or neither). All unset: open."""

    token: str | None = None
    token_file: StrPath | None = None
    tls_cert: StrPath | None = None
    tls_key: StrPath | None = None

    def __post_init__(self) -> None:
        if self.token is not None and self.token_file is not None:
            raise LockError("give the job's token as token or token_file, not both")
        if self.token is not None and not self.token.strip():
            raise LockError("token is empty: an empty token would let every caller in")
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise LockError(f"{given} is set but {missing} is not: TLS needs the certificate and its key")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ServerLock:
        """The lock the process's environment names: RLJOB_TOKEN_FILE, RLJOB_TLS_CERT, RLJOB_TLS_KEY."""
        cert, key = environ.get(TLS_CERT_ENV) or None, environ.get(TLS_KEY_ENV) or None
        if (cert is None) != (key is None):
            given, missing = (TLS_CERT_ENV, TLS_KEY_ENV) if key is None else (TLS_KEY_ENV, TLS_CERT_ENV)
            raise LockError(f"{given} is set but {missing} is not: TLS needs the certificate and its key")
        return cls(token_file=environ.get(TOKEN_FILE_ENV) or None, tls_cert=cert, tls_key=key)

    def read_token(self) -> str | None:
        """The token calls must carry, read from `token_file` if that is how it was given; None when open."""
        if self.token_file is not None:
            return read_token(os.fspath(self.token_file))  # a TokenError naming the file when missing or empty
        return self.token.strip() if self.token is not None else None

    def tls_credentials(self) -> grpc.ServerCredentials | None:
        """The server's TLS credentials from `tls_cert` and `tls_key`, checked to be a certificate and its own
        key (grpc would only fail at the first handshake); None without TLS."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        cert, key = _read(self.tls_cert, "tls_cert"), _read(self.tls_key, "tls_key")

        def no_password() -> str:  # without it OpenSSL would ask for one on the terminal, and wait
            raise LockError(f"tls_key {str(self.tls_key)!r} is encrypted: gRPC takes a key without a passphrase")

        try:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.tls_cert, self.tls_key, password=no_password)
        except ssl.SSLError as exc:
            raise LockError(
                f"tls_cert {str(self.tls_cert)!r} and tls_key {str(self.tls_key)!r} are not a PEM certificate "
                f"chain and its private key: {exc.reason or exc}"
            ) from None
        return grpc.ssl_server_credentials([(key, cert)])

    def summary(self) -> str:
        """What a caller needs, in a few words, for the server's start-up line."""
        if self.token_file is not None:
            token = f"the job's token (from {str(self.token_file)!r})"
        else:
            token = "the job's token" if self.token is not None else ""
        tls = f"TLS ({str(self.tls_cert)!r})" if self.tls_cert is not None else ""
        if token and tls:
            return f"calls need {token}; {tls}"
        if token:
            return f"calls need {token}; no TLS"
        if tls:
            return f"{tls}; no token: anyone who reaches the port may call it"
        return (
            f"open: no token, no TLS (lock it with `lock=ServerLock(...)`, or {TOKEN_FILE_ENV}, {TLS_CERT_ENV} "
            f"and {TLS_KEY_ENV})"
        )


@dataclass(frozen=True)
class LoadedLock:
    """A lock with its files read: what a server starts with (`start_server`'s `token` and `tls`)."""

    token: str | None
    tls: grpc.ServerCredentials | None
    summary: str


def load_lock(lock: ServerLock | None) -> LoadedLock:
    """`lock`, or without one the lock the environment names, its token and TLS files read now: a helper calls
    this before it binds its port, so that a missing or wrong file fails at once, naming it."""
    lock = ServerLock.from_env() if lock is None else lock
    return LoadedLock(lock.read_token(), lock.tls_credentials(), lock.summary())


def _read(path: StrPath, argument: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise LockError(f"{argument}: cannot read {str(path)!r}: {exc.strerror}") from None
