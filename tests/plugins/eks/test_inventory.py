"""Inventory: the selected clusters of the account's regions, their managed node groups,
versions and tags (as labels), paged by ARN; the plugin's identity."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.eks.conftest import NAMES, StartPlugin
from tests.plugins.eks.support import OLD, OTHER_REGION, POOLS, REGION, cluster_id
from tests.support.eks_emulator import ACCOUNT, EksEmulator


def test_clusters_of_every_region_are_listed_with_node_groups_versions_and_tags(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(OTHER_REGION, "eu1", "1.30", ["ng"], {"fleet": "demo"})
    emulator.add_cluster("ap-south-1", "elsewhere", OLD, ["ng"])  # a region not configured
    running = start_plugin(regions=(REGION, OTHER_REGION))
    clusters = running.client.list_clusters()
    ids = [c.id for c in clusters]
    assert ids == sorted([cluster_id(n) for n in NAMES] + [cluster_id("eu1", OTHER_REGION)])
    first = next(c for c in clusters if c.id == cluster_id("c1"))
    assert first.control_plane_version == OLD
    assert [(p.name, p.version, p.status) for p in first.node_pools] == [
        (pool, OLD, cluster_pb2.NODE_POOL_STATUS_READY) for pool in POOLS
    ]
    assert dict(first.labels) == {"fleet": "demo", "ring": "canary"}
    assert first.available and first.in_service
    eu = running.client.get_cluster(cluster_id("eu1", OTHER_REGION))
    assert eu.control_plane_version == "1.30" and [p.name for p in eu.node_pools] == ["ng"]


def test_paging_and_label_filters(start_plugin: StartPlugin) -> None:
    running = start_plugin()
    page = running.client.list_page(page_size=3)
    assert [c.id for c in page.clusters] == [cluster_id(n) for n in NAMES[:3]]
    assert page.total_size == 4 and page.next_page_token
    rest = running.client.list_page(page_size=3, page_token=page.next_page_token)
    assert [c.id for c in rest.clusters] == [cluster_id("c4")] and not rest.next_page_token
    canary = running.client.list_clusters(match_labels={"ring": "canary"})
    assert [c.id for c in canary] == [cluster_id("c1")]


def test_selection_by_tags_and_names_leaves_the_others_out(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(REGION, "untagged", OLD, ["ng"])
    running = start_plugin(clusters={"matchTags": {"fleet": "demo"}, "names": ["c1", "c2"]})
    assert [c.id for c in running.client.list_clusters()] == [
        cluster_id("c1"),
        cluster_id("c2"),
    ]
    for outside in (
        cluster_id("c3"),
        cluster_id("untagged"),
        "arn:aws:eks:x",
        cluster_id("c1", "ap-south-1"),
    ):
        with pytest.raises(PluginCallError) as err:
            running.client.get_cluster(outside)
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    tagged = start_plugin(clusters={"matchTags": {"fleet": "demo"}})
    with pytest.raises(PluginCallError) as err:
        tagged.client.get_cluster(cluster_id("untagged"))
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_node_group_health_issues_show_as_pool_errors(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_nodegroup_issues(REGION, "c2", "workers", [("NodeCreationFailure", "no")])
    cluster = start_plugin().client.get_cluster(cluster_id("c2"))
    status = {p.name: p.status for p in cluster.node_pools}
    assert status == {
        "system": cluster_pb2.NODE_POOL_STATUS_READY,
        "workers": cluster_pb2.NODE_POOL_STATUS_ERROR,
    }


def test_identity_names_the_account_and_regions_and_declares_capabilities(
    emulator: EksEmulator, start_plugin: StartPlugin, tmp_path: object
) -> None:
    running = start_plugin(regions=(REGION, OTHER_REGION))
    info = running.client.info()
    assert info.name == "eks.fleetupgrade.io"
    assert info.fleet_id == f"eks:{ACCOUNT}:{OTHER_REGION},{REGION}@{emulator.endpoint}"
    assert running.client.probe().ready
    caps = running.client.capabilities()
    assert identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL in caps
    assert identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE in caps
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS not in caps
    # Another plugin on the same account and regions is the same provider.
    again = start_plugin(regions=(OTHER_REGION, REGION), clusters={"names": ["c1"]})
    assert again.client.info().fleet_id == info.fleet_id


def test_probe_is_not_ready_when_eks_is_unreachable(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    running = start_plugin()
    emulator.inject("ListClusters", "ServiceUnavailableException")
    probe = running.client.probe()
    assert not probe.ready and "ServiceUnavailableException" in probe.message
    assert running.client.probe().ready
