"""Fixtures of the manifest tests: the install's namespace on the session's apiserver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.support.kube import KubeCluster

#: The namespace manifests/install puts the orchestrator in.
INSTALL_NAMESPACE = "fleet-upgrade-system"


@pytest.fixture(scope="module")
def install_namespace(control_plane: KubeCluster) -> Iterator[str]:
    """fleet-upgrade-system, created for real: a server-side dry run of a Namespace creates
    nothing, so the namespaced objects of the install need it to exist already."""
    with control_plane.api_client() as api:
        core = k8s.CoreV1Api(api)
        try:
            core.create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=INSTALL_NAMESPACE))
            )
            created = True
        except ApiException as error:
            if error.status != 409:
                raise
            created = False
    yield INSTALL_NAMESPACE
    if created:
        control_plane.delete_namespace(INSTALL_NAMESPACE)
