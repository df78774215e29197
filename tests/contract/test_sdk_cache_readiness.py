"""plugins.sdk.caches_readiness / require_listed: what a plugin whose answers come from watch
caches says while they are not listed yet (its readiness probe, and UNAVAILABLE to callers),
against a real apiserver and one that does not answer."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from plugins.sdk import (
    Informer,
    Kube,
    Resource,
    Unavailable,
    caches_readiness,
    require_listed,
)
from tests.support.kube import KubeCluster, wait_for

APISERVICES = Resource("apiregistration.k8s.io", "v1", "apiservices", "APIService", False)
CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)


@pytest.fixture
def kube(control_plane: KubeCluster) -> Iterator[Kube]:
    client = Kube(str(control_plane.kubeconfig))
    yield client
    client.close()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def unreachable(control_plane: KubeCluster, tmp_path: Path) -> Iterator[Kube]:
    """A client of the control plane's kubeconfig pointed at a port nothing listens on."""
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{_closed_port()}"
    path = tmp_path / "unreachable.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    client = Kube(str(path))
    yield client
    client.close()


def test_caches_not_started_are_not_ready_and_callers_are_told_to_retry(kube: Kube) -> None:
    informers = [Informer(kube, APISERVICES), Informer(kube, CRDS)]
    ready, why = caches_readiness(informers)
    assert not ready
    assert why == f"{APISERVICES} not listed yet: first list in progress"
    with pytest.raises(Unavailable) as raised:
        require_listed(informers, "hub east")
    assert raised.value.message == (
        f"hub east: {APISERVICES} not listed yet (the first list is in progress); retry"
    )


def test_listed_caches_are_ready_and_let_callers_through(kube: Kube) -> None:
    informers = [Informer(kube, APISERVICES), Informer(kube, CRDS)]
    for informer in informers:
        informer.start()
    try:
        assert all(informer.wait_synced(30) for informer in informers)
        assert caches_readiness(informers) == (True, "")
        require_listed(informers, "hub")  # raises nothing
    finally:
        for informer in informers:
            informer.stop(timeout=0)


def test_a_cache_of_an_unreachable_server_says_why_it_is_not_listed(
    kube: Kube, unreachable: Kube
) -> None:
    listed = Informer(kube, APISERVICES)
    failing = Informer(unreachable, CRDS, backoff_max=0.5)
    for informer in (listed, failing):
        informer.start()
    try:
        assert listed.wait_synced(30)
        error = wait_for("the list error", lambda: failing.last_error, timeout=30)
        ready, why = caches_readiness([listed, failing])
        assert not ready
        assert why == f"{CRDS} not listed yet: {error}"
        with pytest.raises(Unavailable) as raised:
            require_listed([listed, failing], "hub")
        assert raised.value.message == f"hub: {CRDS} not listed yet ({error}); retry"
    finally:
        for informer in (listed, failing):
            informer.stop(timeout=0)


def _gizmo_crd(group: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"gizmos.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def test_an_optional_cache_of_an_api_the_server_lacks_is_listed_empty_until_it_appears(
    kube: Kube, control_plane: KubeCluster
) -> None:
    """An optional resource (a CRD a hub may not have, e.g. HyperShift's HostedCluster) whose
    list answers 404 is listed, empty and ready, saying why; a required one is not ready. Once
    the CRD is installed, the next list (absent_retry) fills the cache."""
    group = f"opt{_closed_port()}.example.com"
    gizmos = Resource(group, "v1", "gizmos", "Gizmo", True)
    optional = Informer(kube, gizmos, optional=True, absent_retry=0.3)
    required = Informer(kube, gizmos, backoff_max=0.5)
    for informer in (optional, required):
        informer.start()
    try:
        assert optional.wait_synced(30)
        assert len(optional) == 0
        assert optional.absent.startswith(f"{gizmos}: ")
        assert "404" in optional.absent
        assert caches_readiness([optional]) == (True, "")
        wait_for("the required cache's error", lambda: required.last_error, timeout=30)
        assert not caches_readiness([required])[0]
        control_plane.install_crds(_gizmo_crd(group))
        with control_plane.api_client() as api:
            k8s.CustomObjectsApi(api).create_namespaced_custom_object(
                group,
                "v1",
                "default",
                "gizmos",
                {"apiVersion": f"{group}/v1", "kind": "Gizmo", "metadata": {"name": "g1"}},
            )
        wait_for("the gizmo cached", lambda: optional.get("default", "g1"), timeout=30)
        assert optional.absent == ""
        assert caches_readiness([optional]) == (True, "")
    finally:
        for informer in (optional, required):
            informer.stop(timeout=0)
