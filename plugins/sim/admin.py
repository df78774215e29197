"""HTTP admin endpoint of the sim: read the monitor, change health data, reload the fleet file.

Routes (JSON in and out; no authentication, so bind it to loopback):
  GET  /monitor                 the invariant monitor's counts
  GET  /clusters/{id}           one cluster's state, workloads and metrics
  PUT  /clusters/{id}/health    {"workloads": [...] (replaces the list), "metrics": {query:
                                value or null to delete} (merged), "available": bool,
                                "unavailableReason": str}; every key optional
  PUT  /metrics                 fleet-wide metrics, {query: value or null}
  POST /reload                  re-read the --fleet file now
  POST /clusters/{id}/versions  someone else upgrades the cluster: {"controlPlaneVersion":
                                str, "nodePools": {name: version}}; every key optional
  POST /operations/{id}/finish  ends a running (e.g. hung) operation now: {"state":
                                "SUCCEEDED" | "FAILED", "errorCode": str, "errorMessage": str}
  POST /operations/{id}/forget  the plugin forgets the operation (GetOperation: NOT_FOUND)
  PUT  /faults                  replace the fleet file's faults now (same schema as its
                                "faults"); clusters and health data stay as they are
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from plugins.sdk import FailedPrecondition, NotFound
from plugins.sim.config import ConfigError, Faults, WorkloadSpec
from plugins.sim.fleet import Fleet
from plugins.sim.monitor import InvariantMonitor

__all__ = ["AdminServer", "HealthChange", "OperationEnd", "VersionChange"]

_LOG = logging.getLogger("plugins.sim.admin")
_MAX_BODY = 16 * 1024 * 1024


class HealthChange(BaseModel):
    """Body of PUT /clusters/{id}/health."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    workloads: list[WorkloadSpec] | None = None
    metrics: dict[str, float | None] | None = None
    available: bool | None = None
    unavailable_reason: str = ""


class VersionChange(BaseModel):
    """Body of POST /clusters/{id}/versions (an out-of-band upgrade)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    control_plane_version: str | None = None
    node_pools: dict[str, str] | None = None


class OperationEnd(BaseModel):
    """Body of POST /operations/{id}/finish."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    state: Literal["SUCCEEDED", "FAILED"]
    error_code: str = ""
    error_message: str = ""


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AdminServer:
    """Serves the admin routes on HOST:PORT in a daemon thread (port 0 picks a free port)."""

    def __init__(
        self,
        address: str,
        fleet: Fleet,
        monitor: InvariantMonitor,
        reload: Callable[[], None] | None = None,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"--admin-addr: {address!r} is not HOST:PORT; use e.g. 127.0.0.1:8081")
        handler = _handler_class(fleet, monitor, reload)
        try:
            self._httpd = ThreadingHTTPServer((host.strip("[]") or "127.0.0.1", int(port)), handler)
        except OSError as exc:
            raise ValueError(
                f"--admin-addr: cannot listen on {address!r} ({exc.strerror}); pick a free "
                "HOST:PORT"
            ) from None
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self.address = f"{host or '127.0.0.1'}:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="sim-admin",
            daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stops serving."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def _handler_class(
    fleet: Fleet, monitor: InvariantMonitor, reload: Callable[[], None] | None
) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        server_version = "fleet-plugin-sim-admin"

        def log_message(self, format: str, *args: Any) -> None:
            _LOG.debug("admin " + format, *args)

        def _send(self, status: HTTPStatus, body: Any) -> None:
            data = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            if length > _MAX_BODY:
                raise _HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
            raw = self.rfile.read(length) if length else b"{}"
            try:
                return json.loads(raw or b"{}")
            except ValueError:
                raise _HttpError(HTTPStatus.BAD_REQUEST, "body: not valid JSON") from None

        def _dispatch(self, method: str) -> None:
            path = urlsplit(self.path).path.rstrip("/")
            try:
                self._route(method, path)
            except _HttpError as exc:
                self._send(exc.status, {"error": exc.message})
            except NotFound as exc:
                self._send(HTTPStatus.NOT_FOUND, {"error": exc.message})
            except FailedPrecondition as exc:
                self._send(HTTPStatus.CONFLICT, {"error": exc.message})
            except ValidationError as exc:
                problems = [
                    f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                    for e in exc.errors(include_url=False)
                ]
                self._send(HTTPStatus.BAD_REQUEST, {"error": "; ".join(problems)})
            except ConfigError as exc:
                self._send(HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(exc)})

        def _route(self, method: str, path: str) -> None:
            if method == "GET" and path == "/monitor":
                self._send(HTTPStatus.OK, monitor.snapshot())
            elif method == "PUT" and path == "/metrics":
                body = self._body()
                if not isinstance(body, dict):
                    raise _HttpError(HTTPStatus.BAD_REQUEST, "body: expected {query: value}")
                change = HealthChange.model_validate({"metrics": body})
                fleet.set_fleet_metrics(change.metrics or {})
                self._send(HTTPStatus.OK, {"updated": len(change.metrics or {})})
            elif method == "PUT" and path == "/faults":
                fleet.set_faults(Faults.model_validate(self._body()))
                self._send(HTTPStatus.OK, {"faults": "replaced"})
            elif method == "POST" and path == "/reload":
                if reload is None:
                    raise _HttpError(HTTPStatus.CONFLICT, "no --fleet file to reload")
                reload()
                self._send(HTTPStatus.OK, {"reloaded": True})
            elif method == "POST" and path.startswith("/operations/"):
                op_id, _, action = path[len("/operations/") :].rpartition("/")
                if action == "forget" and op_id:
                    op = fleet.forget_operation(unquote(op_id))
                elif action == "finish" and op_id:
                    end = OperationEnd.model_validate(self._body())
                    op = fleet.end_operation(
                        unquote(op_id),
                        succeed=end.state == "SUCCEEDED",
                        error_code=end.error_code,
                        error_message=end.error_message,
                    )
                else:
                    raise _HttpError(HTTPStatus.NOT_FOUND, f"no route {method} {path}")
                self._send(HTTPStatus.OK, json_format.MessageToDict(op))
            elif path.startswith("/clusters/"):
                rest = path[len("/clusters/") :]
                if method == "POST" and rest.endswith("/versions"):
                    cluster_id = unquote(rest[: -len("/versions")])
                    drift = VersionChange.model_validate(self._body())
                    fleet.set_versions(cluster_id, drift.control_plane_version, drift.node_pools)
                    self._send(HTTPStatus.OK, fleet.health_of(cluster_id))
                elif method == "GET" and rest:
                    self._send(HTTPStatus.OK, fleet.health_of(unquote(rest)))
                elif method == "PUT" and rest.endswith("/health"):
                    cluster_id = unquote(rest[: -len("/health")])
                    change = HealthChange.model_validate(self._body())
                    fleet.set_health(
                        cluster_id,
                        workloads=change.workloads,
                        metrics=change.metrics,
                        available=change.available,
                        unavailable_reason=change.unavailable_reason,
                    )
                    self._send(HTTPStatus.OK, fleet.health_of(cluster_id))
                else:
                    raise _HttpError(HTTPStatus.NOT_FOUND, f"no route {method} {path}")
            else:
                raise _HttpError(HTTPStatus.NOT_FOUND, f"no route {method} {path}")

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_POST(self) -> None:
            self._dispatch("POST")

    return _Handler
