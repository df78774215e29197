"""plugins.sdk.kube.Kube.close: no TLS connection outlives the client, also for a request that
raced close() (an informer's relist; the unclosed socket that failed CI, named by
tests/support/socket_origins)."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.sdk.kube import Kube, KubeError, Resource
from tests.support.kube import KubeCluster

CRDS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)


def test_a_request_that_races_close_leaves_no_connection_open(control_plane: KubeCluster) -> None:
    kube = Kube(str(control_plane.kubeconfig))
    real = kube._custom.list_cluster_custom_object

    def closing_then_listing(*args: Any, **kwargs: Any) -> Any:
        kube.close()  # close() runs first; the request then opens a connection anew
        return real(*args, **kwargs)

    kube._custom.list_cluster_custom_object = closing_then_listing
    items, _ = kube.list(CRDS)
    assert items  # the request itself went through
    assert len(kube._api.rest_client.pool_manager.pools) == 0  # and its connection is closed
    with pytest.raises(KubeError, match="client closed"):
        kube.list(CRDS)  # nothing starts after close()
