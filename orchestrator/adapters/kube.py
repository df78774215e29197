"""The Kubernetes adapter: every request the orchestrator makes to the apiserver.

No generated client: each request is JSON bytes straight to the apiserver over kept-alive
connections with the TLS settings of `kubeconfig.connection` (CA, client certificate,
verification, tls-server-name), its headers built once per content type and rebuilt only when
the credential changes (`kubeconfig.Credentials`). A request answered whole (every write, get
and list) goes over `wire.Connections`: the request written as one buffer (its body with it up
to 16 KiB: one TLS write) and the answer's head parsed for what HTTP/1.1 needs; a watch (an
answer read as a stream), and everything through a proxy, over urllib3's pool, each watch
event decoded once, by orjson (`watch_objects`). Leases, Secrets, Events, Jobs, Namespaces,
webhook configurations and CRDs go the same way. The `kubernetes` package is not imported (its
kubeconfig loader alone brings oauthlib, requests, google.auth and cryptography, about 19 MiB),
except by `kubeconfig` for a user that needs an exec credential plugin or an auth-provider.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import urllib3

from orchestrator import api
from orchestrator.adapters import kubeconfig, wire
from orchestrator.pipeline.lease import LeaseRecord

__all__ = ["Conflict", "Gone", "KubeClient", "KubeError", "LeaseRecord", "NotFound", "WatchEvent"]

log = logging.getLogger(__name__)
#: Deadline of one API request (watches have their own server-side timeout).
REQUEST_TIMEOUT_SECONDS = 30.0
#: How often a credential that can change is looked at again at most (a token file, an exec
#: plugin's expiring token); a 401 looks at once.
CREDENTIAL_CHECK_SECONDS = kubeconfig.CREDENTIAL_CHECK_SECONDS
#: A watch's socket may stay silent this much longer than its server-side timeout.
WATCH_READ_GRACE_SECONDS = 30.0
_REQUEST_TIMEOUT = urllib3.Timeout(total=REQUEST_TIMEOUT_SECONDS)


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


def _error(status: int, body: Any, reason: Any) -> KubeError:
    try:
        message = orjson.loads(body or b"{}").get("message", reason)
    except (ValueError, AttributeError):
        message = str(reason)
    cls = {404: NotFound, 409: Conflict, 410: Gone}.get(status, KubeError)
    text = str(message)
    return cls(status, text if len(text) <= 400 else text[:400] + "…")


def _rest_path(base: str, plural: str, namespace: str | None, name: str) -> str:
    """The REST path of plural under base (an API group's version) in namespace, or in every
    namespace / cluster-scoped (None), or of one object when name is given."""
    where = f"namespaces/{quote(namespace, safe='')}/" if namespace else ""
    return f"{base}/{where}{plural}" + (f"/{quote(name, safe='')}" if name else "")


def _core_path(plural: str, namespace: str | None, name: str = "", group: str = "") -> str:
    """The REST path of a built-in kind: core/v1 (group ""), or v1 of group."""
    return _rest_path(f"/apis/{group}/v1" if group else "/api/v1", plural, namespace, name)


#: The API group version of our kinds, under which `_path` builds.
_OURS = f"/apis/{api.GROUP}/{api.VERSION}"


def _path(plural: str, namespace: str | None, name: str = "") -> str:
    """The REST path of our objects of plural in namespace, or in every namespace (None), or
    one object when name is given."""
    return _rest_path(_OURS, plural, namespace, name)


def _timeout(seconds: float, stream_seconds: float | None) -> urllib3.Timeout:
    """urllib3's timeout of a request answered whole within seconds, or of a stream whose
    socket may be silent stream_seconds."""
    if stream_seconds is not None:
        return urllib3.Timeout(connect=REQUEST_TIMEOUT_SECONDS, read=stream_seconds)
    return (
        _REQUEST_TIMEOUT if seconds == REQUEST_TIMEOUT_SECONDS else urllib3.Timeout(total=seconds)
    )


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


class KubeClient:
    """Typed access to the few API calls the orchestrator makes."""

    def __init__(self, kubeconfig_path: str | None = None, context: str | None = None) -> None:
        """kubeconfig_path: a kubeconfig (or several joined by the path separator); None:
        in-cluster, else KUBECONFIG or ~/.kube/config (`kubeconfig.connection`). Raises
        kubeconfig.KubeConfigError when it cannot be read."""
        conn = kubeconfig.connection(kubeconfig_path, context)
        self._credentials = conn.credentials
        url = urllib3.util.parse_url(conn.host)
        if not url.host:
            raise kubeconfig.KubeConfigError("server: no host in the apiserver's URL")
        #: The server's URL without its path; every request's path starts with _base (a
        #: server URL may carry a path prefix, as behind a proxy to several clusters).
        self._host = f"{url.scheme}://{url.netloc}"
        self._base = (url.path or "").rstrip("/")
        self._headers: dict[str, str] = {
            "Accept": "application/json",
            "User-Agent": "fleet-orchestrator",
        }
        self._lock = threading.Lock()
        self._auth_seen: dict[str, str] | None = None
        #: Per content type: the headers as urllib3 takes them, and as `wire` sends them.
        self._by_type: dict[str, tuple[dict[str, str], bytes]] = {}
        self._netloc: str = url.netloc or url.host
        tls: dict[str, Any] = {}
        if conn.tls is not None:
            tls = {"ssl_context": conn.tls, "server_hostname": conn.server_hostname}
        # Requests answered whole (the parallel writes of one reconcile, 32): `_wire`; the
        # watches: `_pool`; everything through a proxy: `_manager`.
        self._manager: urllib3.PoolManager | None = None
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._wire: wire.Connections | None = None
        port = url.port or (443 if conn.tls is not None else 80)
        if conn.proxy:
            self._manager = urllib3.ProxyManager(conn.proxy, maxsize=64, **tls)
        else:
            # An IPv6 literal is bracketed in the URL (and the Host header), not in the address.
            address = url.host.removeprefix("[").removesuffix("]")
            self._wire = wire.Connections(address, port, conn.tls, conn.server_hostname)
            if conn.tls is not None:
                self._pool = urllib3.HTTPSConnectionPool(url.host, port, maxsize=16, **tls)
            else:
                self._pool = urllib3.HTTPConnectionPool(url.host, port, maxsize=16)

    def close(self) -> None:
        """Release connections: every pooled connection to the apiserver is closed now (the
        garbage collector would close their sockets whenever it runs, with a
        ResourceWarning)."""
        if self._wire is not None:
            self._wire.close()
        if self._pool is not None:
            self._pool.close()
        if self._manager is not None:
            self._manager.clear()

    # ClusterVersions

    def set_annotation(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set one annotation, or delete it with None (merge patch)."""
        self.merge_patch(api.PLURAL, namespace, name, {"metadata": {"annotations": {key: value}}})

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
        assert isinstance(response, urllib3.BaseHTTPResponse)  # a stream: urllib3's
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

        The hot path of a rollout (one write per cluster step): one JSON patch, as bytes over
        the client's connection pool.
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
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        self._raw("DELETE", _path(plural, namespace, name), options, "application/json")

    def _raw(
        self,
        method: str,
        path: str,
        body: Any,
        content_type: str = "application/json",
        timeout: float = REQUEST_TIMEOUT_SECONDS,
    ) -> dict[str, Any]:
        """One JSON request; the parsed answer (a JSON object)."""
        data = None if body is None else orjson.dumps(body)
        answer: dict[str, Any] = orjson.loads(
            self._request(method, path, data, content_type, None, timeout).data
        )
        return answer

    def _request(
        self,
        method: str,
        path: str,
        data: bytes | None,
        content_type: str,
        stream_seconds: float | None,
        timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
    ) -> urllib3.BaseHTTPResponse | wire.Answer:
        """One request with the cached credentials; a 401 asks for the credential again at
        once and, when that changed the credential, is sent once more. stream_seconds: the
        answer is a stream read by the caller (a urllib3 response), whose socket may be silent
        that long; otherwise it is read whole within timeout_seconds (over `_wire`, unless
        through a proxy). Raises KubeError (or its subclasses) on errors."""
        for attempt in range(2):
            try:
                headers, head = self._headers_for(content_type)
                if stream_seconds is None and self._wire is not None:
                    response: urllib3.BaseHTTPResponse | wire.Answer = self._wire.request(
                        method, self._base + path, head, data, timeout_seconds
                    )
                else:
                    timeout = _timeout(timeout_seconds, stream_seconds)
                    response = self._send(method, path, data, headers, timeout, stream_seconds)
            except wire.WireError as err:  # says how, never a header's value
                raise KubeError(0, f"{method} {path}: {err}") from None
            except urllib3.exceptions.HTTPError as err:
                raise KubeError(0, f"{method} {path}: {err}") from err
            if 200 <= response.status < 300:
                return response
            answer = response.data  # the error's body, read whole
            if isinstance(response, urllib3.BaseHTTPResponse):
                response.release_conn()
            if response.status == 401 and attempt == 0 and self._credentials.refreshed():
                continue
            raise _error(response.status, answer, response.reason)
        raise AssertionError("unreachable")  # pragma: no cover

    def _headers_for(self, content_type: str) -> tuple[dict[str, str], bytes]:
        """The request headers for a body of content_type, as urllib3 takes them and as
        `wire` sends them: built once per content type and credential (the same objects
        until the credential changes; never edited after)."""
        auth = self._credentials.headers()
        with self._lock:
            if auth is not self._auth_seen:
                self._auth_seen = auth
                self._by_type = {}
            known = self._by_type.get(content_type)
            if known is None:
                headers = {**self._headers, **auth, "Content-Type": content_type}
                known = (headers, wire.head_block(self._netloc, headers))
                self._by_type[content_type] = known
            return known

    def _send(
        self,
        method: str,
        path: str,
        data: bytes | None,
        headers: dict[str, str],
        timeout: urllib3.Timeout,
        stream_seconds: float | None,
    ) -> urllib3.BaseHTTPResponse:
        """One request over urllib3: a watch on the apiserver's connection pool itself (what
        PoolManager.request did per request, parse the URL, find the pool by key, merge
        headers, done once), or anything through a proxy (a ProxyManager)."""
        preload = stream_seconds is None
        path = self._base + path
        if self._pool is None:
            assert self._manager is not None
            return self._manager.request(
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

    # batch/v1 Jobs (pre/post-upgrade hooks, orchestrator.hooks)

    def create_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a Job; Conflict when one of that name exists."""
        return self._raw("POST", _core_path("jobs", namespace, group="batch"), body)

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a Job as plain JSON; NotFound when there is none."""
        return self._raw("GET", _core_path("jobs", namespace, name, group="batch"), None)

    # Secrets, events

    def read_secret(self, namespace: str, name: str) -> dict[str, bytes]:
        """The decoded data of a Secret."""
        secret = self._raw("GET", _core_path("secrets", namespace, name), None)
        return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}

    def namespace_labels(self, name: str) -> dict[str, str]:
        """The labels of a Namespace (for FleetProvider allowedNamespaces.selector)."""
        namespace = self._raw("GET", _core_path("namespaces", None, name), None)
        return dict(namespace["metadata"].get("labels") or {})

    # The admission webhook's self-managed certificate (one Secret) and CA bundle

    def read_secret_versioned(
        self, namespace: str, name: str
    ) -> tuple[dict[str, bytes], str] | None:
        """The decoded data of a Secret and its resourceVersion; None when it does not exist."""
        try:
            secret = self._raw("GET", _core_path("secrets", namespace, name), None)
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
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": metadata,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        try:
            if resource_version is None:
                self._raw("POST", _core_path("secrets", namespace), body)
            else:
                metadata["resourceVersion"] = resource_version
                self._raw("PUT", _core_path("secrets", namespace, name), body)
        except Conflict:
            return False
        return True

    def set_webhook_ca_bundle(self, name: str, ca_bundle: bytes, mutating: bool = False) -> bool:
        """Put ca_bundle in every webhook of one ValidatingWebhookConfiguration (mutating: the
        MutatingWebhookConfiguration of that name), conditional on its resourceVersion, retried
        on 409; True when it changed something."""
        kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
        path = _core_path(f"{kind.lower()}s", None, name, group="admissionregistration.k8s.io")
        encoded = base64.b64encode(ca_bundle).decode()
        for _ in range(3):
            config = self._raw("GET", path, None)
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
                self._raw("PATCH", path, ops, "application/json-patch+json")
            except Conflict:
                continue
            return True
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
        path = _core_path("leases", namespace, name, group="coordination.k8s.io")
        try:
            lease = self._raw("GET", path, None, timeout=timeout)
        except NotFound:
            return None
        spec = lease.get("spec") or {}
        renewed = spec.get("renewTime")
        return LeaseRecord(
            holder=spec.get("holderIdentity"),
            renew_time=datetime.fromisoformat(renewed) if renewed else None,
            duration_seconds=int(spec.get("leaseDurationSeconds") or 15),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=lease["metadata"].get("resourceVersion"),
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
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": duration,
                "leaseTransitions": transitions,
                # MicroTime: RFC 3339 with microseconds, as the generated client wrote it.
                "acquireTime": acquire_time.isoformat(),
                "renewTime": renew_time.isoformat(),
            },
        }
        group = "coordination.k8s.io"
        if resource_version is None:
            self._raw("POST", _core_path("leases", namespace, group=group), body, timeout=timeout)
        else:
            path = _core_path("leases", namespace, name, group=group)
            self._raw("PUT", path, body, timeout=timeout)

    # CRDs (used by the demo and tests to install ours)

    def apply_crd(self, crd: dict[str, Any]) -> None:
        """Create or replace a CustomResourceDefinition."""
        name = crd["metadata"]["name"]
        group = "apiextensions.k8s.io"
        path = _core_path("customresourcedefinitions", None, name, group=group)
        try:
            current = self._raw("GET", path, None)
        except NotFound:
            self._raw("POST", _core_path("customresourcedefinitions", None, group=group), crd)
            return
        version = current["metadata"]["resourceVersion"]
        body = {**crd, "metadata": {**crd["metadata"], "resourceVersion": version}}
        self._raw("PUT", path, body)
