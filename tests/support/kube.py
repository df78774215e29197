"""Test-side view of the local control plane: clients, CRD installation and throwaway namespaces.

Processes are started by `devtools.controlplane` (shared with scripts/dev-control-plane); this
module wraps one running apiserver for tests. The fixtures in tests/conftest.py hand these out.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.config import new_client_from_config

from devtools.controlplane import REPO_ROOT, ApiServer
from orchestrator.adapters.kube import KubeClient

__all__ = ["PROJECT_CRDS", "KubeCluster", "load_crds", "wait_for"]

#: The project's CRDs, installed on the main apiserver by the `control_plane` fixture.
PROJECT_CRDS = REPO_ROOT / "manifests" / "crds"

CrdSource = Path | str | Mapping[str, Any]


def wait_for(what: str, check: Any, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll `check()` until it returns something truthy and return that; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true within {timeout:.0f}s")
        time.sleep(interval)


def load_crds(*sources: CrdSource) -> list[dict[str, Any]]:
    """CRD manifests from YAML files, directories of *.yaml files, YAML text, or dicts."""
    docs: list[tuple[str, Any]] = []
    for source in sources:
        if isinstance(source, Mapping):
            docs.append(("<dict>", dict(source)))
            continue
        path = Path(source) if isinstance(source, Path) or "\n" not in source else None
        if path is None:
            docs.extend(("<text>", d) for d in yaml.safe_load_all(str(source)))
        elif path.is_dir():
            for file in sorted(path.glob("*.yaml")):
                docs.extend((str(file), d) for d in yaml.safe_load_all(file.read_text()))
        else:
            docs.extend((str(path), d) for d in yaml.safe_load_all(path.read_text()))
    crds = []
    for origin, doc in docs:
        if doc is None:
            continue
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        if kind != "CustomResourceDefinition":
            raise ValueError(f"{origin}: expected kind CustomResourceDefinition, found {kind!r}")
        crds.append(doc)
    return crds


class KubeCluster:
    """One apiserver of the test control plane: its kubeconfig, clients, CRDs and namespaces."""

    def __init__(self, server: ApiServer) -> None:
        self.name = server.name
        self.url = server.url
        self.kubeconfig: Path = server.kubeconfig
        self._clients: weakref.WeakSet[k8s.ApiClient] = weakref.WeakSet()
        self._own: k8s.ApiClient | None = None
        self._discovery: tuple[frozenset[tuple[str, str]], list[str]] | None = None

    def __repr__(self) -> str:
        return f"KubeCluster({self.name!r}, {self.url!r})"

    # -- clients -------------------------------------------------------------------------------

    def api_client(self) -> k8s.ApiClient:
        """A new admin ApiClient for this apiserver; close it (or use `with`) when done.

        Clients still open when the session ends are closed then.
        """
        api = new_client_from_config(config_file=str(self.kubeconfig))
        self._clients.add(api)
        return api

    @property
    def _api(self) -> k8s.ApiClient:
        if self._own is None:
            self._own = self.api_client()
        return self._own

    def close(self) -> None:
        """Close every client handed out."""
        for api in list(self._clients):
            api.close()
        self._own = None

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> Any:
        """One raw request (the path may carry a query); the decoded JSON answer."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        request = self._api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self._api.call_api(*request)
        data = response.read()
        if response.status >= 400:
            raise ApiException.from_response(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
        return json.loads(data) if data else None

    def _get(self, path: str) -> Any:
        return self._call("GET", path)

    # -- CRDs ----------------------------------------------------------------------------------

    def install_crds(self, *sources: CrdSource, timeout: float = 30.0) -> list[str]:
        """Create or update CRDs and wait until each is Established and served; return names.

        Sources are YAML files, directories of *.yaml files, YAML text, or manifest dicts.
        Raises orchestrator.adapters.kube.KubeError when the apiserver rejects one.
        """
        crds = load_crds(*sources)
        kube = KubeClient(str(self.kubeconfig))
        try:
            for crd in crds:
                kube.apply_crd(crd)
        finally:
            kube.close()
        for crd in crds:
            self._wait_served(crd, timeout)
        return [crd["metadata"]["name"] for crd in crds]

    def _wait_served(self, crd: Mapping[str, Any], timeout: float) -> None:
        ext = k8s.ApiextensionsV1Api(self._api)
        name = crd["metadata"]["name"]

        def established() -> bool:
            status = ext.read_custom_resource_definition(name).status
            return any(
                c.type == "Established" and c.status == "True" for c in status.conditions or []
            )

        wait_for(f"CRD {name} Established", established, timeout)
        group = crd["spec"]["group"]
        plural = crd["spec"]["names"]["plural"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                path = f"/apis/{group}/{version['name']}/{plural}?limit=1"
                wait_for(f"{path} served", lambda p=path: self._served(p), timeout)

    def _served(self, path: str) -> bool:
        try:
            self._get(path)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    # -- namespaces ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def temporary_namespace(self, prefix: str = "test") -> Iterator[str]:
        """A fresh namespace `<prefix>-<random>`; afterwards its objects and it are deleted.

        No namespace controller runs here, so the teardown plays its role: it deletes every
        namespaced object (clearing finalizers left behind) and then finalizes the namespace.
        """
        name = f"{prefix[:40].rstrip('-')}-{uuid.uuid4().hex[:8]}"
        core = k8s.CoreV1Api(self._api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        try:
            yield name
        finally:
            self.delete_namespace(name)

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace and everything in it, as the namespace controller would."""
        core = k8s.CoreV1Api(self._api)
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)
        for template in self._namespaced_collections():
            url = template.format(ns=name)
            items = self._get(url)["items"]
            if not items:
                continue
            self._call("DELETE", url)
            for item in items:
                if item["metadata"].get("finalizers"):
                    item_url = f"{url}/{item['metadata']['name']}"
                    patch = {"metadata": {"finalizers": None}}
                    with contextlib.suppress(ApiException):
                        self._call("PATCH", item_url, patch, "application/merge-patch+json")
        with contextlib.suppress(ApiException):
            namespace = core.read_namespace(name)
            namespace.spec.finalizers = []
            core.replace_namespace_finalize(name, namespace)

    def _namespaced_collections(self) -> list[str]:
        """URL templates (`{ns}` to fill) of every namespaced, deletable resource collection.

        Cached until the set of CRDs changes (built-in types never change while it runs).
        """
        crds = self._get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]
        key = frozenset((c["metadata"]["name"], c["metadata"]["resourceVersion"]) for c in crds)
        if self._discovery is not None and self._discovery[0] == key:
            return self._discovery[1]
        # Every version of every group, the preferred one first: a resource served only in
        # another version of its group (e.g. a v1beta1 kind beside v1 kinds) is found too.
        group_versions = [("", "/api/v1")]
        for group in self._get("/apis")["groups"]:
            preferred = group["preferredVersion"]["groupVersion"]
            others = [
                v["groupVersion"] for v in group["versions"] if v["groupVersion"] != preferred
            ]
            group_versions += [(group["name"], f"/apis/{gv}") for gv in [preferred, *others]]
        collections = []
        seen: set[tuple[str, str]] = set()
        for group_name, prefix in group_versions:
            for resource in self._get(prefix)["resources"]:
                verbs = set(resource.get("verbs", []))
                if (group_name, resource["name"]) in seen:
                    continue
                seen.add((group_name, resource["name"]))
                if (
                    resource["namespaced"]
                    and "/" not in resource["name"]
                    and {"list", "deletecollection"} <= verbs
                    and not (prefix == "/apis/events.k8s.io/v1" and resource["name"] == "events")
                ):
                    collections.append(f"{prefix}/namespaces/{{ns}}/{resource['name']}")
        self._discovery = (key, collections)
        return collections
