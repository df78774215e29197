"""The orchestrator's HTTP endpoint: /metrics, /healthz (the loop and watches alive), /readyz."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["Probes", "serve"]

#: The reconcile loop is considered wedged when it has not come round for this long.
STALL_SECONDS = 300.0


class Probes:
    """What /healthz and /readyz answer; the controller and elector update it."""

    def __init__(self, stall_seconds: float = STALL_SECONDS) -> None:
        self.stall_seconds = stall_seconds
        self._beat = time.monotonic()
        self._lock = threading.Lock()
        #: Returns "" when healthy, else why not (set once the controller exists).
        self.liveness: Callable[[], str] = lambda: ""
        #: Returns "" when ready, else why not.
        self.readiness: Callable[[], str] = lambda: ""
        self.role = "starting"

    def beat(self) -> None:
        """The reconcile loop came round."""
        with self._lock:
            self._beat = time.monotonic()

    def healthz(self) -> str:
        """Empty when alive, else the reason."""
        with self._lock:
            idle = time.monotonic() - self._beat
        if self.role == "leader" and idle > self.stall_seconds:
            return f"the reconcile loop has not come round for {idle:.0f}s"
        return self.liveness() if self.role == "leader" else ""

    def readyz(self) -> str:
        """Empty when ready: a leader with synced caches, or a standby waiting for the Lease."""
        if self.role == "standby":
            return ""
        if self.role != "leader":
            return "starting"
        return self.readiness()


def serve(host: str, port: int, registry: CollectorRegistry, probes: Probes) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz in a background thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                self._verdict(probes.healthz())
            elif path == "/readyz":
                self._verdict(probes.readyz())
            else:
                self._send(404, b"not found\n", "text/plain")

        def _verdict(self, problem: str) -> None:
            if problem:
                self._send(503, f"{problem}\n".encode(), "text/plain")
            else:
                self._send(200, b"ok\n", "text/plain")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
