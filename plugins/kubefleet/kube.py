"""The Kubernetes adapter: the one KubeFleet plugin module that imports the kubernetes client."""
# mypy: disable-error-code="no-untyped-call,no-any-return"
# (the kubernetes client is untyped; this adapter is the one place that touches it)

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config, watch
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


def _wrap(exc: ApiException) -> KubeError:
    status = int(exc.status or 0)
    try:
        message = json.loads(exc.body or "{}").get("message", exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    cls = {404: KubeNotFound, 409: KubeConflict, 410: KubeGone}.get(status, KubeError)
    text = str(message)
    return cls(status, text if len(text) <= 400 else text[:400] + "…")


def _unreachable(exc: Exception) -> KubeError:
    return KubeError(0, f"apiserver unreachable ({type(exc).__name__})")


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


class Kube:
    """Plain-JSON access to one apiserver; counts every request it makes, by verb.

    Built from a kubeconfig (default: in-cluster, then ~/.kube/config) or from a URL with a
    bearer token file (re-read before every request, so rotated tokens are picked up) and
    an optional CA file.
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
    ) -> None:
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
        else:
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
                    f"{flag}: cannot load the {what}'s kubeconfig {where} "
                    f"({type(exc).__name__}); pass a readable kubeconfig"
                ) from None
        cfg.connection_pool_maxsize = 16
        self.server = str(cfg.host)
        self._api = client.ApiClient(cfg)
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)
        self._closed = threading.Event()
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()

    # -- bookkeeping -------------------------------------------------------------------------

    def close(self) -> None:
        """Releases connections; open watches end with an error their loop ignores."""
        self._closed.set()
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
        if res.namespaced:
            return self._call(
                self._custom.get_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
            )
        return self._call(
            self._custom.get_cluster_custom_object, res.group, res.version, res.plural, name
        )

    def list(
        self, res: Resource, label_selector: str = "", namespace: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """LIST the objects (all namespaces unless one is given); items and resourceVersion."""
        self._count("list")
        if namespace:
            result = self._call(
                self._custom.list_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                label_selector=label_selector,
            )
        else:
            result = self._call(
                self._custom.list_cluster_custom_object,
                res.group,
                res.version,
                res.plural,
                label_selector=label_selector,
            )
        return list(result.get("items", [])), str(result["metadata"].get("resourceVersion", ""))

    def watch(
        self,
        res: Resource,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
        namespace: str = "",
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from resource_version on; KubeGone when it expired."""
        self._count("watch")
        stream = watch.Watch()
        if namespace:
            fn: Any = self._custom.list_namespaced_custom_object
            args: tuple[Any, ...] = (res.group, res.version, namespace, res.plural)
        else:
            fn = self._custom.list_cluster_custom_object
            args = (res.group, res.version, res.plural)
        try:
            for event in stream.stream(
                fn,
                *args,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                _request_timeout=timeout_seconds + 10,
            ):
                obj = event["object"]
                if event["type"] == "ERROR":
                    code = int(obj.get("code", 500)) if isinstance(obj, dict) else 500
                    message = str(obj.get("message")) if isinstance(obj, dict) else str(obj)
                    raise (KubeGone if code == 410 else KubeError)(code, message)
                yield str(event["type"]), obj
        except ApiException as exc:
            raise _wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
        finally:
            stream.stop()

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
        kwargs = {"_content_type": "application/merge-patch+json"}
        if res.namespaced:
            return self._call(
                self._custom.patch_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
                body,
                **kwargs,
            )
        return self._call(
            self._custom.patch_cluster_custom_object,
            res.group,
            res.version,
            res.plural,
            name,
            body,
            **kwargs,
        )

    def patch_status(
        self, res: Resource, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch of the status subresource (resourceVersion in body: conditional)."""
        self._count("patch")
        kwargs = {"_content_type": "application/merge-patch+json"}
        if res.namespaced:
            return self._call(
                self._custom.patch_namespaced_custom_object_status,
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
                body,
                **kwargs,
            )
        return self._call(
            self._custom.patch_cluster_custom_object_status,
            res.group,
            res.version,
            res.plural,
            name,
            body,
            **kwargs,
        )

    def delete(self, res: Resource, namespace: str, name: str) -> None:
        """DELETE one object (background propagation); KubeNotFound when it is gone already."""
        self._count("delete")
        if res.namespaced:
            self._call(
                self._custom.delete_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
                propagation_policy="Background",
            )
            return
        self._call(
            self._custom.delete_cluster_custom_object,
            res.group,
            res.version,
            res.plural,
            name,
            propagation_policy="Background",
        )

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        """Records a core/v1 Event (body in the Event's JSON shape)."""
        self._count("create")
        self._call(self._core.create_namespaced_event, namespace, body)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=_REQUEST_TIMEOUT, **kwargs)
        except ApiException as exc:
            raise _wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
