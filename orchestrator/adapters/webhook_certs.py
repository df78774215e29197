"""The admission webhook's self-managed certificates: one CA and serving certificate in a Secret
shared by every replica (so all of them serve under the CA injected into the webhook
configuration), created, renewed and kept on disk and in the configuration's caBundle.

The Secret and the configuration are reached through the `SecretStore` and `inject` the caller
supplies (orchestrator/adapters/kube.py, wired in cli): this module makes no API calls itself.
`cryptography` is imported only here, and only when self-managed certificates are used.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.adapters.webhook import ServingCert

__all__ = [
    "CA_VALIDITY",
    "CERT_VALIDITY",
    "RENEW_BEFORE",
    "CertBundle",
    "SecretStore",
    "SelfManaged",
    "ensure_certificate",
    "self_managed_hosts",
]

log = logging.getLogger(__name__)

#: Lifetimes of the self-managed CA and serving certificate, and when the latter is renewed.
CA_VALIDITY = datetime.timedelta(days=3650)
CERT_VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class CertBundle:
    """The self-managed CA and serving certificate, as stored in the Secret (PEM)."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes

    def data(self) -> dict[str, bytes]:
        """As Secret data (type kubernetes.io/tls keys plus the CA)."""
        return {
            "ca.crt": self.ca_cert,
            "ca.key": self.ca_key,
            "tls.crt": self.cert,
            "tls.key": self.key,
        }

    @classmethod
    def from_data(cls, data: Mapping[str, bytes]) -> CertBundle | None:
        """From Secret data; None when a key is missing."""
        try:
            return cls(data["ca.crt"], data["ca.key"], data["tls.crt"], data["tls.key"])
        except KeyError:
            return None

    def write(self, directory: Path) -> ServingCert:
        """tls.crt and tls.key into directory (key mode 0600), replaced atomically."""
        for name, content in (("tls.key", self.key), ("tls.crt", self.cert)):
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            os.replace(tmp, directory / name)
        return ServingCert(directory / "tls.crt", directory / "tls.key")


class SecretStore(Protocol):
    """The one Secret that holds the self-managed CA and serving certificate."""

    def read(self) -> tuple[dict[str, bytes], str] | None:
        """Its data and resourceVersion, or None when it does not exist."""

    def create(self, data: dict[str, bytes]) -> bool:
        """Create it; False when it already exists (another replica was first)."""

    def replace(self, data: dict[str, bytes], resource_version: str) -> bool:
        """Replace its data if still at resource_version; False when stale."""


def self_managed_hosts(service: str, namespace: str, extra: Sequence[str]) -> list[str]:
    """The names the serving certificate covers: the Service's DNS names, then extra ones."""
    names = [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]
    return list(dict.fromkeys([*names, *extra]))


def ensure_certificate(
    store: SecretStore,
    hosts: Sequence[str],
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
) -> CertBundle:
    """The CA and serving certificate every replica serves with, created or renewed as needed.

    The Secret is read first: a usable pair (serving cert valid for more than RENEW_BEFORE,
    covering `hosts`, signed by the stored CA) is used as is. Otherwise the stored CA (when
    itself valid) signs a new serving cert, or a new CA is made. Writes are conditional, so
    replicas starting together converge on one pair.
    """
    for _ in range(5):
        found = store.read()
        if found is None:
            bundle = _issue(None, hosts, now())
            if store.create(bundle.data()):
                log.info("webhook: created a self-managed CA and serving certificate")
                return bundle
            continue
        data, version = found
        current = CertBundle.from_data(data)
        if current is not None and _usable(current, hosts, now()):
            return current
        bundle = _issue(current, hosts, now())
        if store.replace(bundle.data(), version):
            log.info("webhook: renewed the self-managed serving certificate")
            return bundle
    raise RuntimeError("webhook: the certificate Secret kept changing under us; giving up")


def _usable(bundle: CertBundle, hosts: Sequence[str], now: datetime.datetime) -> bool:
    from cryptography import x509  # noqa: PLC0415  (only self-managed certificates need it)
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415

    try:
        ca = x509.load_pem_x509_certificate(bundle.ca_cert)
        cert = x509.load_pem_x509_certificate(bundle.cert)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
        return False
    covered = {str(n) for n in sans.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in sans.get_values_for_type(x509.IPAddress)
    }
    return (
        cert.not_valid_after_utc - now > RENEW_BEFORE
        and ca.not_valid_after_utc - now > RENEW_BEFORE
        and all(_canonical(h) in covered for h in hosts)
    )


def _canonical(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _issue(current: CertBundle | None, hosts: Sequence[str], now: datetime.datetime) -> CertBundle:
    """A serving cert for hosts, signed by current's CA when still valid, else by a new CA."""
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_cert: x509.Certificate | None = None
    ca_key: ec.EllipticCurvePrivateKey | None = None
    if current is not None:
        try:
            ca_cert = x509.load_pem_x509_certificate(current.ca_cert)
            loaded = serialization.load_pem_private_key(current.ca_key, None)
            ca_key = loaded if isinstance(loaded, ec.EllipticCurvePrivateKey) else None
        except (ValueError, TypeError):
            ca_cert = ca_key = None
        if ca_cert is not None and ca_cert.not_valid_after_utc - now <= RENEW_BEFORE * 2:
            ca_cert = ca_key = None
    if ca_cert is None or ca_key is None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-orchestrator webhook CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + CA_VALIDITY)
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
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        # The names are in the SANs (a CN holds at most 64 characters; clients ignore it).
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleet-orchestrator")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + CERT_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return CertBundle(
        ca_cert.public_bytes(serialization.Encoding.PEM),
        pem_key(ca_key),
        cert.public_bytes(serialization.Encoding.PEM),
        pem_key(key),
    )


class SelfManaged:
    """Keeps the served certificate and the injected CA bundle current, in a daemon thread.

    Every `interval` seconds (every `retry` seconds while the last round failed): ensure the
    Secret's pair (renewing it when due), rewrite the served files when it changed, and inject
    the CA into the ValidatingWebhookConfiguration (`inject`; a no-op when already there).
    """

    def __init__(
        self,
        store: SecretStore,
        hosts: Sequence[str],
        inject: Callable[[bytes], None] | None,
        directory: Path,
        interval: float = 3600.0,
        retry: float = 30.0,
    ) -> None:
        self.store, self.hosts, self.inject = store, list(hosts), inject
        self.directory, self.interval, self.retry = directory, interval, retry
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.bundle = ensure_certificate(store, self.hosts)
        self.cert = self.bundle.write(directory)
        self.injected = False

    def refresh(self) -> None:
        """One round: the Secret's pair to disk, the CA into the configuration."""
        bundle = ensure_certificate(self.store, self.hosts)
        if bundle != self.bundle:
            bundle.write(self.directory)
            self.bundle = bundle
        if self.inject is not None:
            self.inject(bundle.ca_cert)
        self.injected = True

    def run(self, stop: threading.Event) -> None:
        """Refresh until stop is set (start it as a daemon thread)."""
        while not stop.is_set():
            try:
                self.refresh()
            except Exception as err:
                self.injected = False
                log.warning(
                    "webhook certificate round failed (retrying in %.0fs): %s", self.retry, err
                )
            stop.wait(self.interval if self.injected else self.retry)
