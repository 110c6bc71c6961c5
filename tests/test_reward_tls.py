"""TLS to a remote reward, with a CA and a server certificate made here: a wrong CA, no token and a
wrong token are each refused, with a message that says which."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from reward_helpers import fn, function_set, run, sample

from rljob.v1 import reward_service_pb2_grpc
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.server import RewardServicer


def make_ca(tmp: Path, name: str) -> tuple[Any, Any, Path]:
    """A CA key and certificate, written to tmp/<name>.pem."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    path = tmp / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def server_certificate(ca_key: Any, ca_cert: Any) -> tuple[bytes, bytes]:
    """A leaf certificate for 127.0.0.1 signed by the CA: (key PEM, certificate PEM)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "judge.rljob.test")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def test_remote_tls_refuses_a_wrong_ca_no_token_and_a_wrong_token(tmp_path: Path) -> None:
    """A CA signs the endpoint's certificate; the endpoint checks a bearer token (rljob's own
    interceptor). Trusting another CA, sending no token or a wrong one: each sample is refused, and the
    message says which."""
    from rljob_workers.common.auth import TokenCheck

    ca_key, ca_cert, ca = make_ca(tmp_path, "ca")
    _, _, other_ca = make_ca(tmp_path, "other-ca")
    key, cert = server_certificate(ca_key, ca_cert)
    (tmp_path / "right").write_text("s3cret")
    (tmp_path / "wrong").write_text("guess")

    async def go() -> dict[str, Any]:
        functions = RewardFunctionSet.from_spec([fn("exact", "rule", function="reward_fns:exact")], 5.0)
        server = grpc.aio.server(interceptors=[TokenCheck("s3cret")])
        reward_service_pb2_grpc.add_RewardServiceServicer_to_server(
            RewardServicer(functions, name="exact", max_in_flight=8), server
        )
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        await server.start()
        common: dict[str, Any] = {"endpoints": [f"127.0.0.1:{port}"], "tls": True}
        cases = {
            "right": {**common, "caFile": str(ca), "tokenFile": str(tmp_path / "right")},
            "wrong CA": {**common, "caFile": str(other_ca), "tokenFile": str(tmp_path / "right")},
            "no token": {**common, "caFile": str(ca)},
            "wrong token": {**common, "caFile": str(ca), "tokenFile": str(tmp_path / "wrong")},
        }
        results = {}
        try:
            for case, config in cases.items():
                async with function_set(fn("judge", "remote", **config)) as fs:
                    results[case] = await fs.score(sample("p/0", answer="42"))
        finally:
            await server.stop(None)
        return results

    results = run(go())
    assert results["right"].score == 1.0 and not results["right"].HasField("error")
    for case in ("wrong CA", "no token", "wrong token"):
        assert results[case].HasField("error"), case
    wrong_ca = results["wrong CA"].error.message
    assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca and "(check caFile: it did not sign" in wrong_ca, wrong_ca
    assert "UNAUTHENTICATED" in results["no token"].error.message
    assert "no job token" in results["no token"].error.message
    assert "(check tokenSecret/tokenFile)" in results["no token"].error.message
    assert "wrong job token" in results["wrong token"].error.message
