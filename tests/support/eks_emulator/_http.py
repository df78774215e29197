"""The loopback HTTP plumbing the AWS emulators share: a threaded server whose requests go to
one dispatch function (method, path, query, headers, body) -> (status, headers, payload)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Answer", "Dispatch", "LoopbackServer"]

Answer = tuple[int, Mapping[str, str], bytes]
Dispatch = Callable[[str, str, dict[str, list[str]], Mapping[str, str], bytes], Answer]


class LoopbackServer:
    """Serves dispatch on 127.0.0.1 (a free port) in a thread between start() and stop()."""

    def __init__(self, dispatch: Dispatch) -> None:
        self._dispatch = dispatch
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        dispatch = self._dispatch

        class _Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, payload = dispatch(
                    method, unquote(url.path), parse_qs(url.query), headers, body
                )
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "use the emulator as a context manager"
        return f"http://127.0.0.1:{self._server.server_address[1]}"
