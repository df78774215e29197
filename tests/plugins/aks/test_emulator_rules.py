"""The AKS emulator's rules, driven by azure-mgmt-containerservice unchanged: what the plugin
tests rely on is how ARM behaves, so each rule is checked through the official client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.mgmt.containerservice import ContainerServiceClient

from tests.plugins.aks.support import GROUP, NEW, NEWER, NEXT_MINOR, OLD, SUBSCRIPTION, cluster_id
from tests.support.aks_emulator import API_VERSION, AksEmulator, Fault, StaticToken


@pytest.fixture
def client(emulator: AksEmulator) -> Iterator[ContainerServiceClient]:
    with ContainerServiceClient(
        emulator.credential(),
        SUBSCRIPTION,
        base_url=emulator.endpoint,
        connection_verify=emulator.ca_file,
        polling_interval=0.05,
        retry_total=0,
    ) as sdk:
        yield sdk


def test_the_emulator_speaks_the_api_version_the_installed_sdk_sends(
    client: ContainerServiceClient,
) -> None:
    assert client._config.api_version == API_VERSION
    assert [mc.name for mc in client.managed_clusters.list()] == ["c1", "c2", "c3", "c4"]


def test_lists_page_with_next_link(emulator: AksEmulator, client: ContainerServiceClient) -> None:
    names = [mc.name for mc in client.managed_clusters.list_by_resource_group(GROUP)]
    assert names == ["c1", "c2", "c3", "c4"]
    # Two per page: the SDK followed nextLink once.
    assert emulator.calls("ManagedClusters.ListByResourceGroup") == 2


def test_a_request_without_the_bearer_token_is_refused(emulator: AksEmulator) -> None:
    with (
        ContainerServiceClient(
            StaticToken("not-the-token"),
            SUBSCRIPTION,
            base_url=emulator.endpoint,
            connection_verify=emulator.ca_file,
            retry_total=0,
        ) as stranger,
        pytest.raises(HttpResponseError) as raised,
    ):
        stranger.managed_clusters.get(GROUP, "c1")
    assert raised.value.status_code == 401


def test_the_upgrade_profile_offers_no_minor_skip_and_no_pool_past_the_plane(
    client: ContainerServiceClient,
) -> None:
    profile = client.managed_clusters.get_upgrade_profile(GROUP, "c1").as_dict()["properties"]
    plane = [u["kubernetesVersion"] for u in profile["controlPlaneProfile"]["upgrades"]]
    assert plane == ["1.29.9", NEW, NEWER]  # 1.31 would skip a minor: not offered
    assert NEXT_MINOR not in plane
    pools = {p["name"]: p["upgrades"] for p in profile["agentPoolProfiles"]}
    assert pools == {"system": [], "user": []}  # the pools are at the plane's version


def test_an_upgrade_is_a_long_running_operation_and_one_runs_at_a_time(
    emulator: AksEmulator, client: ContainerServiceClient
) -> None:
    cluster = client.managed_clusters.get(GROUP, "c1")
    assert cluster.properties is not None
    cluster.properties.kubernetes_version = NEW
    poller = client.managed_clusters.begin_create_or_update(GROUP, "c1", cluster)
    assert poller.status() == "InProgress"
    assert emulator.cluster(cluster_id("c1"))["properties"]["provisioningState"] == "Upgrading"
    pool = client.agent_pools.get(GROUP, "c1", "user")
    assert pool.properties is not None
    pool.properties.orchestrator_version = NEW
    with pytest.raises(HttpResponseError) as raised:
        client.agent_pools.begin_create_or_update(GROUP, "c1", "user", pool)
    assert raised.value.status_code == 409
    assert raised.value.error is not None and raised.value.error.code == "OperationNotAllowed"
    done = poller.result(timeout=10)
    assert done.properties is not None
    assert done.properties.current_kubernetes_version == NEW
    # Control plane only: the pools kept their version.
    after = emulator.cluster(cluster_id("c1"))["properties"]
    assert {p["currentOrchestratorVersion"] for p in after["agentPoolProfiles"]} == {OLD}
    assert emulator.calls("Operations.Get") >= 1


def test_refused_versions_answer_400_with_aks_codes(client: ContainerServiceClient) -> None:
    def put(version: str) -> str:
        cluster = client.managed_clusters.get(GROUP, "c2")
        assert cluster.properties is not None
        cluster.properties.kubernetes_version = version
        with pytest.raises(HttpResponseError) as raised:
            client.managed_clusters.begin_create_or_update(GROUP, "c2", cluster)
        assert raised.value.status_code == 400
        assert raised.value.error is not None
        return str(raised.value.error.code)

    assert put("1.30.4") == "K8sVersionNotSupported"
    assert put(NEXT_MINOR) == "UpgradeNotAllowed"
    pool = client.agent_pools.get(GROUP, "c2", "user")
    assert pool.properties is not None
    pool.properties.orchestrator_version = NEW
    with pytest.raises(HttpResponseError) as raised:
        client.agent_pools.begin_create_or_update(GROUP, "c2", "user", pool)
    assert raised.value.error is not None
    assert raised.value.error.code == "NodePoolMcVersionIncompatible"


def test_a_stale_etag_is_refused(client: ContainerServiceClient, emulator: AksEmulator) -> None:
    from azure.core import MatchConditions

    cluster = client.managed_clusters.get(GROUP, "c3")
    emulator.set_state(cluster_id("c3"), "Succeeded")  # no change of etag by itself
    fresh = client.managed_clusters.get(GROUP, "c3")
    assert fresh.properties is not None
    fresh.properties.kubernetes_version = NEW
    client.managed_clusters.begin_create_or_update(GROUP, "c3", fresh).result(timeout=10)
    assert cluster.properties is not None
    cluster.properties.kubernetes_version = NEWER
    with pytest.raises(HttpResponseError) as raised:
        client.managed_clusters.begin_create_or_update(
            GROUP,
            "c3",
            cluster,
            etag=cluster.e_tag,
            match_condition=MatchConditions.IfNotModified,
        )
    assert raised.value.status_code == 412


def test_a_failed_operation_fails_the_poller_and_the_cluster(
    emulator: AksEmulator, client: ContainerServiceClient
) -> None:
    emulator.fail_next(cluster_id("c1"), Fault(code="UpgradeFailed"))
    cluster = client.managed_clusters.get(GROUP, "c1")
    assert cluster.properties is not None
    cluster.properties.kubernetes_version = NEW
    poller = client.managed_clusters.begin_create_or_update(GROUP, "c1", cluster)
    with pytest.raises(HttpResponseError) as raised:
        poller.result(timeout=10)
    assert raised.value.error is not None and raised.value.error.code == "UpgradeFailed"
    state = emulator.cluster(cluster_id("c1"))["properties"]
    assert state["provisioningState"] == "Failed"
    assert state["currentKubernetesVersion"] == OLD


def test_throttling_and_transient_failures_carry_their_status(
    emulator: AksEmulator, client: ContainerServiceClient
) -> None:
    emulator.throttle(1, retry_after=7)
    with pytest.raises(HttpResponseError) as raised:
        client.managed_clusters.get(GROUP, "c1")
    assert raised.value.status_code == 429
    assert raised.value.response is not None
    assert raised.value.response.headers["Retry-After"] == "7"
    emulator.transient(1, status=503)
    with pytest.raises(HttpResponseError) as raised:
        client.managed_clusters.get(GROUP, "c1")
    assert raised.value.status_code == 503
    assert client.managed_clusters.get(GROUP, "c1").name == "c1"  # then it answers again
    with pytest.raises(ResourceNotFoundError):
        client.managed_clusters.get(GROUP, "gone")


def test_node_image_upgrades_and_maintenance_configurations(
    emulator: AksEmulator, client: ContainerServiceClient
) -> None:
    latest = client.agent_pools.get_upgrade_profile(GROUP, "c4", "user").as_dict()
    poller = client.agent_pools.begin_upgrade_node_image_version(GROUP, "c4", "user")
    poller.result(timeout=10)
    pool = client.agent_pools.get(GROUP, "c4", "user").as_dict()["properties"]
    assert pool["nodeImageVersion"] == latest["properties"]["latestNodeImageVersion"]
    assert pool["currentOrchestratorVersion"] == OLD
    emulator.set_maintenance(
        cluster_id("c4"),
        "aksManagedAutoUpgradeSchedule",
        {"maintenanceWindow": {"schedule": {"daily": {"intervalDays": 1}}, "durationHours": 4}},
    )
    configs = list(client.maintenance_configurations.list_by_managed_cluster(GROUP, "c4"))
    assert [c.name for c in configs] == ["aksManagedAutoUpgradeSchedule"]
