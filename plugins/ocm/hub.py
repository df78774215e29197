"""The hub adapter: the one module of the OCM plugin that imports the kubernetes client."""
# mypy: disable-error-code="no-untyped-call,no-any-return"
# (the kubernetes client is untyped; this adapter is the one place that touches it)

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

__all__ = [
    "CLUSTER_CURATORS",
    "MANAGED_CLUSTERS",
    "MANIFEST_WORKS",
    "Hub",
    "HubConflict",
    "HubError",
    "HubGone",
    "HubNotFound",
    "Resource",
]


@dataclass(frozen=True)
class Resource:
    """One custom resource type on the hub."""

    group: str
    version: str
    plural: str
    namespaced: bool

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}"


MANAGED_CLUSTERS = Resource("cluster.open-cluster-management.io", "v1", "managedclusters", False)
"""ManagedCluster (cluster-scoped; name = cluster name = its namespace on the hub)."""

CLUSTER_CURATORS = Resource(
    "cluster.open-cluster-management.io", "v1beta1", "clustercurators", True
)
"""ClusterCurator (stolostron; namespaced, by convention named after the cluster)."""

MANIFEST_WORKS = Resource("work.open-cluster-management.io", "v1", "manifestworks", True)
"""ManifestWork (in the cluster's namespace on the hub)."""


class HubError(Exception):
    """A hub API call failed; status is the HTTP status (0 when the hub was not reached)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message


class HubNotFound(HubError):
    """404."""


class HubConflict(HubError):
    """409: a stale resourceVersion, or the object exists already."""


class HubGone(HubError):
    """410: a watch's resourceVersion expired; list again."""


def _error(status: int, body: str | bytes | None, reason: str) -> HubError:
    try:
        message = json.loads(body or "{}").get("message", reason)
    except (ValueError, AttributeError):
        message = reason
    cls = {404: HubNotFound, 409: HubConflict, 410: HubGone}.get(status, HubError)
    text = str(message)
    return cls(status, text if len(text) <= 400 else text[:400] + "…")


def _wrap(exc: ApiException) -> HubError:
    return _error(int(exc.status or 0), exc.body, str(exc.reason))


def _unreachable(exc: Exception) -> HubError:
    return HubError(0, f"hub unreachable ({type(exc).__name__})")


class Hub:
    """Plain-JSON access to the hub's custom resources: get, list, watch, create, patch."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        cfg = client.Configuration()
        try:
            if kubeconfig:
                config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
            else:
                try:
                    config.load_incluster_config(client_configuration=cfg)
                except config.ConfigException:
                    config.load_kube_config(client_configuration=cfg)
        except (config.ConfigException, OSError) as exc:
            where = repr(kubeconfig) if kubeconfig else "in-cluster or ~/.kube/config"
            raise ValueError(
                f"--kubeconfig: cannot load the hub's kubeconfig {where} ({type(exc).__name__}); "
                "pass a readable kubeconfig of the OCM hub"
            ) from None
        cfg.connection_pool_maxsize = 16
        self.server = str(cfg.host)
        self._api = client.ApiClient(cfg)
        self._custom = client.CustomObjectsApi(self._api)
        self._closed = threading.Event()
        self._streams: set[Any] = set()
        self._streams_lock = threading.Lock()

    def close(self) -> None:
        """Releases connections; open watch streams are shut down (their readers return)."""
        with self._streams_lock:
            self._closed.set()
            streams = list(self._streams)
        for resp in streams:
            try:
                resp.shutdown()
            except (OSError, AttributeError):
                resp.close()
        self._api.close()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed.is_set()

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        """GET one object."""
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

    def list(self, res: Resource, label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        """LIST every object (all namespaces); returns the items and the list resourceVersion."""
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
        timeout_seconds: int = 30,
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) from resource_version on; HubGone when it expired.

        The stream's connection is tracked, so close() interrupts a blocked read at once.
        """
        try:
            resp: Any = self._custom.list_cluster_custom_object(
                res.group,
                res.version,
                res.plural,
                label_selector=label_selector,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=True,
                watch=True,
                _preload_content=False,
                _request_timeout=timeout_seconds + 10,
            )
        except ApiException as exc:
            raise _wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
        with self._streams_lock:
            if self.closed:
                resp.release_conn()
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
                    raise (HubGone if code == 410 else HubError)(code, str(obj.get("message")))
                yield str(event.get("type")), obj
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
        finally:
            with self._streams_lock:
                self._streams.discard(resp)
            resp.release_conn()

    def create(self, res: Resource, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a new object; HubConflict when it exists already."""
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

    def replace(
        self, res: Resource, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """PUT the whole object (body carries metadata.resourceVersion: HubConflict if stale)."""
        if res.namespaced:
            return self._call(
                self._custom.replace_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                name,
                body,
            )
        return self._call(
            self._custom.replace_cluster_custom_object,
            res.group,
            res.version,
            res.plural,
            name,
            body,
        )

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=10, **kwargs)
        except ApiException as exc:
            raise _wrap(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise _unreachable(exc) from exc
