"""HTTP front of the GKE API emulator: the v1 REST routes of container.googleapis.com and the
compute v1 backend-service / global-operation routes, in the documented JSON wire format.

JSON is camelCase; enums are names unless the client asks for `$alt=json;enum-encoding=int`
(as the generated Python clients do); errors use the Google API error body
({"error": {"code", "message", "status"}}, plus compute's errors[].reason).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.cloud import container_v1
from google.protobuf import json_format

from tests.support.gke_emulator._model import ApiError, EmulatorState

__all__ = ["EmulatorServer"]

_SEG = r"([^/:?]+)"
_LOC = rf"/v1/projects/{_SEG}/locations/{_SEG}"
_CLUSTER = rf"{_LOC}/clusters/{_SEG}"
_COMPUTE = rf"/compute/v1/projects/{_SEG}/global"

UpdateMasterRequest = container_v1.UpdateMasterRequest.pb()
UpdateNodePoolRequest = container_v1.UpdateNodePoolRequest.pb()
CancelOperationRequest = container_v1.CancelOperationRequest.pb()
ListClustersResponse = container_v1.ListClustersResponse.pb()
ListNodePoolsResponse = container_v1.ListNodePoolsResponse.pb()
ListOperationsResponse = container_v1.ListOperationsResponse.pb()

Handler = Callable[["_Request"], Any]


class _Request:
    """One parsed HTTP request: route groups, query and JSON body."""

    def __init__(self, groups: tuple[str, ...], query: dict[str, list[str]], body: bytes) -> None:
        self.groups = groups
        self.query = query
        self.body = body

    def json(self) -> dict[str, Any]:
        """The body as a JSON object (400 when it is not one)."""
        try:
            data = json.loads(self.body or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"Invalid JSON payload received. {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON payload received: not an object.")
        return data

    def parse(self, message: Any) -> Any:
        """The body parsed strictly into message (unknown fields are a 400, as in GKE)."""
        text = self.body.decode("utf-8") if self.body else "{}"
        try:
            json_format.Parse(text, message, ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            raise ApiError(400, f"Invalid JSON payload received. {exc}") from None
        return message


class EmulatorServer:
    """A threaded HTTP server on loopback answering from an EmulatorState."""

    def __init__(self, state: EmulatorState, host: str = "127.0.0.1", port: int = 0) -> None:
        self.state = state
        self._routes: list[tuple[str, re.Pattern[str], str, Handler]] = []
        self._add_routes()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._dispatch(self, "GET")

            def do_POST(self) -> None:
                server._dispatch(self, "POST")

            def do_PUT(self) -> None:
                server._dispatch(self, "PUT")

            def do_PATCH(self) -> None:
                server._dispatch(self, "PATCH")

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gke-emulator", daemon=True
        )

    @property
    def endpoint(self) -> str:
        """http://HOST:PORT, for client_options={"api_endpoint": ...}."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # ---------------------------------------------------------------------- routing

    def _route(self, method: str, pattern: str, name: str, handler: Handler) -> None:
        self._routes.append((method, re.compile(pattern + r"$"), name, handler))

    def _add_routes(self) -> None:
        s = self.state
        r = self._route
        r("GET", rf"{_LOC}/clusters", "ListClusters", lambda q: _list_clusters(s, q))
        r("GET", _CLUSTER, "GetCluster", lambda q: s.cluster(*q.groups))
        r("GET", rf"{_CLUSTER}/nodePools", "ListNodePools", lambda q: _list_pools(s, q))
        r(
            "GET",
            rf"{_CLUSTER}/nodePools/{_SEG}",
            "GetNodePool",
            lambda q: s.node_pool(*q.groups),
        )
        r(
            "POST",
            rf"{_CLUSTER}:updateMaster",
            "UpdateMaster",
            lambda q: s.update_master(*q.groups, q.parse(UpdateMasterRequest())),
        )
        r(
            "PUT",
            rf"{_CLUSTER}/nodePools/{_SEG}",
            "UpdateNodePool",
            lambda q: s.update_node_pool(*q.groups, q.parse(UpdateNodePoolRequest())),
        )
        r("GET", rf"{_LOC}/operations", "ListOperations", lambda q: _list_ops(s, q))
        r("GET", rf"{_LOC}/operations/{_SEG}", "GetOperation", lambda q: s.operation(*q.groups))
        r(
            "POST",
            rf"{_LOC}/operations/{_SEG}:cancel",
            "CancelOperation",
            lambda q: _cancel(s, q),
        )
        r("GET", rf"{_LOC}/serverConfig", "GetServerConfig", lambda q: s.server_config(*q.groups))
        r(
            "GET",
            rf"{_COMPUTE}/backendServices/{_SEG}",
            "compute.backendServices.get",
            lambda q: RawJson(s.backend_service_json(*q.groups)),
        )
        r(
            "PATCH",
            rf"{_COMPUTE}/backendServices/{_SEG}",
            "compute.backendServices.patch",
            lambda q: s.patch_backend_service_json(
                *q.groups, q.json(), (q.query.get("requestId") or [""])[0]
            ),
        )
        r(
            "GET",
            rf"{_COMPUTE}/operations/{_SEG}",
            "compute.globalOperations.get",
            lambda q: s.compute_operation(*q.groups),
        )

    def _dispatch(self, http: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(http.path)
        query = parse_qs(parts.query)
        length = int(http.headers.get("Content-Length") or 0)
        body = http.rfile.read(length) if length else b""
        numeric = "enum-encoding=int" in (query.get("$alt") or [""])[0]
        compute = parts.path.startswith("/compute/")
        for route_method, pattern, name, handler in self._routes:
            match = pattern.match(parts.path)
            if match is None or route_method != method:
                continue
            for hook in self.state.take_before_call(name):
                hook()  # e.g. GKE starts an operation between the caller's look and its call
            try:
                fault = self.state.take_http_fault(name)
                self.state.record(
                    name,
                    parts.path,
                    json.loads(body) if body else {},
                    http.headers.get("Authorization", ""),
                )
                if fault is not None:
                    raise fault
                with self.state.lock:  # serialize while no operation can change the message
                    result = handler(_Request(match.groups(), query, body))
                    text = "{}" if result is None else _to_json(result, numeric)
            except ApiError as err:
                self._send(http, err.http_code, _error_body(err, compute))
                return
            self._send(http, 200, text)
            return
        self._send(
            http,
            404,
            _error_body(ApiError(404, f"No route for {method} {parts.path}"), compute),
        )

    @staticmethod
    def _send(http: BaseHTTPRequestHandler, code: int, text: str) -> None:
        data = text.encode("utf-8")
        http.send_response(code)
        http.send_header("Content-Type", "application/json; charset=UTF-8")
        http.send_header("Content-Length", str(len(data)))
        http.end_headers()
        http.wfile.write(data)


class RawJson:
    """An answer already in JSON form (compute resources with fields the client may not know)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data


def _to_json(message: Any, numeric: bool) -> str:
    if isinstance(message, RawJson):
        return json.dumps(message.data)
    return json_format.MessageToJson(message, use_integers_for_enums=numeric)


def _error_body(err: ApiError, compute: bool) -> str:
    error: dict[str, Any] = {"code": err.http_code, "message": err.message}
    if compute:
        # Compute's rate-quota answers name the domain usageLimits (Compute docs, API errors).
        domain = "usageLimits" if "RateLimit" in err.reason else "global"
        error["errors"] = [
            {"message": err.message, "domain": domain, "reason": err.reason or "invalid"}
        ]
    else:
        error["status"] = err.status
        if err.reason:  # GKE v1 errors carry the legacy errors[] list as well
            error["errors"] = [{"message": err.message, "domain": "global", "reason": err.reason}]
    if err.details:
        error["details"] = err.details
    return json.dumps({"error": error})


def _list_clusters(state: EmulatorState, request: _Request) -> Any:
    project, location = request.groups
    with state.lock:
        return ListClustersResponse(clusters=state.list_clusters(project, location))


def _list_pools(state: EmulatorState, request: _Request) -> Any:
    with state.lock:
        cluster = state.cluster(*request.groups)
        return ListNodePoolsResponse(node_pools=list(cluster.node_pools))


def _list_ops(state: EmulatorState, request: _Request) -> Any:
    project, location = request.groups
    with state.lock:
        operations, missing = state.list_operations(project, location)
        return ListOperationsResponse(operations=operations, missing_zones=missing)


def _cancel(state: EmulatorState, request: _Request) -> None:
    request.parse(CancelOperationRequest())
    state.cancel_operation(*request.groups)
