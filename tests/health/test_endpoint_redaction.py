"""Endpoint failures classified, not echoed (issue 19, item 5): the fixed words tenants read, the
redaction of what goes to the log, and each caller (Prometheus queries, plugin calls) against
real endpoints on loopback that echo what they were sent."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import socket
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from orchestrator import api
from orchestrator.adapters.analysis import (
    Analyzer,
    PrometheusError,
    PrometheusTarget,
    query_prometheus,
)
from orchestrator.adapters.provider import call_error
from orchestrator.engine.observations import ClusterObs
from plugins.sdk.client import ClientTLS, PluginCallError, PluginClient
from plugins.sdk.endpoint_errors import (
    Failure,
    classify_exception,
    classify_grpc,
    classify_http,
    display_address,
    redact,
    url_secrets,
)
from plugins.sdk.server import PluginServer, ServerTLS, serve
from tests.support.certs import TestPKI, generate_pki
from tests.support.echo_plugin import echo_servicers
from tests.support.loopback import serving

TOKEN = "tok-3f9d1e77c0a2"
MARKER = "SECRET-MARKER-b61c"


# -- redaction ---------------------------------------------------------------------------------


def test_redact_masks_what_we_sent_in_every_spelling() -> None:
    raw = (
        f"seen {TOKEN}; quoted tok-3f9d1e77c0a2%21; b64 {base64.b64encode(TOKEN.encode()).decode()}"
    )
    out = redact(raw, [TOKEN.encode() + b"\n", "tok-3f9d1e77c0a2!"])
    assert TOKEN not in out
    assert base64.b64encode(TOKEN.encode()).decode().rstrip("=") not in out
    assert "%21" not in out
    assert out.startswith("seen ***; quoted ***; b64 ***")


def test_redact_masks_credential_shapes_it_was_not_told_about() -> None:
    raw = (
        "Host: prom\r\nAuthorization: Bearer abc.def-ghi\r\nProxy-Authorization: Basic dXNlcjpw\r\n"
        '{"headers": {"authorization": "Bearer zzz-1"}, "token": "t-42", "password": "hunter2"}'
        " x-api-key=k-9 then bearer qqq-7 and access_token=at-5&next=1"
    )
    out = redact(raw)
    for secret in ("abc.def-ghi", "dXNlcjpw", "zzz-1", "t-42", "hunter2", "k-9", "qqq-7", "at-5"):
        assert secret not in out, (secret, out)
    assert "Host: prom" in out and "next=1" in out  # the rest stays readable
    assert "\n" not in out and "\r" not in out


def test_redact_cuts_long_answers_and_ignores_tiny_values() -> None:
    out = redact("a" * 5000, ["a"])
    assert out == "a" * 499 + "…"


def test_display_address_drops_credentials_path_and_query() -> None:
    assert (
        display_address("https://u:pw@prom.example:9090/x?token=1") == "https://prom.example:9090"
    )
    assert display_address("http://[::1]:9090") == "http://[::1]:9090"
    assert display_address("not a url") == "(address not valid)"


# -- the classification -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (400, "query rejected (HTTP 400)"),
        (422, "query rejected (HTTP 422)"),
        (401, "unauthorized (HTTP 401)"),
        (403, "forbidden (HTTP 403)"),
        (404, "not found (HTTP 404)"),
        (429, "rate limited (HTTP 429)"),
        (503, "unavailable (HTTP 503)"),
        (504, "timeout (HTTP 504)"),
        (500, "server error (HTTP 500)"),
        (302, "redirected (HTTP 302); redirects are not followed"),
    ],
)
def test_http_statuses_have_fixed_reasons(status: int, reason: str) -> None:
    failure = classify_http(status, "query")
    assert failure.code == f"HTTP {status}"
    assert failure.reason == reason


def test_describe_names_the_endpoint_and_the_fix() -> None:
    failure = Failure("HTTP 401", "unauthorized (HTTP 401)", "fix the token")
    assert failure.describe("MetricSource", "team-prom") == (
        "MetricSource team-prom: unauthorized (HTTP 401); fix the token"
    )
    assert failure.describe("", "") == "unauthorized (HTTP 401); fix the token"


@pytest.mark.parametrize(
    ("details", "reason"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.0.0.1:443: Tls "
            "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED",
            "TLS verification failed (UNAVAILABLE)",
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:42803: Custom "
            "verification check failed with error: UNAUTHENTICATED: Hostname Verification Check "
            "failed.",
            "TLS verification failed (UNAVAILABLE)",
        ),
        ("last error: UNAVAILABLE: ipv4:10.0.0.1:443: Socket closed", "unreachable (UNAVAILABLE)"),
        ("ssl handshake: wrong version number", "TLS handshake failed (UNAVAILABLE)"),
    ],
)
def test_grpc_transport_failures_have_fixed_reasons(details: str, reason: str) -> None:
    failure = classify_grpc("UNAVAILABLE", details)
    assert failure.reason == reason
    # Each says what to check: the plugin's address, its certificate, or its TLS settings.
    assert failure.fix.startswith(("check that the plugin", "the plugin's certificate")), failure


def test_grpc_codes_without_an_answer() -> None:
    assert classify_grpc("DEADLINE_EXCEEDED", "Deadline Exceeded").reason == (
        "timeout (DEADLINE_EXCEEDED)"
    )
    assert classify_grpc("UNKNOWN", f"Bearer {TOKEN}").reason == "answer not understood (UNKNOWN)"


# -- real endpoints on loopback ----------------------------------------------------------------


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers 400 with every request header it got and a secret of its own."""

    status = 400

    def do_GET(self) -> None:
        self._echo()

    def do_POST(self) -> None:
        self._echo()

    def _echo(self) -> None:
        body = json.dumps(
            {
                "status": "error",
                "error": f"bad_data: you sent {dict(self.headers)!r}; internal {MARKER}",
            }
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo() -> Iterator[str]:
    with serving(_Echo) as url:
        yield url


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_prometheus_echoing_the_token_is_named_and_classified_and_logged_redacted(
    echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    target = PrometheusTarget(echo, TOKEN.encode(), name="MetricSource team-prom")
    with pytest.raises(PrometheusError) as info:
        query_prometheus(target, "up")
    words = str(info.value)
    assert words == (
        "MetricSource team-prom: query rejected (HTTP 400); the endpoint's answer is logged, "
        "not shown"
    )
    assert echo.split("//")[1] not in words  # a MetricSource's address is the admin's
    assert MARKER in caplog.text  # the raw answer is the operator's, in the log ...
    assert TOKEN not in caplog.text  # ... without the token we sent
    assert "Authorization" in caplog.text


def test_a_check_on_an_echoing_prometheus_fails_with_fixed_words(echo: str) -> None:
    """Through the Analyzer, as the controllers call it: the CheckResult (what status and
    Events are made from) names the source and the class, never the answer."""
    target = PrometheusTarget(echo, TOKEN.encode(), name="MetricSource team-prom")
    analyzer = Analyzer(_no_plugin, _no_secret, lambda mp: target)
    check = api.HealthCheck.model_validate(
        {
            "name": "ratio",
            "metric": {
                "provider": {"type": "prometheus", "sourceRef": {"name": "team-prom"}},
                "query": 'ratio{cluster="{{ cluster }}"}',
                "thresholdRange": {"min": 0.9},
            },
        }
    )
    checks = api.HealthChecks(checks=[check])
    (result,) = analyzer.evaluate(checks, [ClusterObs(id="c-1", control_plane_version="1")], "s")
    assert not result.passed
    text = result.model_dump_json()
    assert "c-1: MetricSource team-prom: query rejected (HTTP 400)" in (result.message or "")
    assert MARKER not in text and TOKEN not in text and "bad_data" not in text


def test_unreachable_and_tls_failures_of_prometheus() -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(PrometheusError) as info:
        query_prometheus(PrometheusTarget(closed), "up")
    assert str(info.value) == f"Prometheus {closed}: unreachable"


def test_tls_verification_failure_is_classified(tmp_path: Path) -> None:
    pki = generate_pki(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server.cert_file, pki.server.key_file)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://localhost:{server.server_address[1]}"
        with pytest.raises(urllib.error.URLError) as info:
            urllib.request.urlopen(url, timeout=5)  # the system CAs do not know the test CA
        assert classify_exception(info.value).reason == "TLS verification failed"
        target = PrometheusTarget(url, ca=pki.other_ca_pem, name="MetricSource x")
        with pytest.raises(PrometheusError) as failed:
            query_prometheus(target, "up")
        assert str(failed.value).startswith("MetricSource x: TLS verification failed")
    finally:
        server.shutdown()
        server.server_close()


def _no_plugin(*args: Any) -> PluginClient:
    raise AssertionError("no plugin in this test")


def _no_secret(ref: api.SecretKeyRef) -> bytes:
    raise AssertionError("no Secret in this test")


# -- plugins: their answers kept, the transport's classified -----------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> TestPKI:
    return generate_pki(tmp_path)


@pytest.fixture
def tls_plugin(pki: TestPKI) -> Iterator[PluginServer]:
    server = serve(
        "127.0.0.1:0",
        echo_servicers(),
        tls=ServerTLS(pki.server.cert_file, pki.server.key_file),
        plugin_name="echo",
        registry=CollectorRegistry(),
    )
    yield server
    server.stop(grace=0.5)


def _error(client: PluginClient) -> PluginCallError:
    with client, pytest.raises(PluginCallError) as info:
        client.info()
    return info.value


def test_a_plugin_behind_an_unknown_ca_reads_as_tls_verification_failed(
    tls_plugin: PluginServer, pki: TestPKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    client = PluginClient(
        tls_plugin.address,
        tls=ClientTLS(ca_file=pki.other_ca_file),
        timeouts={"GetPluginInfo": 3.0},
        plugin_name=tls_plugin.address,  # as orchestrator.adapters.provider.PluginPool names them
    )
    err = call_error(_error(client))
    assert err.code == "UNAVAILABLE"
    assert err.message.startswith(
        f"plugin {tls_plugin.address}: TLS verification failed (UNAVAILABLE); "
    )
    assert "ipv4" not in err.message and "SSL_ERROR" not in err.message
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text  # the transport's words, in the log


def test_an_http_server_that_is_not_a_plugin_leaks_nothing(
    echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    address = echo.removeprefix("http://")
    client = PluginClient(address, timeouts={"GetPluginInfo": 3.0}, plugin_name=address)
    err = call_error(_error(client))
    assert err.message == (
        f"plugin {address}: unreachable (UNAVAILABLE); check that the plugin runs and listens "
        "at this address (the FleetProvider's spec.endpoint, or spec.opsEndpoint.endpoint)"
    )
    assert MARKER not in err.message
    # As text (a Degraded condition's message): the cause first, the code said once.
    assert str(err) == err.message and str(err).count("UNAVAILABLE") == 1


def test_a_plugins_own_answer_keeps_its_reason_and_message() -> None:
    answered = PluginCallError(
        "PreflightUpgrade",
        grpc.StatusCode.FAILED_PRECONDITION,
        "control plane is at 1.29.7; downgrading it to 1.29.0 is not supported",
        reason="DOWNGRADE_NOT_SUPPORTED",
        domain="fleetupgrade.io",
    )
    err = call_error(answered)
    assert err.message == (
        "DOWNGRADE_NOT_SUPPORTED: control plane is at 1.29.7; downgrading it to 1.29.0 is not "
        "supported"
    )
    # As text: the plugin's reason first, the gRPC code once, after it.
    assert str(err) == f"{err.message} (FAILED_PRECONDITION)"


def test_url_secrets_are_the_parts_of_a_url_that_may_be_credentials() -> None:
    url = "https://bot:pa55word@hooks.example/x?sig=abc123&team=a"
    assert set(url_secrets(url)) == {url, "bot", "pa55word", "sig=abc123&team=a", "abc123", "a"}
    out = redact("POST /x?sig=abc123 by bot:pa55word for team=alpha", url_secrets(url))
    assert "abc123" not in out and "pa55word" not in out
