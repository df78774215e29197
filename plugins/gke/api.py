"""The one adapter over Google's client libraries: GKE (container v1) and compute v1 calls with
deadlines, no hidden retries, and Google errors turned into the contract's PluginErrors."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

import google.auth
import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import compute_v1, container_v1

from plugins.gke.config import ApiConfig
from plugins.gke.ids import ClusterRef
from plugins.sdk.errors import Conflict, FailedPrecondition, NotFound, PluginError, Unavailable

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "ClusterBusy",
    "ComputeBusy",
    "GkeApi",
    "OperationListing",
    "build_credentials",
]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_COMPUTE_DEFAULT = "https://compute.googleapis.com"
_LOG = logging.getLogger("plugins.gke.api")
_T = TypeVar("_T")
# GKE answers a second cluster operation with HTTP 400, status FAILED_PRECONDITION, reason
# failedPrecondition and "Cluster is running incompatible operation operation-...": one
# operation at a time per cluster (GKE docs, "Upgrading a cluster": operations are serialized).
_INCOMPATIBLE = re.compile(r"incompatible operation\s+([A-Za-z0-9_.-]+?)\.?(?:\s|$)")

JsonObject = dict[str, Any]


class ComputeBusy(PluginError):
    """Compute refused a patch for now (stale fingerprint, running operation): re-read, retry."""


class ClusterBusy(Conflict):
    """GKE refused a cluster operation because another one runs (operation_id: its short
    name, as GKE's message gives it; the caller knows the location to make it a full id)."""


class OperationListing(NamedTuple):
    """A ListOperations answer: the operations (in no documented order) and the zones GKE
    could not reach (their operations are missing from the list)."""

    operations: list[container_v1.Operation]
    missing_zones: list[str]


def build_credentials(api: ApiConfig) -> Credentials:
    """Application Default Credentials (workload identity on GKE), or anonymous for an emulator.

    Logs which kind is used, never the credentials themselves.
    """
    if api.credentials == "anonymous":
        _LOG.info("using anonymous credentials (api.credentials: anonymous, emulator endpoint)")
        return AnonymousCredentials()  # type: ignore[no-untyped-call]
    try:
        credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except auth_exc.DefaultCredentialsError:
        raise ValueError(
            "api.credentials: no Application Default Credentials found; run on GKE with "
            "workload identity, set GOOGLE_APPLICATION_CREDENTIALS, or use "
            "`gcloud auth application-default login`"
        ) from None
    _LOG.info(
        "using Application Default Credentials",
        extra={"fields": {"kind": type(credentials).__name__, "quota_project": project or ""}},
    )
    return credentials


def _detail(exc: gexc.GoogleAPICallError) -> tuple[str, str, str]:
    """(status, reason, message) of a Google API error, read from the JSON error body."""
    status, reason, message = "", "", ""
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {}
        if isinstance(error, dict):
            status = str(error.get("status", ""))
            message = str(error.get("message", ""))
            errors = error.get("errors") or []
            if errors and isinstance(errors[0], dict):
                reason = str(errors[0].get("reason", ""))
    if not message:
        message = str(getattr(exc, "message", "")) or type(exc).__name__
    return status, reason, message


def translate(what: str, exc: Exception) -> PluginError:
    """The PluginError for a failed Google call (what: e.g. "UpdateMaster projects/p/...")."""
    if isinstance(exc, gexc.GoogleAPICallError):
        status, reason, message = _detail(exc)
        code = exc.code or 0
        if isinstance(exc, gexc.NotFound):
            return NotFound(f"{what}: not found in GKE ({message})")
        busy = _INCOMPATIBLE.search(message)
        if busy is not None and (
            status == "FAILED_PRECONDITION" or reason == "failedPrecondition" or code == 400
        ):
            return ClusterBusy(f"{what}: GKE answered: {message}", busy.group(1))
        if isinstance(exc, gexc.PreconditionFailed) or reason in (
            "conditionNotMet",
            "resourceNotReady",
        ):
            return ComputeBusy(f"{what}: {message}")
        if isinstance(exc, gexc.Unauthorized | gexc.Forbidden):
            return FailedPrecondition(
                f"{what}: Google refused the plugin's credentials (HTTP {code}: {message}); "
                "grant its service account roles/container.clusterAdmin (and "
                "roles/compute.loadBalancerAdmin for traffic drain)"
            )
        if isinstance(exc, gexc.TooManyRequests | gexc.ServerError):
            return Unavailable(f"{what}: GKE is unavailable now (HTTP {code}: {message}); retry")
        if isinstance(exc, gexc.ClientError):
            kind = status or f"HTTP {code}"
            return FailedPrecondition(f"{what}: GKE refused the request ({kind}: {message})")
        return Unavailable(f"{what}: {type(exc).__name__}: {message}")
    if isinstance(exc, auth_exc.GoogleAuthError):
        return Unavailable(f"{what}: cannot obtain an access token ({type(exc).__name__}); retry")
    if isinstance(exc, requests.RequestException | OSError | gexc.RetryError):
        return Unavailable(f"{what}: cannot reach the Google API ({type(exc).__name__}); retry")
    raise exc


class GkeApi:
    """Typed calls of the container and compute APIs the plugin uses."""

    def __init__(self, api: ApiConfig, credentials: Credentials | None = None) -> None:
        creds = credentials if credentials is not None else build_credentials(api)
        self.timeout = api.timeout_seconds

        def options(endpoint: str) -> dict[str, str] | None:
            return {"api_endpoint": endpoint} if endpoint else None

        self._container = container_v1.ClusterManagerClient(
            credentials=creds, transport="rest", client_options=options(api.container_endpoint)
        )
        compute_endpoint = api.compute_endpoint or ""
        self._global_operations = compute_v1.GlobalOperationsClient(
            credentials=creds, transport="rest", client_options=options(compute_endpoint)
        )
        # Backend services are read and patched as JSON: the typed client drops fields newer
        # than itself, and a patch of `backends` replaces the whole list (JSON merge patch), so
        # a typed read-modify-write would erase them.
        self._compute_base = (compute_endpoint or _COMPUTE_DEFAULT).rstrip("/") + "/compute/v1"
        # As the generated clients do: a service-account key signs its own JWT (no token
        # exchange); other credentials are used as they are.
        jwt = getattr(creds, "with_always_use_jwt_access", None)
        session_creds = jwt(True) if callable(jwt) else creds
        self._session = AuthorizedSession(session_creds)  # type: ignore[no-untyped-call]

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except Exception as exc:
            raise translate(what, exc) from None

    # ------------------------------------------------------------------ container v1

    def list_clusters(self, parent: str) -> list[container_v1.Cluster]:
        """Every cluster of projects/P/locations/L (L may be "-"); Unavailable if zones are
        missing from the answer (a partial inventory would look like vanished clusters)."""
        response = self._call(
            f"ListClusters {parent}",
            lambda: self._container.list_clusters(parent=parent, retry=None, timeout=self.timeout),
        )
        if response.missing_zones:
            raise Unavailable(
                f"ListClusters {parent}: GKE could not reach zones "
                f"{', '.join(sorted(response.missing_zones))}; retry"
            )
        return list(response.clusters)

    def get_cluster(self, ref: ClusterRef) -> container_v1.Cluster:
        """One cluster."""
        return self._call(
            f"GetCluster {ref.id}",
            lambda: self._container.get_cluster(name=ref.id, retry=None, timeout=self.timeout),
        )

    def list_operations(self, parent: str) -> OperationListing:
        """Every operation GKE keeps for projects/P/locations/L (L may be "-"), in no order,
        with the zones GKE could not reach."""
        response = self._call(
            f"ListOperations {parent}",
            lambda: self._container.list_operations(
                parent=parent, retry=None, timeout=self.timeout
            ),
        )
        return OperationListing(list(response.operations), sorted(response.missing_zones))

    def get_operation(self, name: str) -> container_v1.Operation:
        """One operation by projects/P/locations/L/operations/OP."""
        return self._call(
            f"GetOperation {name}",
            lambda: self._container.get_operation(name=name, retry=None, timeout=self.timeout),
        )

    def server_config(self, parent: str) -> container_v1.ServerConfig:
        """The versions GKE offers in projects/P/locations/L."""
        return self._call(
            f"GetServerConfig {parent}",
            lambda: self._container.get_server_config(
                name=parent, retry=None, timeout=self.timeout
            ),
        )

    def update_master(self, ref: ClusterRef, version: str) -> container_v1.Operation:
        """Starts a control-plane upgrade."""
        return self._call(
            f"UpdateMaster {ref.id}",
            lambda: self._container.update_master(
                request=container_v1.UpdateMasterRequest(name=ref.id, master_version=version),
                retry=None,
                timeout=self.timeout,
            ),
        )

    def update_node_pool(
        self, ref: ClusterRef, pool: str, version: str, image_type: str
    ) -> container_v1.Operation:
        """Starts a node-pool upgrade; upgrade settings are left to the pool's own."""
        return self._call(
            f"UpdateNodePool {ref.pool(pool)}",
            lambda: self._container.update_node_pool(
                request=container_v1.UpdateNodePoolRequest(
                    name=ref.pool(pool), node_version=version, image_type=image_type
                ),
                retry=None,
                timeout=self.timeout,
            ),
        )

    # --------------------------------------------------------------------- compute v1

    def _json(
        self,
        what: str,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> JsonObject:
        def call() -> JsonObject:
            response = self._session.request(  # type: ignore[no-untyped-call]
                method,
                f"{self._compute_base}/{path}",
                json=body,
                params=params,
                timeout=self.timeout,
            )
            if response.status_code >= 400:
                raise gexc.from_http_response(response)  # type: ignore[no-untyped-call]
            data = response.json()
            if not isinstance(data, dict):
                raise Unavailable(f"{what}: compute answered something other than a JSON object")
            return data

        return self._call(what, call)

    def get_backend_service(self, project: str, name: str) -> JsonObject:
        """A global backend service as compute's JSON, every field kept (also ones newer than
        the pinned client)."""
        path = f"projects/{project}/global/backendServices/{name}"
        return self._json(f"backendServices.get {path}", "GET", path)

    def patch_backends(
        self,
        project: str,
        name: str,
        backends: Sequence[Mapping[str, Any]],
        fingerprint: str,
        request_id: str,
    ) -> compute_v1.Operation:
        """Replaces the service's backends list (JSON merge patch: only `backends` and the
        `fingerprint` guard are sent), the backends as read (unknown fields kept); request_id
        (a UUID) makes a repeated call return the first call's operation."""
        path = f"projects/{project}/global/backendServices/{name}"
        answer = self._json(
            f"backendServices.patch {path}",
            "PATCH",
            path,
            body={"backends": list(backends), "fingerprint": fingerprint},
            params={"requestId": request_id},
        )
        op: compute_v1.Operation = compute_v1.Operation.from_json(
            json.dumps(answer), ignore_unknown_fields=True
        )
        return op

    def get_global_operation(self, project: str, name: str) -> compute_v1.Operation:
        """A compute global operation."""
        return self._call(
            f"globalOperations.get projects/{project}/global/operations/{name}",
            lambda: self._global_operations.get(
                project=project, operation=name, retry=None, timeout=self.timeout
            ),
        )

    def close(self) -> None:
        """Closes the HTTP sessions."""
        for client in (self._container, self._global_operations):
            transport: Any = client.transport
            transport.close()
        self._session.close()  # type: ignore[no-untyped-call]
