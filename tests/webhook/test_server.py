"""The webhook's HTTPS server (orchestrator/adapters/webhook.py) and certificates
(webhook_certs.py), over real TLS on loopback: a self-managed CA and serving certificate shared
through one Secret (an in-memory Secret with resourceVersions here; the real one in
test_apiserver.py), renewal, and reloading of cert-manager style files."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import shutil
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from orchestrator import api
from orchestrator.adapters.webhook import ServingCert, WebhookServer
from orchestrator.adapters.webhook_certs import (
    CERT_VALIDITY,
    RENEW_BEFORE,
    CertBundle,
    SelfManaged,
    ensure_certificate,
    self_managed_hosts,
)
from tests.support.certs import generate_pki
from tests.support.kube import wait_for

HOSTS = ["fleet-orchestrator-webhook.fleet-upgrade-system.svc", "127.0.0.1"]


class MemorySecret:
    """webhook.SecretStore with the apiserver's rules: create fails when it exists, replace
    fails when the resourceVersion moved."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] | None = None
        self.version = 0
        self.writes = 0
        self._lock = threading.Lock()

    def read(self) -> tuple[dict[str, bytes], str] | None:
        with self._lock:
            return None if self.data is None else (dict(self.data), str(self.version))

    def create(self, data: dict[str, bytes]) -> bool:
        with self._lock:
            if self.data is not None:
                return False
            self.data, self.version, self.writes = dict(data), self.version + 1, self.writes + 1
            return True

    def replace(self, data: dict[str, bytes], resource_version: str) -> bool:
        with self._lock:
            if str(self.version) != resource_version:
                return False
            self.data, self.version, self.writes = dict(data), self.version + 1, self.writes + 1
            return True


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def cert_of(bundle: CertBundle) -> x509.Certificate:
    return x509.load_pem_x509_certificate(bundle.cert)


def test_the_first_replica_creates_the_pair_and_the_next_ones_reuse_it() -> None:
    store = MemorySecret()
    first = ensure_certificate(store, HOSTS)
    second = ensure_certificate(store, HOSTS)
    assert second == first and store.writes == 1
    cert = cert_of(first)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(first.ca_cert))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [HOSTS[0]]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]


def test_replicas_starting_together_converge_on_one_pair() -> None:
    store = MemorySecret()
    got: list[CertBundle] = []
    threads = [
        threading.Thread(target=lambda: got.append(ensure_certificate(store, HOSTS)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and len(set(got)) == 1 and store.writes == 1


def test_the_serving_certificate_is_renewed_before_it_expires_under_the_same_ca() -> None:
    store = MemorySecret()
    first = ensure_certificate(store, HOSTS)
    late = now() + CERT_VALIDITY - RENEW_BEFORE + datetime.timedelta(days=1)
    renewed = ensure_certificate(store, HOSTS, now=lambda: late)
    assert renewed.ca_cert == first.ca_cert and renewed.cert != first.cert
    assert cert_of(renewed).not_valid_after_utc > late + RENEW_BEFORE
    assert ensure_certificate(store, HOSTS, now=lambda: late) == renewed  # once


def test_a_new_name_gets_a_new_certificate_under_the_same_ca() -> None:
    store = MemorySecret()
    first = ensure_certificate(store, HOSTS)
    wider = ensure_certificate(store, [*HOSTS, "localhost"])
    assert wider.ca_cert == first.ca_cert and wider.cert != first.cert
    sans = cert_of(wider).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)


def test_a_secret_that_does_not_hold_a_usable_pair_is_replaced() -> None:
    store = MemorySecret()
    store.data = {"tls.crt": b"junk", "tls.key": b"junk"}
    bundle = ensure_certificate(store, HOSTS)
    assert store.data == bundle.data() and store.version == 1


def test_names_longer_than_a_common_name_allows_are_covered() -> None:
    namespace = "a-namespace-whose-name-is-long-enough-to-overflow-a-common-name"
    hosts = self_managed_hosts("fleet-orchestrator-webhook", namespace, [])
    bundle = ensure_certificate(MemorySecret(), hosts)
    sans = cert_of(bundle).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == hosts


def test_self_managed_hosts_are_the_service_names_then_the_extra_ones() -> None:
    assert self_managed_hosts("svc", "ns", ["127.0.0.1", "svc.ns.svc"]) == [
        "svc.ns.svc",
        "svc.ns.svc.cluster.local",
        "127.0.0.1",
    ]


# -- serving -----------------------------------------------------------------------------------


def post(port: int, ca: bytes, body: Any, path: str = "/validate") -> tuple[int, dict[str, Any]]:
    context = ssl.create_default_context(cadata=ca.decode())
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}",
        data=data,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, context=context, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def peer_fingerprint(port: int, ca: bytes) -> str:
    context = ssl.create_default_context(cadata=ca.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return hashlib.sha256(der).hexdigest()


@pytest.fixture
def self_managed(tmp_path: Path) -> Iterator[tuple[WebhookServer, SelfManaged]]:
    injected: list[bytes] = []
    managed = SelfManaged(MemorySecret(), HOSTS, injected.append, tmp_path)
    server = WebhookServer("127.0.0.1", 0, managed.cert).start()
    yield server, managed
    server.stop()


def review_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": api.GROUP, "version": api.VERSION, "kind": api.KIND},
            "operation": "CREATE",
            "namespace": "ns",
            "name": "fleet",
            "object": {"metadata": {"name": "fleet"}, "spec": spec},
        },
    }


SPEC = {
    "requiredAvailableCount": 1,
    "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
    "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}],
}


def test_the_server_answers_admission_reviews_over_tls_trusted_by_the_ca(
    self_managed: tuple[WebhookServer, SelfManaged],
) -> None:
    server, managed = self_managed
    ca = managed.bundle.ca_cert
    code, answer = post(server.port, ca, review_of(SPEC))
    assert code == 200 and answer["response"] == {"uid": "u-1", "allowed": True}
    code, answer = post(server.port, ca, review_of({**SPEC, "requiredAvailableCount": 2}))
    assert code == 200 and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith("spec.requiredAvailableCount: ")
    # /mutate: who asked, stamped as a JSON patch (always allowed, even for an invalid spec).
    signed = review_of({**SPEC, "requiredAvailableCount": 2})
    signed["request"]["userInfo"] = {"username": "alice", "groups": ["system:authenticated"]}
    code, answer = post(server.port, ca, signed, path="/mutate")
    assert code == 200 and answer["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert patch[0]["value"][api.ANNOTATION_REQUESTED_BY_USER] == "alice"
    assert post(server.port, ca, review_of(SPEC), path="/other")[0] == 404
    assert post(server.port, ca, b"not json")[0] == 400
    assert post(server.port, ca, {"kind": "Pod"})[0] == 400


def test_a_client_that_does_not_trust_the_ca_is_not_served(
    self_managed: tuple[WebhookServer, SelfManaged],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, managed = self_managed
    stranger = generate_pki(tmp_path / "other").ca_pem
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        post(server.port, stranger, review_of(SPEC))
    # The failed handshake is one log line (no traceback on stderr), and the server goes on.
    wait_for(
        "the failed handshake logged",
        lambda: any(
            "webhook connection from 127.0.0.1 failed" in r.message for r in caplog.records
        ),
        timeout=10,
    )
    assert post(server.port, managed.bundle.ca_cert, review_of(SPEC))[0] == 200


def test_a_refresh_serves_the_renewed_certificate_and_injects_the_ca(
    tmp_path: Path,
) -> None:
    store = MemorySecret()
    injected: list[bytes] = []
    managed = SelfManaged(store, HOSTS, injected.append, tmp_path / "served")
    server = WebhookServer("127.0.0.1", 0, managed.cert).start()
    try:
        ca = managed.bundle.ca_cert
        before = peer_fingerprint(server.port, ca)
        managed.refresh()
        assert injected == [ca] and peer_fingerprint(server.port, ca) == before
        # Another replica writes a new serving certificate (here: one that covers one more name).
        renewed = ensure_certificate(store, [*HOSTS, "localhost"])
        assert renewed.ca_cert == ca
        managed.refresh()
        after = peer_fingerprint(server.port, ca)
        assert after != before
        assert after == hashlib.sha256(cert_of(renewed).public_bytes(_der())).hexdigest()
    finally:
        server.stop()


def _der() -> Any:
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.DER


def test_cert_manager_style_files_are_reloaded_when_they_change(tmp_path: Path) -> None:
    """--webhook-cert-dir: a renewal rewrites tls.crt/tls.key; new connections get it."""
    one, two = generate_pki(tmp_path / "one"), generate_pki(tmp_path / "two")
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    shutil.copy(one.server.cert_file, mounted / "tls.crt")
    shutil.copy(one.server.key_file, mounted / "tls.key")
    server = WebhookServer(
        "127.0.0.1", 0, ServingCert(mounted / "tls.crt", mounted / "tls.key")
    ).start()
    try:
        assert post(server.port, one.ca_pem, review_of(SPEC))[0] == 200
        for name, source in (("tls.key", two.server.key_file), ("tls.crt", two.server.cert_file)):
            staged = mounted / f".{name}"
            shutil.copy(source, staged)
            staged.replace(mounted / name)
        assert post(server.port, two.ca_pem, review_of(SPEC))[0] == 200
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            post(server.port, one.ca_pem, review_of(SPEC))
    finally:
        server.stop()


def test_unusable_files_fail_at_start_not_at_the_first_request(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("junk")
    (tmp_path / "tls.key").write_text("junk")
    with pytest.raises(ssl.SSLError):
        ServingCert(tmp_path / "tls.crt", tmp_path / "tls.key")
