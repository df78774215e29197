"""Test PKI: a throw-away CA with a server certificate (127.0.0.1, localhost) and client certs."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertPair", "TestPKI", "generate_pki"]

_VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class CertPair:
    """One certificate and its key, as files and as PEM bytes."""

    cert_file: str
    key_file: str
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class TestPKI:
    """A CA, a server cert signed by it, a client cert signed by it, and a stranger's client."""

    __test__ = False  # not a pytest test class

    ca_file: str
    ca_pem: bytes
    server: CertPair
    client: CertPair
    other_ca_file: str  # a second, unrelated CA
    other_ca_pem: bytes
    stranger: CertPair  # a client cert signed by the unrelated CA


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fleetupgrade tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _make_ca(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = _name(common_name)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    server: bool,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    builder = (
        _builder(_name(common_name), ca.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertPair:
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = _key_pem(key)
    cert_file = directory / f"{stem}.crt"
    key_file = directory / f"{stem}.key"
    cert_file.write_bytes(cert_pem)
    key_file.write_bytes(key_pem)
    key_file.chmod(0o600)
    return CertPair(str(cert_file), str(key_file), cert_pem, key_pem)


def generate_pki(directory: Path) -> TestPKI:
    """Writes a fresh CA, server cert (SAN localhost, 127.0.0.1, ::1) and client certs."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _make_ca("fleetupgrade test CA")
    other, other_key = _make_ca("unrelated test CA")
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    other_pem = other.public_bytes(serialization.Encoding.PEM)
    (directory / "ca.crt").write_bytes(ca_pem)
    (directory / "other-ca.crt").write_bytes(other_pem)
    server = _write(directory, "server", *_issue(ca, ca_key, "plugin.test", server=True))
    client = _write(directory, "client", *_issue(ca, ca_key, "orchestrator", server=False))
    stranger = _write(directory, "stranger", *_issue(other, other_key, "stranger", server=False))
    return TestPKI(
        ca_file=str(directory / "ca.crt"),
        ca_pem=ca_pem,
        server=server,
        client=client,
        other_ca_file=str(directory / "other-ca.crt"),
        other_ca_pem=other_pem,
        stranger=stranger,
    )
