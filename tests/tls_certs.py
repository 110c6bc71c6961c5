"""Certificates made in a test: a CA, and a server certificate it signs for 127.0.0.1 (the `cryptography`
package, installed with the dev extras)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return builder.not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(
        now + datetime.timedelta(hours=1)
    )


def make_ca(tmp: Path, name: str) -> tuple[Any, Any, Path]:
    """A CA key and certificate, the certificate written to tmp/<name>.pem."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, name)])
    cert = (
        _validity(x509.CertificateBuilder()).subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    path = tmp / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def server_certificate(ca_key: Any, ca_cert: Any) -> tuple[bytes, bytes]:
    """A leaf certificate for 127.0.0.1 signed by the CA: (key PEM, certificate PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "judge.rljob.test")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class TlsFiles:
    """A server's certificate and key for 127.0.0.1, the CA a job verifies it with (`caFile`), and another CA."""

    ca: Path
    cert: Path
    key: Path
    other_ca: Path


def tls_files(folder: Path) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1 it signs, written under `folder` as PEM files."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert, ca = make_ca(folder, "ca")
    _, _, other_ca = make_ca(folder, "other-ca")
    key_pem, cert_pem = server_certificate(ca_key, ca_cert)
    (folder / "server.pem").write_bytes(cert_pem)
    (folder / "server.key").write_bytes(key_pem)
    (folder / "server.key").chmod(0o600)
    return TlsFiles(ca, folder / "server.pem", folder / "server.key", other_ca)
