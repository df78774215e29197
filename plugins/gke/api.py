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
from plugins.sdk import Conflict, FailedPrecondition, NotFound, PluginError, Unavailable

__all__ = [
    "CLOUD_PLATFORM_SCOPE",
    "ClusterBusy",
    "ComputeBusy",
    "GkeApi",
    "OperationListing",
    "RateLimited",
    "build_credentials",
]

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
_COMPUTE_DEFAULT = "https://compute.googleapis.com"
_LOG = logging.getLogger("plugins.gke.api")
_T = TypeVar("_T")
# GKE runs one operation at a time per cluster (GKE docs, "Upgrading a cluster": operations are
# serialized) and refuses another with HTTP 400 / gRPC 9 FAILED_PRECONDITION. The structured
# form first: a google.rpc.ErrorInfo in error.details with this reason (domain
# container.googleapis.com). Then the texts GKE sends, each naming the running operation:
# "Cluster is running incompatible operation operation-....", "Operation operation-... is
# currently upgrading cluster C. Please wait and try again once it is done." and "... is
# currently operating on cluster C. ..." (tests/support/gke_emulator/_model.py busy_error
# quotes where each was seen).
_BUSY_REASON = "CLUSTER_ALREADY_HAS_OPERATION"
_BUSY_TEXTS = (
    re.compile(r"incompatible operation\s+(?P<op>[A-Za-z0-9_.-]+?)\.?(?:\s|$)"),
    re.compile(
        r"Operation\s+(?P<op>[A-Za-z0-9_.-]+?)\s+is currently (?:upgrading|operating on) cluster"
    ),
)
# Rate quotas: Compute answers HTTP 403 with errors[].reason rateLimitExceeded (per project) or
# userRateLimitExceeded (per user), "wait a minute then try your request again" (Compute docs,
# API rate limits); Google APIs answer HTTP 429 RESOURCE_EXHAUSTED, ErrorInfo reason
# RATE_LIMIT_EXCEEDED. A later retry succeeds: never "missing credentials".
_RATE_REASONS = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED")

JsonObject = dict[str, Any]


class ComputeBusy(PluginError):
    """Compute refused a patch for now (stale fingerprint, running operation): re-read, retry."""


class RateLimited(Unavailable):
    """Google's rate quota is used up for now (Compute 403 rateLimitExceeded /
    userRateLimitExceeded, HTTP 429): UNAVAILABLE, a later retry succeeds."""


class ClusterBusy(Conflict):
    """GKE refused a cluster operation because another one runs (operation_id: its short
    name, as GKE's message gives it, "" when GKE named none; the caller knows the location to
    make it a full id, or finds the operation)."""


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


class _Detail(NamedTuple):
    """What a Google API error body says: status, the legacy errors[].reason, the message, the
    google.rpc.ErrorInfo reasons in error.details, and a Retry-After header (seconds)."""

    status: str
    reason: str
    message: str
    info_reasons: tuple[str, ...]
    retry_after: float | None


def _detail(exc: gexc.GoogleAPICallError) -> _Detail:
    """The _Detail of a Google API error, read from the JSON error body."""
    status, reason, message = "", "", ""
    infos: list[str] = []
    retry_after: float | None = None
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            error = response.json().get("error", {})
        except (ValueError, AttributeError):
            error = {}
        if isinstance(error, dict):
            status = str(error.get("status", ""))
            message = str(error.get("message", ""))
            errors = error.get("errors") or []
            if errors and isinstance(errors[0], dict):
                reason = str(errors[0].get("reason", ""))
            for item in error.get("details") or []:
                if isinstance(item, dict) and str(item.get("@type", "")).endswith(
                    "google.rpc.ErrorInfo"
                ):
                    infos.append(str(item.get("reason", "")))
        header = (getattr(response, "headers", None) or {}).get("Retry-After", "")
        if str(header).strip().isdigit():
            retry_after = float(str(header).strip())
    for item in getattr(exc, "details", None) or []:  # over gRPC: the parsed details
        info_reason = getattr(item, "reason", None)
        if isinstance(info_reason, str) and info_reason:
            infos.append(info_reason)
    if not message:
        message = str(getattr(exc, "message", "")) or type(exc).__name__
    return _Detail(status, reason, message, tuple(infos), retry_after)


def _busy_operation(detail: _Detail, code: int) -> str | None:
    """The running operation's short name when GKE refused because one runs ("" when GKE says
    so only by reason, naming none); None when the error is something else."""
    named = next((m for p in _BUSY_TEXTS if (m := p.search(detail.message))), None)
    if _BUSY_REASON in detail.info_reasons:
        return named.group("op") if named else ""
    if named is not None and (
        detail.status == "FAILED_PRECONDITION"
        or detail.reason == "failedPrecondition"
        or code == 400
    ):
        return named.group("op")
    return None


def translate(what: str, exc: Exception) -> PluginError:
    """The PluginError for a failed Google call (what: e.g. "UpdateMaster projects/p/...").

    By the structured reason first (ErrorInfo in error.details, errors[].reason), the text
    second."""
    if isinstance(exc, gexc.GoogleAPICallError):
        detail = _detail(exc)
        status, reason, message = detail.status, detail.reason, detail.message
        code = exc.code or 0
        if isinstance(exc, gexc.NotFound):
            return NotFound(f"{what}: not found in GKE ({message})")
        busy = _busy_operation(detail, code)
        if busy is not None:
            return ClusterBusy(f"{what}: GKE answered: {message}", busy)
        if isinstance(exc, gexc.PreconditionFailed) or reason in (
            "conditionNotMet",
            "resourceNotReady",
        ):
            return ComputeBusy(f"{what}: {message}")
        limited = next(
            (r for r in (reason, *detail.info_reasons) if r in _RATE_REASONS),
            "RESOURCE_EXHAUSTED" if isinstance(exc, gexc.TooManyRequests) else "",
        )
        if limited:
            return RateLimited(
                f"{what}: Google's rate quota is used up for now (HTTP {code} {limited}: "
                f"{message}); retry with backoff",
                retry_after=detail.retry_after,
            )
        if isinstance(exc, gexc.Unauthorized | gexc.Forbidden):
            return FailedPrecondition(
                f"{what}: Google refused the plugin's credentials (HTTP {code}: {message}); "
                "grant its service account roles/container.clusterAdmin (and "
                "roles/compute.loadBalancerAdmin for traffic drain)"
            )
        if isinstance(exc, gexc.ServerError):
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
