"""Conformance of ListClusters changed_since, for a plugin that keeps revisions (its listings
carry a revision): a cluster changed after a revision is listed by a listing of changes since
it, as GetCluster answers it; a revision the plugin cannot answer since lists every cluster."""

from __future__ import annotations

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import ClusterListing, PluginClient, supports
from plugins.sdk.conformance.suite._kit import new_request_id, wait_terminal
from plugins.sdk.conformance.target import ConformanceTarget


@pytest.fixture
def listing(client: PluginClient, capabilities: frozenset[int]) -> ClusterListing:
    """A whole listing of a plugin that keeps revisions."""
    if identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY not in capabilities:
        pytest.skip("CLUSTER_INVENTORY is not among the declared capabilities")
    whole = client.list_since("", page_size=5000)
    if not whole.revision:
        pytest.skip("the plugin keeps no revisions (ListClustersResponse.revision is empty)")
    assert not whole.changes_only, "a listing without changed_since said changes_only"
    return whole


def test_a_revision_it_cannot_answer_since_lists_every_cluster(
    client: PluginClient, listing: ClusterListing
) -> None:
    answer = client.list_since("conformance-not-a-revision", page_size=5000)
    assert not answer.changes_only, "an unknown revision was answered with changes only"
    assert sorted(c.id for c in answer.clusters) == sorted(c.id for c in listing.clusters)


def test_a_changed_cluster_is_listed_since_a_revision_before_the_change(
    client: PluginClient,
    capabilities: frozenset[int],
    cluster_id: str,
    target: ConformanceTarget,
    listing: ClusterListing,
) -> None:
    if not (supports(capabilities, "ServiceOut") and supports(capabilities, "ServiceIn")):
        pytest.skip("ServiceOut and ServiceIn are not both among the declared capabilities")
    before = client.get_cluster(cluster_id)
    revision = client.list_since("", page_size=5000).revision
    first, back = (
        (client.service_out, client.service_in)
        if before.in_service
        else (client.service_in, client.service_out)
    )
    op = wait_terminal(client, first(new_request_id(), cluster_id).id, target.timeout)
    try:
        if op.state != cluster_pb2.OPERATION_STATE_SUCCEEDED:
            pytest.skip(f"the change of {cluster_id} failed ({op.error_code}): nothing changed")
        changes = client.list_since(revision, page_size=5000)
        assert changes.changes_only, f"a revision of a moment ago ({revision}) answered whole"
        listed = {c.id: c for c in changes.clusters}
        assert cluster_id in listed, (
            f"{cluster_id} changed after revision {revision} and a listing of the changes since "
            f"it does not list it (it lists {sorted(listed)[:5]})"
        )
        now = client.get_cluster(cluster_id)
        assert listed[cluster_id].in_service == now.in_service != before.in_service
    finally:
        wait_terminal(client, back(new_request_id(), cluster_id).id, target.timeout)
