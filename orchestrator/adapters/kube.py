"""The Kubernetes adapter: the one module that imports the kubernetes client.

The hot path (our objects' reads, watches and writes, Events) does not go through the
generated client: each request is JSON bytes straight to the apiserver's connection pool of the
client's urllib3 manager (its TLS settings, verification included, and kept-alive
connections; the manager's URL parsing and pool lookup done once), with its headers built
once per content type and rebuilt only when the credential changes (`_Credentials`), a small
body sent with its head in one TLS write (`_OneWriteHTTPSConnection`), and each watch event
decoded once, by orjson (`watch_objects`). The generated client's `Watch` decoded every event
twice and encoded it once more; its configuration ran the kubeconfig's refresh hook, which also
scans the environment for proxies, on every request. Leases, Secrets, Jobs and CRDs still use
the generated client (with the same throttled refresh hook).
"""
# mypy: disable-error-code="no-untyped-call,no-any-return"
# (the kubernetes client is untyped; this adapter is the one place that touches it)

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3
import urllib3.connection
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from orchestrator import api
from orchestrator.pipeline.lease import LeaseRecord

__all__ = ["Conflict", "Gone", "KubeClient", "KubeError", "LeaseRecord", "NotFound", "WatchEvent"]

log = logging.getLogger(__name__)
#: Deadline of one API request (watches have their own server-side timeout).
REQUEST_TIMEOUT_SECONDS = 30.0
#: How often the configuration's credential refresh hook is asked at most (a kubeconfig's
#: expiring token or exec plugin, the in-cluster token file; the in-cluster loader itself
#: re-reads its file once a minute). A 401 asks at once.
CREDENTIAL_CHECK_SECONDS = 10.0
#: A watch's socket may stay silent this much longer than its server-side timeout.
WATCH_READ_GRACE_SECONDS = 30.0
_REQUEST_TIMEOUT = urllib3.Timeout(total=REQUEST_TIMEOUT_SECONDS)
#: Request bodies up to this size go out with their head in one write (a status write's
#: patch is 1-2 KiB; a TLS record holds 16 KiB).
_ONE_WRITE_BYTES = 16 * 1024


class KubeError(Exception):
    """An API server error, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class NotFound(KubeError):
    """404."""


class Conflict(KubeError):
    """409: stale resourceVersion or already exists."""


class Gone(KubeError):
    """410: the watch's resourceVersion expired; list again."""


def _wrap(exc: ApiException) -> KubeError:
    return _error(int(exc.status or 0), exc.body, exc.reason)


def _error(status: int, body: Any, reason: Any) -> KubeError:
    try:
        message = orjson.loads(body or b"{}").get("message", reason)
    except (ValueError, AttributeError):
        message = str(reason)
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, KubeError)
    text = str(message)
    return cls(status, text if len(text) <= 400 else text[:400] + "…")


def _path(plural: str, namespace: str | None, name: str = "") -> str:
    """The REST path of our objects of plural in namespace, or in every namespace (None), or
    one object when name is given."""
    where = f"namespaces/{namespace}/" if namespace else ""
    base = f"/apis/{api.GROUP}/{api.VERSION}/{where}{plural}"
    return f"{base}/{name}" if name else base


class _Credentials:
    """The Authorization header of every request, built once.

    The configuration's refresh hook (set by the kubeconfig and in-cluster loaders: reload an
    expired token, re-read the service account's token file) is asked at most every
    CREDENTIAL_CHECK_SECONDS, or at once after a 401, and the header is rebuilt only when the
    credential it leaves in the configuration changed. The hook is replaced by the throttled one
    on the configuration too, so the generated client's calls share it: each of them ran it,
    and with it a scan of the environment for proxies (the hook sets `host`). Client
    certificates are not headers: they are in the pool's TLS settings.
    """

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg  # a client.Configuration (typed loosely: its hook is typed None)
        self._lock = threading.RLock()
        self._hook: Callable[[Any], None] | None = cfg.refresh_api_key_hook
        self._checked = -float("inf")
        self._key: object = object()  # no credential seen yet
        self._headers: dict[str, str] = {}
        cfg.refresh_api_key_hook = self._throttled

    def _throttled(self, cfg: Any, force: bool = False) -> None:
        """The hook as the configuration calls it: the loader's, at most every
        CREDENTIAL_CHECK_SECONDS; the headers rebuilt when the credential changed."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._checked < CREDENTIAL_CHECK_SECONDS:
                return
            self._checked = now  # first: auth_settings() below calls this hook again
            if self._hook is not None:
                self._hook(cfg)
                # The loaders' hooks install themselves again each time they run.
                if cfg.refresh_api_key_hook is not self._throttled:
                    self._hook = cfg.refresh_api_key_hook
                    cfg.refresh_api_key_hook = self._throttled
            key = (cfg.api_key.get("BearerToken"), cfg.api_key.get("authorization"))
            if key != self._key:
                self._key = key
                settings: dict[str, dict[str, Any]] = cfg.auth_settings()  # hook: throttled
                self._headers = {
                    str(s["key"]): str(s["value"])
                    for s in settings.values()
                    if s["in"] == "header" and s["value"]
                }

    def headers(self) -> dict[str, str]:
        """The auth headers (possibly none): the same dict until the credential changes."""
        if time.monotonic() - self._checked >= CREDENTIAL_CHECK_SECONDS:
            self._throttled(self._cfg)
        return self._headers

    def refreshed(self) -> bool:
        """Ask the hook now (after a 401); True when that changed the credential."""
        before = self._headers
        self._throttled(self._cfg, force=True)
        return self._headers is not before


@dataclass(frozen=True)
class WatchEvent:
    """One watch event on objects of ours."""

    type: str
    obj: dict[str, Any]


def _event(line: bytes) -> WatchEvent:
    """One line of a watch stream, decoded once; an ERROR event raises (Gone for 410)."""
    event = orjson.loads(line)
    obj = event.get("object")
    if event.get("type") == "ERROR":
        code = int(obj.get("code", 500)) if isinstance(obj, dict) else 500
        message = obj.get("message", "") if isinstance(obj, dict) else str(obj)
        raise (Gone if code == 410 else KubeError)(code, str(message)[:400])
    return WatchEvent(str(event.get("type")), obj)


class _OneWriteHTTPSConnection(urllib3.connection.HTTPSConnection):
    """An HTTPS connection that writes a request with a small body (a status write's JSON
    patch) in one TLS write: urllib3 sends the head, then the body, as two (two records to
    encrypt, two system calls, and the apiserver reads twice). Larger bodies and requests
    without one are sent as urllib3 sends them."""

    _held: bytes | None = None
    _holding = False

    def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        headers: Any = None,
        **kwargs: Any,
    ) -> None:
        """urllib3's request, its head held back until the body comes."""
        self._holding = isinstance(body, bytes) and 0 < len(body) <= _ONE_WRITE_BYTES
        try:
            super().request(method, url, body, headers, **kwargs)
            held, self._held = self._held, None
            if held is not None:  # no body came after all: the head alone
                super().send(held)
        finally:
            self._holding, self._held = False, None

    def send(self, data: Any) -> None:
        """Hold the head (the first write of a held request); send it with the body."""
        if self._holding:
            if self._held is None:
                self._held = bytes(data)
                return
            data, self._held, self._holding = self._held + bytes(data), None, False
        super().send(data)


class KubeClient:
    """Typed access to the few API calls the orchestrator makes."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        if kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                cfg = client.Configuration()
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                cfg = client.Configuration()
                config.load_kube_config(client_configuration=cfg)
        cfg.connection_pool_maxsize = 64  # parallel writes of one reconcile (32) + watches
        self._credentials = _Credentials(cfg)
        self._api = client.ApiClient(cfg)
        self._host = cfg.host.rstrip("/")
        self._headers: dict[str, str] = {**self._api.default_headers, "Accept": "application/json"}
        self._custom = client.CustomObjectsApi(self._api)
        self._lock = threading.Lock()
        self._auth_seen: dict[str, str] | None = None
        self._by_type: dict[str, dict[str, str]] = {}
        # The apiserver's pool, with the manager's TLS settings (CA, client certificate,
        # verification) and retries; a proxy keeps the manager's own path (_send).
        manager = self._api.rest_client.pool_manager
        self._pool: urllib3.HTTPConnectionPool | None = (
            manager.connection_from_url(self._host)
            if type(manager) is urllib3.PoolManager
            else None
        )
        if isinstance(self._pool, urllib3.HTTPSConnectionPool):
            self._pool.ConnectionCls = _OneWriteHTTPSConnection

    # The other API groups are built on first use: importing CoreV1Api alone costs about 1 s of
    # CPU (half of the process's start), and a gate loop or a run without Secrets, Jobs, leader
    # election or CRD installs never needs them. Under load that is tens of seconds of start.

    @cached_property
    def _core(self) -> Any:
        return client.CoreV1Api(self._api)

    @cached_property
    def _coord(self) -> Any:
        return client.CoordinationV1Api(self._api)

    @cached_property
    def _ext(self) -> Any:
        return client.ApiextensionsV1Api(self._api)

    @cached_property
    def _batch(self) -> Any:
        return client.BatchV1Api(self._api)

    def close(self) -> None:
        """Release connections: the generated client's thread pool, and every pooled
        connection to the apiserver (ApiClient.close leaves those to the garbage collector,
        which closes their sockets whenever it runs, with a ResourceWarning)."""
        self._api.close()
        if self._pool is not None:
            self._pool.close()
        self._api.rest_client.pool_manager.clear()

    # ClusterVersions

    def set_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set one annotation, or delete it with None (merge patch)."""
        body = {"metadata": {"annotations": {key: value}}}
        self._call(
            self._custom.patch_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            name,
            body,
        )

    # Any kind of ours (UpdateRuns, ClusterUpgrades, ClusterVersions), as plain JSON

    def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        """GET one object of ours."""
        return self._raw("GET", _path(plural, namespace, name), None, "application/json")

    def list_objects(
        self, plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """LIST objects of ours (one namespace or all); items and the list's resourceVersion.

        Cluster-scoped kinds (FleetProviders, MetricSources) are listed with namespace None.
        """
        query = f"?{urlencode({'labelSelector': label_selector})}" if label_selector else ""
        result = self._raw("GET", _path(plural, namespace) + query, None, "application/json")
        return list(result.get("items", [])), str(result["metadata"].get("resourceVersion", ""))

    def watch_objects(
        self, plural: str, namespace: str | None, resource_version: str, timeout_seconds: int = 300
    ) -> Iterator[WatchEvent]:
        """Watch objects of ours from a resourceVersion; raises Gone when it expired (an HTTP
        410 or an ERROR event with code 410), KubeError on other errors. Ends when the server
        ends the watch (timeout_seconds)."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "allowWatchBookmarks": "true",
        }
        path = f"{_path(plural, namespace)}?{urlencode(query)}"
        response = self._request(
            "GET", path, None, "application/json", timeout_seconds + WATCH_READ_GRACE_SECONDS
        )
        done = False
        try:
            pending = b""
            for chunk in response.stream(64 * 1024):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield _event(line)
            if pending.strip():
                yield _event(pending)
            done = True
        except urllib3.exceptions.HTTPError as err:
            raise KubeError(0, f"watch of {plural}: {err}") from err
        finally:
            if not done:  # stopped early: the connection still carries the stream; drop it
                response.close()
            response.release_conn()

    def create_object(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST an object of ours; Conflict when it exists."""
        return self._raw("POST", _path(plural, namespace), body, "application/json")

    def write_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """Set .status whole, only if the object is still at resource_version (else Conflict).

        The hot path of a rollout (one write per cluster step): sent as bytes over the client's
        connection pool, without the generated client's per-call validation and models.
        """
        body = [
            {"op": "replace", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "add", "path": "/status", "value": status},
        ]
        path = _path(plural, namespace, name) + "/status"
        return self._raw("PATCH", path, body, "application/json-patch+json")

    def merge_patch(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch spec or metadata of an object of ours."""
        return self._raw(
            "PATCH", _path(plural, namespace, name), patch, "application/merge-patch+json"
        )

    def add_finalizer(
        self, plural: str, obj: dict[str, Any], finalizer: str = api.FINALIZER
    ) -> dict[str, Any]:
        """Add finalizer to an object of ours (idempotent); the object as written."""
        return self._set_finalizers(plural, obj, finalizer, add=True)

    def remove_finalizer(
        self, plural: str, obj: dict[str, Any], finalizer: str = api.FINALIZER
    ) -> dict[str, Any] | None:
        """Remove finalizer from an object of ours (idempotent); the object as written, or
        None when it is gone (it was the last finalizer of an object being deleted)."""
        try:
            return self._set_finalizers(plural, obj, finalizer, add=False)
        except NotFound:
            return None

    def _set_finalizers(
        self, plural: str, obj: dict[str, Any], finalizer: str, *, add: bool
    ) -> dict[str, Any]:
        """Write metadata.finalizers with or without finalizer, conditional on the object's
        resourceVersion (the garbage collector edits the same list: foregroundDeletion,
        orphan); on a conflict, read it again and retry."""
        meta = obj["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for _ in range(5):
            meta = obj["metadata"]
            now = list(meta.get("finalizers") or [])
            if (finalizer in now) == add:
                return obj
            wanted = [*now, finalizer] if add else [f for f in now if f != finalizer]
            body = [
                {
                    "op": "replace",
                    "path": "/metadata/resourceVersion",
                    "value": meta["resourceVersion"],
                },
                {"op": "add", "path": "/metadata/finalizers", "value": wanted},
            ]
            try:
                return self._raw(
                    "PATCH", _path(plural, namespace, name), body, "application/json-patch+json"
                )
            except Conflict:
                obj = self.get_object(plural, namespace, name)
        raise Conflict(409, f"{plural}/{name} kept changing while its finalizers were written")

    def delete_object(self, plural: str, namespace: str, name: str) -> None:
        """DELETE an object of ours (its children go with it: ownerReferences)."""
        self._call(
            self._custom.delete_namespaced_custom_object,
            api.GROUP,
            api.VERSION,
            namespace,
            plural,
            name,
            body=client.V1DeleteOptions(propagation_policy="Background"),
        )

    def _raw(self, method: str, path: str, body: Any, content_type: str) -> Any:
        """One JSON request; the parsed answer."""
        response = self._request(method, path, body, content_type, None)
        return orjson.loads(response.data)

    def _request(
        self, method: str, path: str, body: Any, content_type: str, stream_seconds: float | None
    ) -> urllib3.BaseHTTPResponse:
        """One request over the client's pool (its TLS settings and kept-alive connections)
        with the cached credentials; a 401 asks the credential hook at once and, when that
        changed the credential, is sent once more. stream_seconds: the answer is a stream read
        by the caller, whose socket may be silent that long; otherwise it is read whole within
        REQUEST_TIMEOUT_SECONDS. Raises KubeError (or its subclasses) on errors."""
        data = None if body is None else orjson.dumps(body)
        if stream_seconds is None:
            timeout = _REQUEST_TIMEOUT
        else:
            timeout = urllib3.Timeout(connect=REQUEST_TIMEOUT_SECONDS, read=stream_seconds)
        for attempt in range(2):
            try:
                response = self._send(
                    method, path, data, self._headers_for(content_type), timeout, stream_seconds
                )
            except urllib3.exceptions.HTTPError as err:
                raise KubeError(0, f"{method} {path}: {err}") from err
            if 200 <= response.status < 300:
                return response
            answer = response.data  # the error's body, read whole
            response.release_conn()
            if response.status == 401 and attempt == 0 and self._credentials.refreshed():
                continue
            raise _error(response.status, answer, response.reason)
        raise AssertionError("unreachable")  # pragma: no cover

    def _headers_for(self, content_type: str) -> dict[str, str]:
        """The request headers for a body of content_type: built once per content type and
        credential (the same dict until the credential changes; never edited after)."""
        auth = self._credentials.headers()
        with self._lock:
            if auth is not self._auth_seen:
                self._auth_seen = auth
                self._by_type = {}
            headers = self._by_type.get(content_type)
            if headers is None:
                headers = {**self._headers, **auth, "Content-Type": content_type}
                self._by_type[content_type] = headers
            return headers

    def _send(
        self,
        method: str,
        path: str,
        data: bytes | None,
        headers: dict[str, str],
        timeout: urllib3.Timeout,
        stream_seconds: float | None,
    ) -> urllib3.BaseHTTPResponse:
        """One request on the apiserver's connection pool itself: what PoolManager.request
        did per request (parse the URL, find the pool by key, merge headers) is done once.
        Through a proxy (a ProxyManager), the manager's own path."""
        preload = stream_seconds is None
        if self._pool is None:
            return self._api.rest_client.pool_manager.request(
                method,
                self._host + path,
                body=data,
                headers=headers,
                timeout=timeout,
                preload_content=preload,
            )
        return self._pool.urlopen(
            method,
            path,
            body=data,
            headers=headers,
            timeout=timeout,
            preload_content=preload,
            redirect=False,
            assert_same_host=False,
        )

    def _json(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call without the client's slow model deserialisation; parse the JSON body."""
        response = self._call(fn, *args, _preload_content=False, **kwargs)
        return orjson.loads(response.data)

    # batch/v1 Jobs (pre/post-upgrade hooks, orchestrator.hooks)

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a Job; Conflict when one of that name exists."""
        return self._json(self._batch.create_namespaced_job, namespace, body)

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a Job as plain JSON; NotFound when there is none."""
        return self._json(self._batch.read_namespaced_job, name, namespace)

    # Secrets, events

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """The decoded data of a Secret."""
        import base64  # noqa: PLC0415  (only this method needs it)

        secret = self._call(self._core.read_namespaced_secret, name, namespace)
        return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}

    def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of a Namespace (for FleetProvider allowedNamespaces.selector)."""
        namespace = self._call(self._core.read_namespace, name)
        return dict(namespace.metadata.labels or {})

    # The admission webhook's self-managed certificate (one Secret) and CA bundle

    def read_secret_versioned(
        self, namespace: str, name: str
    ) -> tuple[dict[str, bytes], str] | None:
        """The decoded data of a Secret and its resourceVersion; None when it does not exist."""
        import base64  # noqa: PLC0415  (only the Secret methods need it)

        try:
            secret = self._json(self._core.read_namespaced_secret, name, namespace)
        except NotFound:
            return None
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return data, str(secret["metadata"]["resourceVersion"])

    def write_secret(
        self,
        namespace: str,
        name: str,
        data: dict[str, bytes],
        resource_version: str | None,
        labels: dict[str, str] | None = None,
    ) -> bool:
        """Create a kubernetes.io/tls Secret (resource_version None) or replace it if still at
        resource_version; False when it already exists or changed meanwhile (409)."""
        import base64  # noqa: PLC0415

        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        try:
            if resource_version is None:
                self._call(self._core.create_namespaced_secret, namespace, body)
            else:
                body["metadata"]["resourceVersion"] = resource_version  # type: ignore[index]
                self._call(self._core.replace_namespaced_secret, name, namespace, body)
        except Conflict:
            return False
        return True

    def set_webhook_ca_bundle(self, name: str, ca_bundle: bytes, mutating: bool = False) -> bool:
        """Put ca_bundle in every webhook of one ValidatingWebhookConfiguration (mutating: the
        MutatingWebhookConfiguration of that name), conditional on its resourceVersion, retried
        on 409; True when it changed something."""
        import base64  # noqa: PLC0415

        admission = client.AdmissionregistrationV1Api(self._api)
        read, patch = (
            (
                admission.read_mutating_webhook_configuration,
                admission.patch_mutating_webhook_configuration,
            )
            if mutating
            else (
                admission.read_validating_webhook_configuration,
                admission.patch_validating_webhook_configuration,
            )
        )
        encoded = base64.b64encode(ca_bundle).decode()
        for _ in range(3):
            config = self._json(read, name)
            ops: list[dict[str, Any]] = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded}
                for i, hook in enumerate(config.get("webhooks") or [])
                if (hook.get("clientConfig") or {}).get("caBundle") != encoded
            ]
            if not ops:
                return False
            version = config["metadata"]["resourceVersion"]
            ops.insert(0, {"op": "replace", "path": "/metadata/resourceVersion", "value": version})
            try:
                self._call(
                    patch,
                    name,
                    ops,
                    _content_type="application/json-patch+json",
                )
            except Conflict:
                continue
            return True
        kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
        raise Conflict(409, f"{kind} {name} kept changing")

    def create_event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        warning: bool,
        component: str,
        name: str | None = None,
    ) -> None:
        """Record a core/v1 Event about an object of ours (ClusterVersion, UpdateRun...).

        name: a deterministic name makes the create idempotent (Conflict when it exists)."""
        meta = obj["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": (
                {"name": name, "namespace": meta["namespace"]}
                if name
                else {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]}
            ),
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", api.API_VERSION),
                "kind": obj.get("kind", api.KIND),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason[:128],
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": component},
        }
        self._raw(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/events", body, "application/json"
        )

    # Leases

    def get_lease(
        self, namespace: str, name: str, timeout: float = REQUEST_TIMEOUT_SECONDS
    ) -> LeaseRecord | None:
        """Read a Lease, or None when absent."""
        try:
            lease = self._call(
                self._coord.read_namespaced_lease, name, namespace, _request_timeout=timeout
            )
        except NotFound:
            return None
        spec = lease.spec
        return LeaseRecord(
            holder=spec.holder_identity,
            renew_time=spec.renew_time,
            duration_seconds=int(spec.lease_duration_seconds or 15),
            transitions=int(spec.lease_transitions or 0),
            resource_version=lease.metadata.resource_version,
        )

    def write_lease(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration: int,
        transitions: int,
        acquire_time: datetime,
        renew_time: datetime,
        resource_version: str | None,
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        """Create the Lease (resource_version None) or replace it; Conflict when stale."""
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=name, namespace=namespace, resource_version=resource_version
            ),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=duration,
                lease_transitions=transitions,
                acquire_time=acquire_time,
                renew_time=renew_time,
            ),
        )
        if resource_version is None:
            self._call(
                self._coord.create_namespaced_lease, namespace, body, _request_timeout=timeout
            )
        else:
            self._call(
                self._coord.replace_namespaced_lease,
                name,
                namespace,
                body,
                _request_timeout=timeout,
            )

    # CRDs (used by the demo and tests to install ours)

    def apply_crd(self, crd: dict[str, Any]) -> None:
        """Create or replace a CustomResourceDefinition."""
        name = crd["metadata"]["name"]
        try:
            current = self._call(self._ext.read_custom_resource_definition, name)
        except NotFound:
            self._call(self._ext.create_custom_resource_definition, crd)
            return
        body = {
            **crd,
            "metadata": {**crd["metadata"], "resourceVersion": current.metadata.resource_version},
        }
        self._call(self._ext.replace_custom_resource_definition, name, body)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_SECONDS)  # never hang a reconcile
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise _wrap(exc) from exc
