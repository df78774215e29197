"""The KubeFleet plugin's Prometheus client: a failing Prometheus is named and classified in the
messages that reach CheckWorkloads answers and conditions; what it answered is logged, redacted
(issue 19, item 5)."""

from __future__ import annotations

import http.server
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from plugins.kubefleet.prometheus import PrometheusError, query_vector
from tests.support.loopback import serving

TOKEN = "kf-token-0c9e4471"
MARKER = "prom-internal-5a2b"


class _Echo(http.server.BaseHTTPRequestHandler):
    status = 400

    def do_GET(self) -> None:
        body = (
            '{"status":"error","errorType":"bad_data","error":"headers '
            + repr(dict(self.headers)).replace('"', "'")
            + f' {MARKER}"}}'
        ).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(params=[400, 200])
def echo(request: pytest.FixtureRequest) -> Iterator[str]:
    """Answers 400, or 200 with status error: both echo the headers and a secret."""
    handler = type("Echo", (_Echo,), {"status": request.param})
    with serving(handler) as url:
        yield url


def test_an_echoing_prometheus_is_classified_and_logged_redacted(
    echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with pytest.raises(PrometheusError) as info:
        query_vector(echo, "up", token=TOKEN, name="the central Prometheus")
    words = str(info.value)
    assert words.startswith("the central Prometheus: query "), words
    assert MARKER not in words and TOKEN not in words and "127.0.0.1" not in words
    assert MARKER in caplog.text and TOKEN not in caplog.text


def test_an_unreachable_prometheus_says_so_without_its_address() -> None:
    with pytest.raises(PrometheusError) as info:
        query_vector("http://127.0.0.1:1", "up")
    assert str(info.value) == "Prometheus: unreachable"
