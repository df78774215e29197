"""orchestrator.adapters.outbound, the HTTP client of hooks and notifications, against a real
HTTP server on loopback: what reaches the receiver, and that a redirect is never followed."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.adapters import outbound


class _Receiver(BaseHTTPRequestHandler):
    """/ok answers 200, /redirect 302 to /elsewhere, /fail 503 with a body; records each POST."""

    seen: list[tuple[str, bytes, str]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.path, body, self.headers.get("Authorization") or ""))
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, answer = (503, b"token=secret echoed") if self.path == "/fail" else (200, b"ok")
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, bytes, str]]]]:
    seen: list[tuple[str, bytes, str]] = []
    handler = type("Handler", (_Receiver,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_post_reaches_the_receiver_with_its_body_and_headers(
    receiver: tuple[str, list[tuple[str, bytes, str]]],
) -> None:
    base, seen = receiver
    answer = outbound.post(
        outbound.opener(None),
        f"{base}/ok",
        b'{"x": 1}',
        {"Authorization": "Bearer t", "Content-Type": "application/json"},
        5.0,
        drain=65536,
    )
    assert answer.ok and answer.status == 200 and answer.body == b""
    assert seen == [("/ok", b'{"x": 1}', "Bearer t")]


def test_a_redirect_is_the_answer_and_nothing_is_sent_where_it_points(
    receiver: tuple[str, list[tuple[str, bytes, str]]],
) -> None:
    base, seen = receiver
    answer = outbound.post(outbound.opener(None), f"{base}/redirect", b"{}", {}, 5.0)
    assert not answer.ok and answer.status == 302
    assert [path for path, _, _ in seen] == ["/redirect"]


def test_an_error_body_is_read_only_when_asked(
    receiver: tuple[str, list[tuple[str, bytes, str]]],
) -> None:
    base, _ = receiver
    via = outbound.opener(None)
    unread = outbound.post(via, f"{base}/fail", b"{}", {}, 5.0)
    read = outbound.post(via, f"{base}/fail", b"{}", {}, 5.0, error_bytes=5)
    assert (unread.status, unread.body) == (503, b"")
    assert (read.status, read.body) == (503, b"token")


def test_a_ca_bundle_that_is_not_pem_is_refused_before_any_request() -> None:
    with pytest.raises(ssl.SSLError):
        outbound.opener("not a certificate")
