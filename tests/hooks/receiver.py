"""A real HTTP(S) hook receiver on loopback: answers from a script, records every request."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One request as the receiver saw it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Receiver:
    """Answers POSTs with `script` in order (the last one repeats): (status, body, delay s)."""

    script: list[tuple[int, str, float]] = field(default_factory=lambda: [(200, "ok", 0.0)])
    received: list[Received] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def by_key(self) -> dict[str, int]:
        """Requests per Idempotency-Key."""
        out: dict[str, int] = {}
        for r in self.received:
            key = r.headers.get("idempotency-key", "")
            out[key] = out.get(key, 0) + 1
        return out

    def _answer(self) -> tuple[int, str, float]:
        with self.lock:
            i = min(len(self.received) - 1, len(self.script) - 1)
            return self.script[i]


@contextmanager
def serve(
    receiver: Receiver, cert: tuple[str, str] | None = None, path: str = "/hook"
) -> Iterator[Receiver]:
    """Run the receiver on 127.0.0.1 (HTTPS with cert=(cert, key) files) until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            with receiver.lock:
                receiver.received.append(
                    Received(
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        json.loads(raw or b"{}"),
                    )
                )
            status, body, delay = receiver._answer()
            if delay:
                time.sleep(delay)  # the receiver is slow on purpose (a timeout test)
            data = body.encode()
            try:
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (its timeout)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    scheme = "http"
    if cert is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*cert)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    receiver.url = f"{scheme}://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, name="hook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
