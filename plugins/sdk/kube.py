"""Plain-JSON access to an apiserver: the SDK module that imports the kubernetes client."""
# mypy: disable-error-code="no-untyped-call,no-any-return"
# (the kubernetes client is untyped; this adapter is the one place that touches it)

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import urllib3

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException

__all__ = [
    "Kube",
    "KubeConflict",
    "KubeError",
    "KubeGone",
    "KubeNotFound",
    "Resource",
]

_REQUEST_TIMEOUT = 10.0
_MESSAGE_MAX = 400


@dataclass(frozen=True)
class Resource:
    """One API resource type: group ("" for core), version, plural, kind and scope."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        """apiVersion as written in objects ("v1" for the core group)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


class KubeError(Exception):
    """An API call failed; status is the HTTP status (0 when the server was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class KubeNotFound(KubeError):
    """404."""


class KubeConflict(KubeError):
    """409: a stale resourceVersion, or the object exists already."""


class KubeGone(KubeError):
    """410: a watch's resourceVersion expired; list again."""


def _error(status: int, body: str | bytes | None, reason: str) -> KubeError:
    try:
        message = json.loads(body or "{}").get("message", reason)
    except (ValueError, AttributeError):
        message = reason
    cls = {404: KubeNotFound, 409: KubeConflict, 410: KubeGone}.get(status, KubeError)
    text = str(message)
    return cls(status, text if len(text) <= _MESSAGE_MAX else text[:_MESSAGE_MAX] + "…")


def _token_hook(path: str) -> Any:
    """A refresh hook that re-reads a (possibly rotated) bearer token file before each call."""

    def refresh(cfg: Any) -> None:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError:
            return  # keep the last token; the call fails with 401 and says so
        cfg.api_key["authorization"] = token
        cfg.api_key_prefix["authorization"] = "Bearer"

    return refresh


def _configuration(
    kubeconfig: str | None,
    url: str | None,
    token_file: str | None,
    ca_file: str | None,
    what: str,
    flag: str,
    fix: str,
) -> Any:
    """The client configuration from a URL and token file, or from a kubeconfig."""
    # Imported here, not with the module: the orchestrator imports plugins.sdk without
    # building a Kube, and the kubernetes package costs it ~19 MiB (issue 21).
    from kubernetes import client, config  # noqa: PLC0415

    cfg = client.Configuration()
    if url:
        if not token_file:
            raise ValueError(f"{flag}: a URL needs a bearer token file as well")
        if not Path(token_file).is_file():
            raise ValueError(f"{flag}: cannot read the token file {token_file!r}")
        cfg.host = url
        cfg.api_key = {}
        cfg.api_key_prefix = {}
        hook = _token_hook(token_file)
        cfg.refresh_api_key_hook = hook
        hook(cfg)
        if ca_file:
            cfg.ssl_ca_cert = ca_file
        return cfg
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError) as exc:
        where = repr(kubeconfig) if kubeconfig else "in-cluster or ~/.kube/config"
        raise ValueError(
            f"{flag}: cannot load the {what}'s kubeconfig {where} ({type(exc).__name__}); {fix}"
        ) from None
    return cfg


class Kube:
    """Plain-JSON access to one apiserver; counts every request it makes, by verb.

    Built from a kubeconfig (default: in-cluster, then ~/.kube/config) or from a URL with a
    bearer token file (re-read before every request, so rotated tokens are picked up) and
    an optional CA file. what names the server in configuration errors, fix is the advice
    they end with, and label names it when it cannot be reached ("<label> unreachable").
    """

    def __init__(
        self,
        kubeconfig: str | None = None,
        *,
        url: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        what: str = "apiserver",
        flag: str = "--kubeconfig",
        fix: str = "pass a readable kubeconfig",
        label: str = "apiserver",
    ) -> None:
        cfg = _configuration(kubeconfig, url, token_file, ca_file, what, flag, fix)
        cfg.connection_pool_maxsize = 16
        from kubernetes import client  # noqa: PLC0415  (loaded by _configuration)

        self.server = str(cfg.host)
        self._label = label
        self._api = client.ApiClient(cfg)
        self._custom = client.CustomObjectsApi(self._api)
        self._core: Any = None  # made on first use: building CoreV1Api takes half a second
        self._closed = threading.Event()
        self._streams: set[Any] = set()
        self._streams_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    # -- bookkeeping -------------------------------------------------------------------------

    def close(self) -> None:
        """Releases connections; open watch streams are shut down (their readers return)."""
        with self._streams_lock:
            self._closed.set()
            streams = list(self._streams)
        for resp in streams:
            try:
                resp.shutdown()
            # RuntimeError: urllib3 refuses to shut down a stream whose connection already went
            # back to the pool (the watch ended just now); closing it is all that is left.
            except (OSError, AttributeError, RuntimeError):
                resp.close()
        self._api.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed.is_set()

    def requests(self) -> dict[str, int]:
        """Requests made so far, by verb (get, list, watch, create, patch, update, delete)."""
        with self._counts_lock:
            return dict(self._counts)

    def _count(self, verb: str) -> None:
        with self._counts_lock:
            self._counts[verb] += 1

    # -- custom (and core) objects as JSON ----------------------------------------------------

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        """GET one object."""
        self._count("get")
        return self._by_name(
            res,
            namespace,
            name,
            self._custom.get_namespaced_custom_object,
            self._custom.get_cluster_custom_object,
        )

    def list(
        self, res: Resource, label_selector: str = "", namespace: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """LIST the objects (all namespaces unless one is given); items and resourceVersion."""
        self._count("list")
        fn, args = self._lister(res, namespace)
        result = self._call(fn, *args, label_selector=label_selector)
        return list(result.get("items", [])), str(result["metadata"].get("resourceVersion", ""))

    def watch(
        self,
        res: Resource,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        namespace: str = "",
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from resource_version on; KubeGone when it expired.

        The stream's connection is tracked, so close() interrupts a blocked read at once.
        """
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
        from kubernetes.watch.watch import iter_resp_lines  # noqa: PLC0415

        self._count("watch")
        fn, args = self._lister(res, namespace)
        try:
            resp: Any = fn(
                *args,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                watch=True,
                _preload_content=False,
                _request_timeout=timeout_seconds + 10,
            )
        except ApiException as exc:
            raise self._wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise self._unreachable(exc) from exc
        with self._streams_lock:
            if self.closed:
                resp.release_conn()
                self._closed_meanwhile()
                return
            self._streams.add(resp)
        try:
            if not 200 <= int(resp.status) <= 299:
                raise _error(int(resp.status), resp.read(), str(resp.reason))
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    code = int(obj.get("code", 500)) if isinstance(obj, dict) else 500
                    message = str(obj.get("message")) if isinstance(obj, dict) else str(obj)
                    raise (KubeGone if code == 410 else KubeError)(code, message)
                yield str(event.get("type")), obj
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise self._unreachable(exc) from exc
        finally:
            with self._streams_lock:
                self._streams.discard(resp)
            resp.release_conn()
            self._closed_meanwhile()

    def create(self, res: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a new object; KubeConflict when it exists already."""
        self._count("create")
        if res.namespaced:
            return self._call(
                self._custom.create_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                body,
            )
        return self._call(
            self._custom.create_cluster_custom_object, res.group, res.version, res.plural, body
        )

    def merge_patch(
        self, res: Resource, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch (RFC 7386); a metadata.resourceVersion in body makes it conditional."""
        self._count("patch")
        return self._by_name(
            res,
            namespace,
            name,
            self._custom.patch_namespaced_custom_object,
            self._custom.patch_cluster_custom_object,
            body,
            _content_type="application/merge-patch+json",
        )

    def patch_latest(
        self,
        res: Resource,
        namespace: str,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any] | None],
        attempts: int,
    ) -> bool:
        """Read-modify-write: GET the object, change(object) gives a merge patch (None: nothing
        to write), sent conditional on the resourceVersion read; a 409 reads again.

        False when the object kept changing for all attempts; KubeNotFound and other
        KubeErrors reach the caller.
        """
        for _ in range(attempts):
            fresh = self.get(res, namespace, name)
            patch = change(fresh)
            if patch is None:
                return True
            version = fresh["metadata"]["resourceVersion"]
            patch = {
                **patch,
                "metadata": {**(patch.get("metadata") or {}), "resourceVersion": version},
            }
            try:
                self.merge_patch(res, namespace, name, patch)
                return True
            except KubeConflict:
                continue
        return False

    def patch_status(
        self, res: Resource, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch of the status subresource (resourceVersion in body: conditional)."""
        self._count("patch")
        return self._by_name(
            res,
            namespace,
            name,
            self._custom.patch_namespaced_custom_object_status,
            self._custom.patch_cluster_custom_object_status,
            body,
            _content_type="application/merge-patch+json",
        )

    def replace(
        self, res: Resource, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """PUT the whole object (body carries metadata.resourceVersion: KubeConflict if stale)."""
        self._count("update")
        return self._by_name(
            res,
            namespace,
            name,
            self._custom.replace_namespaced_custom_object,
            self._custom.replace_cluster_custom_object,
            body,
        )

    def delete(self, res: Resource, namespace: str, name: str) -> None:
        """DELETE one object (background propagation); KubeNotFound when it is gone already."""
        self._count("delete")
        self._by_name(
            res,
            namespace,
            name,
            self._custom.delete_namespaced_custom_object,
            self._custom.delete_cluster_custom_object,
            propagation_policy="Background",
        )

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        """Records a core/v1 Event (body in the Event's JSON shape)."""
        self._count("create")
        if self._core is None:
            from kubernetes import client  # noqa: PLC0415

            self._core = client.CoreV1Api(self._api)
        self._call(self._core.create_namespaced_event, namespace, body)

    # -- plumbing ----------------------------------------------------------------------------

    def _lister(self, res: Resource, namespace: str) -> tuple[Any, tuple[Any, ...]]:
        if namespace:
            return self._custom.list_namespaced_custom_object, (
                res.group,
                res.version,
                namespace,
                res.plural,
            )
        return self._custom.list_cluster_custom_object, (res.group, res.version, res.plural)

    def _by_name(
        self,
        res: Resource,
        namespace: str,
        name: str,
        namespaced: Any,
        cluster: Any,
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        if res.namespaced:
            return self._call(
                namespaced, res.group, res.version, namespace, res.plural, name, *rest, **kwargs
            )
        return self._call(cluster, res.group, res.version, res.plural, name, *rest, **kwargs)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

        if self.closed:
            raise KubeError(0, f"{self._label}: client closed")
        try:
            return fn(*args, _request_timeout=_REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            raise self._wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise self._unreachable(exc) from exc
        finally:
            self._closed_meanwhile()

    def _closed_meanwhile(self) -> None:
        """A request that raced close() (an informer's relist) may have opened a connection in
        a pool close() had already emptied: close it now rather than leave it to the garbage
        collector (the ResourceWarning that failed CI; tests/support/socket_origins named it)."""
        if self.closed:
            self._api.rest_client.pool_manager.clear()

    def _wrap(self, exc: ApiException) -> KubeError:
        return _error(int(exc.status or 0), exc.body, str(exc.reason))

    def _unreachable(self, exc: Exception) -> KubeError:
        return KubeError(0, f"{self._label} unreachable ({type(exc).__name__})")
