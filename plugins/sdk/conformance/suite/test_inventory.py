"""Conformance of the inventory: paging, ordering, label filters, GetCluster errors."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.conformance.suite._kit import UNKNOWN_ID, expect_error

_FULL_WALK_LIMIT = 1000  # larger fleets: small page sizes walk only this many clusters


@pytest.fixture(autouse=True)
def _needs_inventory(capabilities: frozenset[int]) -> None:
    if identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY not in capabilities:
        pytest.skip("CLUSTER_INVENTORY is not among the declared capabilities")


@pytest.fixture(scope="module")
def inventory(client: PluginClient) -> list[cluster_pb2.Cluster]:
    """Every cluster, read with the largest page size."""
    return client.list_clusters(page_size=5000)


def _walk(client: PluginClient, page_size: int, limit: int) -> tuple[list[str], list[int], bool]:
    """Ids in page order, the total_size of each page, and whether the last page was reached."""
    ids: list[str] = []
    totals: list[int] = []
    token = ""
    while True:
        page = client.list_page(page_size=page_size, page_token=token)
        if page_size:
            assert len(page.clusters) <= page_size, (
                f"page_size={page_size} answered a page of {len(page.clusters)} clusters"
            )
        ids.extend(c.id for c in page.clusters)
        totals.append(page.total_size)
        token = page.next_page_token
        if not token:
            return ids, totals, True
        assert page.clusters, f"page_size={page_size}: an empty page that is not the last"
        if len(ids) >= limit:
            return ids, totals, False


def test_listed_clusters_have_the_required_fields(inventory: list[cluster_pb2.Cluster]) -> None:
    for cluster in inventory:
        assert cluster.id, "a listed cluster has an empty id"
        assert cluster.control_plane_version, f"cluster {cluster.id}: empty control_plane_version"
        pools = [p.name for p in cluster.node_pools]
        assert all(pools), f"cluster {cluster.id}: a node pool has an empty name"
        assert len(pools) == len(set(pools)), f"cluster {cluster.id}: duplicate node pools {pools}"
        for pool in cluster.node_pools:
            assert pool.version, f"cluster {cluster.id} pool {pool.name}: empty version"
        if cluster.HasField("current_operation"):
            op = cluster.current_operation
            assert op.cluster_id == cluster.id, (
                f"cluster {cluster.id}: current_operation {op.id} is for {op.cluster_id}"
            )
            assert op.state in (
                cluster_pb2.OPERATION_STATE_PENDING,
                cluster_pb2.OPERATION_STATE_RUNNING,
            ), f"cluster {cluster.id}: current_operation {op.id} is not PENDING or RUNNING"


@pytest.mark.parametrize("page_size", [1, 2, 3, 0], ids=["size1", "size2", "size3", "default"])
def test_paging_returns_every_cluster_once_in_id_order(
    client: PluginClient, inventory: list[cluster_pb2.Cluster], page_size: int
) -> None:
    expected = [c.id for c in inventory]
    limit = len(expected) + 1 if page_size == 0 else _FULL_WALK_LIMIT
    ids, totals, complete = _walk(client, page_size, limit)
    assert len(ids) == len(set(ids)), f"page_size={page_size}: clusters listed twice"
    assert ids == sorted(ids), f"page_size={page_size}: clusters not in id order"
    assert set(totals) == {len(expected)}, (
        f"page_size={page_size}: total_size {sorted(set(totals))} but {len(expected)} clusters"
    )
    if complete:
        assert ids == expected, f"page_size={page_size}: pages do not cover the inventory"
    else:
        assert ids == expected[: len(ids)], f"page_size={page_size}: pages skip clusters"


def test_a_page_larger_than_the_fleet_is_the_last(
    client: PluginClient, inventory: list[cluster_pb2.Cluster]
) -> None:
    if len(inventory) >= 5000:
        pytest.skip("the fleet is larger than the largest page")
    page = client.list_page(page_size=len(inventory) + 1)
    assert [c.id for c in page.clusters] == [c.id for c in inventory]
    assert page.next_page_token == "", "the only page must have an empty next_page_token"


def test_match_labels_selects_clusters_with_all_labels(
    client: PluginClient, inventory: list[cluster_pb2.Cluster]
) -> None:
    labelled = next((c for c in inventory if c.labels), None)
    if labelled is None:
        pytest.skip("no listed cluster has labels")
    key = sorted(labelled.labels)[0]
    wanted = {key: labelled.labels[key]}
    expected = [c.id for c in inventory if c.labels.get(key) == wanted[key]]
    got = [c.id for c in client.list_clusters(match_labels=wanted)]
    assert got == expected, f"match_labels={wanted} answered {len(got)} of {len(expected)}"


def test_get_cluster_matches_the_listing(client: PluginClient, cluster_id: str) -> None:
    cluster = client.get_cluster(cluster_id)
    assert cluster.id == cluster_id
    assert cluster.control_plane_version, "GetCluster: empty control_plane_version"


def test_get_cluster_unknown_id_is_not_found(client: PluginClient) -> None:
    expect_error(
        grpc.StatusCode.NOT_FOUND, lambda: client.get_cluster(UNKNOWN_ID), "GetCluster(unknown)"
    )


def test_get_cluster_empty_id_is_invalid_argument(client: PluginClient) -> None:
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.get_cluster(""),
        "GetCluster(cluster_id='')",
        names="cluster_id",
    )
