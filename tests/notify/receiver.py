"""A real HTTP(S) webhook receiver on loopback: records what it is sent, can answer 503, hold
requests, or be closed (connection refused) and come back on the same port."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Received", "Receiver"]


@dataclass(frozen=True)
class Received:
    """One request the receiver answered 2xx."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """An HTTP server in a thread. mode: "ok" (204), "503", "hold" (wait until released)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.tls = tls
        self.mode = "ok"
        self.received: list[Received] = []
        self.refused_503 = 0
        #: Requests that reached the handler (whatever the answer).
        self.arrivals = 0
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}/hooks/T0SECRET/B0SECRET/xoxSECRETPATH"

    def start(self) -> Receiver:
        """Listen (again) on the same port."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                with owner._lock:
                    owner.arrivals += 1
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                if owner.mode == "hold":
                    owner.release.wait(30)
                if owner.mode == "503":
                    with owner._lock:
                        owner.refused_503 += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with owner._lock:
                    owner.received.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        if self.tls is not None:
            # The handshake happens in the handler's thread (a failed one closes that socket),
            # not in accept(), where a failure would leak it.
            server.socket = self.tls.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket: senders see connection refused."""
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.json() for r in self.received]

    def requests(self) -> list[Received]:
        with self._lock:
            return list(self.received)
