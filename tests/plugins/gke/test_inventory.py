"""The inventory as GKE reports it: ids, labels, versions, pool states, availability from the
cluster status, in-service from backend capacity, discovery by resource labels, GKE outages."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEG, OLD, PROJECT, cluster_id, plugin_config, populate
from tests.support.gke_emulator import GkeEmulator

_S = cluster_pb2


def test_clusters_are_listed_with_gke_ids_labels_versions_and_pools(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    clusters = client.list_clusters()
    assert [c.id for c in clusters] == [cluster_id(n) for n in NAMES]
    first = clusters[0]
    assert dict(first.labels) == {"fleet": "demo", "ring": "canary"}
    assert first.control_plane_version == OLD
    assert [(p.name, p.version, p.status) for p in first.node_pools] == [
        ("default-pool", OLD, _S.NODE_POOL_STATUS_READY),
        ("workers", OLD, _S.NODE_POOL_STATUS_READY),
    ]
    assert first.available and first.in_service and not first.unavailable_reason
    assert not first.HasField("current_operation")
    canary = client.list_clusters(match_labels={"ring": "canary"})
    assert [c.id for c in canary] == [cluster_id("c1")]


@pytest.mark.parametrize("status", ["RECONCILING", "DEGRADED", "ERROR", "PROVISIONING"])
def test_only_running_clusters_are_available(
    emulator: GkeEmulator, start_plugin: StartPlugin, status: str
) -> None:
    emulator.set_cluster_status(cluster_id("c2"), status, "node auto-repair in progress")
    client = start_plugin().client
    c2 = client.get_cluster(cluster_id("c2"))
    assert not c2.available
    assert c2.unavailable_reason == f"GKE status {status}: node auto-repair in progress"
    assert client.get_cluster(cluster_id("c1")).available


def test_pool_states_map_to_the_contract(emulator: GkeEmulator, start_plugin: StartPlugin) -> None:
    emulator.add_cluster(
        cluster_id("pools"),
        master_version=OLD,
        node_pools=[
            {"name": "ok", "status": "RUNNING"},
            {"name": "broken", "status": "RUNNING_WITH_ERROR"},
            {"name": "failed", "status": "ERROR"},
            {"name": "moving", "status": "RECONCILING"},
        ],
    )
    client = start_plugin(plugin_config(emulator, [*NAMES, "pools"], mode="none")).client
    pools = {p.name: p.status for p in client.get_cluster(cluster_id("pools")).node_pools}
    assert pools == {
        "ok": _S.NODE_POOL_STATUS_READY,
        "broken": _S.NODE_POOL_STATUS_ERROR,
        "failed": _S.NODE_POOL_STATUS_ERROR,
        "moving": _S.NODE_POOL_STATUS_UPGRADING,
    }


def test_in_service_follows_the_backend_capacity() -> None:
    from tests.plugins.gke.support import running_plugin

    with GkeEmulator() as emu:
        populate(emu, NAMES, backend_scalers={"c3": 0.0, "c4": 0.5})
        with running_plugin(plugin_config(emu, NAMES)) as plugin:
            service = {c.id: c.in_service for c in plugin.client.list_clusters()}
        assert service == {
            cluster_id("c1"): True,
            cluster_id("c2"): True,
            cluster_id("c3"): False,
            cluster_id("c4"): True,
        }
        assert emu.capacity(PROJECT, "web", NEG.format("c3")) == 0.0


def test_discovery_selects_clusters_by_resource_labels(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(
        "projects/p/locations/l2/clusters/elsewhere", master_version=OLD, labels={"ring": "main"}
    )
    config = plugin_config(emulator, [], mode="none")
    config["clusters"] = {
        "ids": [cluster_id("c1")],
        "discover": [{"project": PROJECT, "location": "-", "matchLabels": {"ring": "main"}}],
    }
    client = start_plugin(config).client
    assert [c.id for c in client.list_clusters()] == [
        cluster_id("c1"),
        cluster_id("c2"),
        cluster_id("c3"),
        cluster_id("c4"),
        "projects/p/locations/l2/clusters/elsewhere",
    ]
    emulator.add_cluster(cluster_id("unlabelled"), master_version=OLD)
    with pytest.raises(PluginCallError) as err:
        client.get_cluster(cluster_id("unlabelled"))
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    assert cluster_id("unlabelled") not in [c.id for c in client.list_clusters()]


def test_gke_outages_answer_unavailable_and_probe_not_ready(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.fail_http("ListClusters", 503, "The service is currently unavailable.", times=100)
    with pytest.raises(PluginCallError) as err:
        client.list_page()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
    assert "currently unavailable" in err.value.message
    probe = client.probe()
    assert not probe.ready and "not reachable" in probe.message
    emulator.clear_http_faults()
    assert client.probe().ready
    emulator.fail_http("GetCluster", 403, "Required 'container.clusters.get' permission.")
    with pytest.raises(PluginCallError) as err:
        client.get_cluster(cluster_id("c1"))
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "roles/container.clusterAdmin" in err.value.message
