"""Inventory: the selected managed clusters with their tags, versions, pools, availability,
service state and planned maintenance, paged by id; fleet_id names the selection."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.aks import aks_fleet_id, parse_config
from plugins.sdk.client import PluginCallError
from tests.plugins.aks.conftest import NAMES, StartPlugin
from tests.plugins.aks.support import GROUP, OLD, SUBSCRIPTION, cluster_id, plugin_config
from tests.support.aks_emulator import AksEmulator


def test_clusters_are_listed_by_id_with_tags_versions_and_pools(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    page = client.list_page(page_size=3)
    assert page.total_size == 4 and len(page.clusters) == 3 and page.next_page_token
    rest = client.list_page(page_size=3, page_token=page.next_page_token)
    ids = [c.id for c in [*page.clusters, *rest.clusters]]
    assert ids == [cluster_id(n) for n in NAMES] and not rest.next_page_token
    first = page.clusters[0]
    assert dict(first.labels) == {"fleet": "demo", "ring": "canary"}
    assert first.control_plane_version == OLD
    assert [(p.name, p.version, p.status) for p in first.node_pools] == [
        ("system", OLD, cluster_pb2.NODE_POOL_STATUS_READY),
        ("user", OLD, cluster_pb2.NODE_POOL_STATUS_READY),
    ]
    assert first.available and first.in_service
    canary = client.list_clusters(match_labels={"ring": "canary"})
    assert [c.id for c in canary] == [cluster_id("c1")]


def test_discovery_selects_by_resource_group_and_tags(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(
        cluster_id("other", group="elsewhere"), location="westeurope", version=OLD, pools=[]
    )
    config = plugin_config(emulator, None)
    config["clusters"]["discover"][0]["matchTags"] = {"ring": "main"}
    client = start_plugin(config).client
    assert [c.id for c in client.list_clusters()] == [cluster_id(n) for n in NAMES[1:]]
    with pytest.raises(PluginCallError) as raised:
        client.get_cluster(cluster_id("c1"))  # in the group, but not tagged ring=main
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(PluginCallError) as raised:
        client.get_cluster(cluster_id("other", group="elsewhere"))
    assert raised.value.code == grpc.StatusCode.NOT_FOUND


def test_another_spelling_of_an_id_is_not_found_and_names_the_one_spelling(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    shouted = cluster_id("C2").replace("resourceGroups/fleet-rg", "resourceGroups/FLEET-RG")
    with pytest.raises(PluginCallError) as raised:
        client.get_cluster(shouted)
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert cluster_id("c2") in str(raised.value)
    with pytest.raises(PluginCallError):
        client.upgrade_control_plane("shouted", shouted, OLD)
    assert client.get_cluster(cluster_id("c2")).id == cluster_id("c2")


def test_a_failed_or_stopped_cluster_is_unavailable_with_the_reason(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.set_state(cluster_id("c3"), "Failed")
    cluster = client.get_cluster(cluster_id("c3"))
    assert not cluster.available
    assert cluster.unavailable_reason == "AKS provisioningState Failed"


def test_planned_maintenance_is_reported_as_windows(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_maintenance(
        cluster_id("c2"),
        "aksManagedAutoUpgradeSchedule",
        {
            "maintenanceWindow": {
                "schedule": {"weekly": {"intervalWeeks": 2, "dayOfWeek": "Saturday"}},
                "durationHours": 6,
                "utcOffset": "+02:00",
                "startDate": "2030-01-01",
                "startTime": "22:00",
                "notAllowedDates": [{"start": "2030-12-20", "end": "2031-01-02"}],
            }
        },
    )
    windows = start_plugin().client.get_cluster(cluster_id("c2")).maintenance_windows
    assert [(w.kind, w.name) for w in windows] == [
        (cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW, "aksManagedAutoUpgradeSchedule"),
        (
            cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
            "aksManagedAutoUpgradeSchedule/notAllowedDates[0]",
        ),
    ]
    window, exclusion = windows
    # 2030-01-05 is the first Saturday from 2030-01-01; 22:00 at +02:00 is 20:00 UTC.
    assert window.start_time.ToDatetime(tzinfo=UTC) == datetime(2030, 1, 5, 20, tzinfo=UTC)
    assert window.end_time.ToDatetime(tzinfo=UTC) == datetime(2030, 1, 6, 2, tzinfo=UTC)
    assert window.recurrence == "FREQ=WEEKLY;INTERVAL=2;BYDAY=SA"
    assert exclusion.scope == "AUTO_UPGRADE"
    assert exclusion.start_time.ToDatetime(tzinfo=UTC) == datetime(2030, 12, 19, 22, tzinfo=UTC)
    assert exclusion.end_time.ToDatetime(tzinfo=UTC) == datetime(2031, 1, 2, 22, tzinfo=UTC)


def test_fleet_id_names_the_subscription_and_resource_group(emulator: AksEmulator) -> None:
    one_group = parse_config(
        {"clusters": {"discover": [{"subscription": SUBSCRIPTION, "resourceGroup": "Fleet-RG"}]}}
    )
    assert aks_fleet_id(one_group) == f"aks:{SUBSCRIPTION}:fleet-rg"
    by_ids = parse_config({"clusters": {"ids": [cluster_id("c1"), cluster_id("c2")]}})
    assert aks_fleet_id(by_ids) == f"aks:{SUBSCRIPTION}:{GROUP}"
    whole = parse_config({"clusters": {"discover": [{"subscription": SUBSCRIPTION}]}})
    assert aks_fleet_id(whole) == f"aks:{SUBSCRIPTION}:*"
    emulated = parse_config(plugin_config(emulator, NAMES))
    assert aks_fleet_id(emulated).startswith("aks:") and aks_fleet_id(emulated) != aks_fleet_id(
        by_ids
    )
    assert len(aks_fleet_id(emulated)) <= 256


def test_plugin_info_reports_the_fleet_id_and_capabilities(start_plugin: StartPlugin) -> None:
    running = start_plugin(traffic="unsupported")
    info = running.client.info()
    assert info.name == "aks.fleetupgrade.io"
    assert info.fleet_id == aks_fleet_id(running.plugin.options.config)
    caps = set(running.client.capabilities())
    assert identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE not in caps
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS not in caps
    assert identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE in caps
    with pytest.raises(PluginCallError) as raised:
        running.client.service_out("r-out", cluster_id("c1"))
    assert raised.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_maintenance_configurations_are_read_once_per_cluster_within_their_ttl(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    assert len(client.list_clusters()) == len(NAMES)
    assert len(client.list_clusters()) == len(NAMES)
    client.get_cluster(cluster_id("c1"))
    assert emulator.calls("MaintenanceConfigurations.ListByManagedCluster") == len(NAMES)
