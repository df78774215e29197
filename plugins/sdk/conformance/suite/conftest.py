"""Fixtures of the conformance suite: the target, a client, its capabilities, a test cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.conformance.suite._kit import (
    Mutation,
    choose_mutation,
    new_request_id,
    wait_terminal,
)
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


@pytest.fixture
def mutation(
    client: PluginClient,
    capabilities: frozenset[int],
    cluster: cluster_pb2.Cluster,
    target: ConformanceTarget,
) -> Iterator[Mutation]:
    """A harmless mutation of the test cluster; whatever it changed is undone afterwards."""
    if cluster.HasField("current_operation"):
        wait_terminal(client, cluster.current_operation.id, target.timeout)
        cluster = client.get_cluster(cluster.id)
    chosen = choose_mutation(client, capabilities, cluster)
    if chosen is None:
        pytest.skip("no mutation the kit can make without changing the cluster for good")
    yield chosen
    if chosen.undo is not None:
        busy = client.get_cluster(cluster.id)
        if busy.HasField("current_operation"):
            wait_terminal(client, busy.current_operation.id, target.timeout)
            busy = client.get_cluster(cluster.id)
        if busy.in_service == cluster.in_service:
            return  # the check undid its change itself (or made none)
        undo = chosen.undo(new_request_id())
        done = wait_terminal(client, undo.id, target.timeout)
        assert done.state == cluster_pb2.OPERATION_STATE_SUCCEEDED, (
            f"could not restore cluster {cluster.id}: operation {done.id} "
            f"{cluster_pb2.OperationState.Name(done.state)} {done.error_code} {done.error_message}"
        )
