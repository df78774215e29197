"""Fixtures of the conformance suite: the target, a client, its capabilities, a test cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.conformance.target import TARGET_KEY, ConformanceTarget

CALLER = "fleet-conformance-kit"


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> ConformanceTarget:
    """The endpoint under test (from run_conformance, or FLEET_CONFORMANCE_* variables)."""
    found = request.config.stash.get(TARGET_KEY, None) or ConformanceTarget.from_env()
    if found is None:
        pytest.fail(
            "no plugin endpoint: run `python -m plugins.sdk.conformance --endpoint HOST:PORT` "
            "or set FLEET_CONFORMANCE_ENDPOINT",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="session")
def client(target: ConformanceTarget) -> Iterator[PluginClient]:
    """One client for the whole run."""
    with PluginClient(target.endpoint, tls=target.tls, caller=CALLER) as plugin_client:
        yield plugin_client


@pytest.fixture(scope="session")
def capabilities(client: PluginClient) -> frozenset[int]:
    """The declared capabilities; the run stops when they cannot be read."""
    try:
        return client.capabilities()
    except PluginCallError as exc:
        pytest.fail(f"GetPluginCapabilities failed, nothing else can be checked: {exc}")


@pytest.fixture(scope="session")
def cluster_id(
    target: ConformanceTarget, client: PluginClient, capabilities: frozenset[int]
) -> str:
    """The cluster the checks use: --cluster, else the first listed cluster."""
    if target.cluster:
        return target.cluster
    if identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY not in capabilities:
        pytest.skip("no --cluster given and the plugin cannot list clusters")
    page = client.list_page(page_size=1)
    if not page.clusters:
        pytest.skip("the plugin lists no clusters")
    return page.clusters[0].id


@pytest.fixture
def cluster(
    cluster_id: str, client: PluginClient, capabilities: frozenset[int]
) -> cluster_pb2.Cluster:
    """The test cluster as it is now (needs CLUSTER_INVENTORY)."""
    if identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY not in capabilities:
        pytest.skip("needs the cluster's state, and the plugin cannot read clusters")
    return client.get_cluster(cluster_id)
