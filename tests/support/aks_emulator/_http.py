"""HTTPS front of the AKS emulator: the ARM routes azure-mgmt-containerservice calls.

Routes and status codes are those of the SDK's generated operations
(azure/mgmt/containerservice/operations/_operations.py): list / list_by_resource_group / get /
begin_create_or_update / get_upgrade_profile of ManagedClustersOperations (200; PUT 200 or
201), list / get / begin_create_or_update / begin_upgrade_node_image_version of
AgentPoolsOperations (POST 200 or 202) and list of MaintenanceConfigurationsOperations. Lists
page with nextLink (ARM paging). Long-running operations answer an Azure-AsyncOperation
header (and Location on 202), which azure-mgmt-core's ARMPolling follows: the status resource
at .../locations/{location}/operations/{id}, then for a PUT the resource itself
(https://learn.microsoft.com/azure/azure-resource-manager/management/async-operations).
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from tests.support.aks_emulator._model import ApiError, EmulatorState

__all__ = ["EmulatorServer"]

_SEG = r"([^/?]+)"
_SUB = rf"/subscriptions/{_SEG}"
_RP = "/providers/Microsoft.ContainerService"
_MC = rf"{_SUB}/resourceGroups/{_SEG}{_RP}/managedClusters/{_SEG}"

Handler = Callable[["_Request"], tuple[int, Any, dict[str, str]]]


class _Request:
    def __init__(
        self, groups: tuple[str, ...], query: dict[str, list[str]], body: bytes, headers: Any
    ) -> None:
        self.groups = groups
        self.query = query
        self.body = body
        self.headers = headers

    def json(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body or b"{}")
        except ValueError:
            raise ApiError(
                400, "InvalidRequestContent", "The request content is not JSON."
            ) from None
        if not isinstance(data, dict):
            raise ApiError(400, "InvalidRequestContent", "The request content is not an object.")
        return data


class EmulatorServer:
    """A threaded HTTPS server on loopback answering from an EmulatorState."""

    def __init__(
        self,
        state: EmulatorState,
        cert_file: str,
        key_file: str,
        *,
        api_version: str,
        token: str,
        federated_token: str,
        client_id: str,
        page_size: int = 2,
    ) -> None:
        self.state = state
        self.api_version = api_version
        self.token = token
        self.federated_token = federated_token
        self.client_id = client_id
        self.token_requests: list[dict[str, str]] = []
        self.unauthorized = 0  # requests refused for their bearer token
        self.page_size = page_size
        self._routes: list[tuple[str, re.Pattern[str], str, Handler]] = []
        self._add_routes()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server._dispatch(self, "GET")

            def do_PUT(self) -> None:
                server._dispatch(self, "PUT")

            def do_POST(self) -> None:
                server._dispatch(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="aks-emulator", daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"https://{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # ---------------------------------------------------------------------- routing

    def _route(self, method: str, pattern: str, name: str, handler: Handler) -> None:
        self._routes.append((method, re.compile(pattern + r"$", re.IGNORECASE), name, handler))

    def _add_routes(self) -> None:
        s = self.state
        r = self._route
        r("GET", rf"{_SUB}{_RP}/managedClusters", "ManagedClusters.List", self._list_all)
        r(
            "GET",
            rf"{_SUB}/resourceGroups/{_SEG}{_RP}/managedClusters",
            "ManagedClusters.ListByResourceGroup",
            self._list_group,
        )
        r("GET", _MC, "ManagedClusters.Get", lambda q: (200, s.get_cluster(*q.groups), {}))
        r("PUT", _MC, "ManagedClusters.CreateOrUpdate", self._put_cluster)
        r(
            "GET",
            rf"{_MC}/upgradeProfiles/default",
            "ManagedClusters.GetUpgradeProfile",
            lambda q: (200, s.upgrade_profile(*q.groups), {}),
        )
        r(
            "GET",
            rf"{_MC}/agentPools",
            "AgentPools.List",
            lambda q: self._page(q, s.list_pools(*q.groups)),
        )
        r(
            "GET",
            rf"{_MC}/agentPools/{_SEG}",
            "AgentPools.Get",
            lambda q: (200, s.get_pool(*q.groups), {}),
        )
        r("PUT", rf"{_MC}/agentPools/{_SEG}", "AgentPools.CreateOrUpdate", self._put_pool)
        r(
            "GET",
            rf"{_MC}/agentPools/{_SEG}/upgradeProfiles/default",
            "AgentPools.GetUpgradeProfile",
            lambda q: (200, s.pool_upgrade_profile(*q.groups), {}),
        )
        r(
            "POST",
            rf"{_MC}/agentPools/{_SEG}/upgradeNodeImageVersion",
            "AgentPools.UpgradeNodeImageVersion",
            self._node_image,
        )
        r(
            "GET",
            rf"{_MC}/maintenanceConfigurations",
            "MaintenanceConfigurations.ListByManagedCluster",
            lambda q: self._page(q, s.maintenance(*q.groups)),
        )
        r(
            "GET",
            rf"{_SUB}{_RP}/locations/{_SEG}/operations/{_SEG}",
            "Operations.Get",
            lambda q: (200, s.operation(q.groups[2]), {}),
        )
        r(
            "GET",
            rf"{_SUB}{_RP}/locations/{_SEG}/operationresults/{_SEG}",
            "OperationResults.Get",
            self._operation_result,
        )

    def _page(self, q: _Request, items: list[dict[str, Any]]) -> tuple[int, Any, dict[str, str]]:
        """ARM paging: {"value": [...], "nextLink": URL with $skipToken} until the last page."""
        skip = int((q.query.get("$skipToken") or ["0"])[0] or 0)
        page = items[skip : skip + self.page_size]
        body: dict[str, Any] = {"value": page}
        if skip + self.page_size < len(items):
            query = {"api-version": self.api_version, "$skipToken": str(skip + self.page_size)}
            body["nextLink"] = f"{self.endpoint}{q.headers['x-emulator-path']}?{urlencode(query)}"
        return 200, body, {}

    def _list_all(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        return self._page(q, self.state.list_clusters(q.groups[0], None))

    def _list_group(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        return self._page(q, self.state.list_clusters(q.groups[0], q.groups[1]))

    def _async_headers(self, subscription: str, location: str, op_id: str) -> dict[str, str]:
        base = f"{self.endpoint}/subscriptions/{subscription}{_RP}/locations/{location}"
        query = urlencode({"api-version": self.api_version})
        return {
            "Azure-AsyncOperation": f"{base}/operations/{op_id}?{query}",
            "Location": f"{base}/operationresults/{op_id}?{query}",
        }

    def _put_cluster(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        body, op = self.state.put_cluster(*q.groups, q.json(), q.headers.get("If-Match", ""))
        if op is None:
            return 200, body, {}
        return (
            200,
            body,
            {
                "Azure-AsyncOperation": self._async_headers(q.groups[0], op.location, op.id)[
                    "Azure-AsyncOperation"
                ]
            },
        )

    def _put_pool(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        body, op = self.state.put_pool(*q.groups, q.json(), q.headers.get("If-Match", ""))
        if op is None:
            return 200, body, {}
        return (
            200,
            body,
            {
                "Azure-AsyncOperation": self._async_headers(q.groups[0], op.location, op.id)[
                    "Azure-AsyncOperation"
                ]
            },
        )

    def _node_image(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        op = self.state.upgrade_node_image(*q.groups)
        return 202, None, self._async_headers(q.groups[0], op.location, op.id)

    def _operation_result(self, q: _Request) -> tuple[int, Any, dict[str, str]]:
        status = self.state.operation(q.groups[2])
        if status["status"] == "InProgress":
            return 202, None, {"Location": q.headers["x-emulator-url"]}
        if status["status"] != "Succeeded":
            error = status.get("error") or {}
            raise ApiError(400, error.get("code", "Failed"), error.get("message", "failed"))
        return 204, None, {}

    def _identity(
        self, handler: BaseHTTPRequestHandler, method: str, path: str, body: bytes
    ) -> bool:
        """Microsoft Entra ID's two endpoints a workload identity credential uses, so
        azure-identity's WorkloadIdentityCredential (through MSAL) runs unchanged with
        AZURE_AUTHORITY_HOST = the emulator: the tenant's OpenID configuration
        ({authority}/{tenant}/v2.0/.well-known/openid-configuration) and the token endpoint,
        which takes the client-credentials grant with the federated token as client_assertion
        (https://learn.microsoft.com/entra/identity-platform/
        v2-oauth2-client-creds-grant-flow, "Third case: Access token request with a federated
        credential"). A wrong assertion or client id answers 401 invalid_client."""
        tenant = re.match(
            r"^/([^/]+)/(v2\.0/\.well-known/openid-configuration|oauth2/v2\.0/token)$", path
        )
        if tenant is None:
            return False
        base = f"{self.endpoint}/{tenant.group(1)}"
        if method == "GET" and tenant.group(2).startswith("v2.0"):
            self._send(
                handler,
                200,
                {
                    "issuer": f"{base}/v2.0",
                    "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
                    "token_endpoint": f"{base}/oauth2/v2.0/token",
                },
                {},
            )
            return True
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        self.token_requests.append({k: v for k, v in form.items() if k != "client_assertion"})
        if (
            form.get("client_assertion") != self.federated_token
            or form.get("client_id") != self.client_id
            or form.get("grant_type") != "client_credentials"
        ):
            self._send(
                handler,
                401,
                {"error": "invalid_client", "error_description": "AADSTS700016: unknown client"},
                {},
            )
            return True
        self._send(
            handler,
            200,
            {"token_type": "Bearer", "expires_in": 3599, "access_token": self.token},
            {},
        )
        return True

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        query = parse_qs(split.query)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        if not split.path.startswith("/subscriptions/") and self._identity(
            handler, method, split.path, body
        ):
            return
        headers = dict(handler.headers.items())
        headers["x-emulator-path"] = split.path
        headers["x-emulator-url"] = f"{self.endpoint}{handler.path}"
        lookup = _Caseless(headers)
        try:
            auth = lookup.get("Authorization", "")
            # ARM rejects a request without a valid bearer token: 401 with
            # WWW-Authenticate (https://learn.microsoft.com/rest/api/azure/#request-header).
            if auth != f"Bearer {self.token}":
                self.unauthorized += 1
                raise ApiError(
                    401,
                    "AuthenticationFailed",
                    "Authentication failed. The 'Authorization' header is missing or invalid.",
                    {"WWW-Authenticate": 'Bearer authorization_uri="https://login.example"'},
                )
            if (query.get("api-version") or [""])[0] != self.api_version:
                # Every ARM request carries api-version (MissingApiVersionParameter /
                # InvalidApiVersionParameter otherwise).
                raise ApiError(
                    400,
                    "InvalidApiVersionParameter",
                    f"The api-version '{(query.get('api-version') or [''])[0]}' is not "
                    f"the emulated one ({self.api_version}).",
                )
            for route_method, pattern, name, route in self._routes:
                match = pattern.match(split.path)
                if route_method != method or match is None:
                    continue
                request = _Request(match.groups(), query, body, lookup)
                self.state.gate()
                self.state.record(name, request.json() if body else None)
                status, payload, extra = route(request)
                self._send(handler, status, payload, extra)
                return
            raise ApiError(404, "NotFound", f"No route for {method} {split.path}.")
        except ApiError as exc:
            self._send(
                handler,
                exc.status,
                {"error": {"code": exc.code, "message": exc.message}},
                exc.headers,
            )

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: Any,
        headers: dict[str, str],
    ) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        handler.send_response(status)
        if data:
            handler.send_header("Content-Type", "application/json; charset=utf-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("x-ms-request-id", f"emulated-{self.state.next_seq()}")
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        if data:
            handler.wfile.write(data)


class _Caseless:
    """HTTP headers looked up case-insensitively."""

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = {k.lower(): v for k, v in headers.items()}

    def get(self, key: str, default: str = "") -> str:
        return self._headers.get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return self._headers[key.lower()]
