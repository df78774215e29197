"""ARM's errors as the contract's codes (the table in docs/plugins/aks.md), with fixed words:
ARM's message and the plugin's token never reach a caller."""

from __future__ import annotations

import socket
from collections.abc import Callable

import grpc
import pytest
from azure.core.exceptions import HttpResponseError
from azure.mgmt.containerservice import ContainerServiceClient

from plugins.aks.api import plugin_error
from plugins.sdk.client import PluginCallError
from plugins.sdk.errors import FailedPrecondition, NotFound, PluginError, Unavailable
from tests.plugins.aks.conftest import NAMES, StartPlugin
from tests.plugins.aks.support import (
    GROUP,
    NEW,
    NEXT_MINOR,
    SUBSCRIPTION,
    cluster_id,
    plugin_config,
)
from tests.support.aks_emulator import AksEmulator


def _refused(call: Callable[[], object]) -> PluginCallError:
    with pytest.raises(PluginCallError) as raised:
        call()
    return raised.value


def test_throttling_is_unavailable_with_arms_retry_after(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.throttle(100, retry_after=7)  # every attempt (the client retries UNAVAILABLE)
    error = _refused(client.list_page)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert error.reason == "PROVIDER_UNAVAILABLE" and error.retry_after == 7
    assert "HTTP 429 TooManyRequests" in str(error)
    assert "throttled" not in str(error)  # ARM's words stay in the log
    emulator.throttle(0)
    assert len(client.list_clusters()) == len(NAMES)


def test_a_5xx_is_unavailable_and_nothing_starts(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    client.get_cluster(cluster_id("c1"))
    emulator.transient(100, status=502)
    error = _refused(lambda: client.upgrade_control_plane("r", cluster_id("c1"), NEW))
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 0
    emulator.transient(0)
    # The same request_id later starts it once.
    assert client.upgrade_control_plane("r", cluster_id("c1"), NEW).target_version == NEW
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 1


def test_a_409_from_arm_is_cluster_busy_with_retry(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.hold(cluster_id("c2"))
    error = _refused(lambda: client.upgrade_control_plane("r409", cluster_id("c2"), NEW))
    assert error.code == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "CLUSTER_BUSY" and error.retry_after == 30
    assert "OperationNotAllowed" in str(error)
    assert client.get_cluster(cluster_id("c2")).current_operation.id == ""  # nothing recorded


def test_a_cluster_gone_from_arm_is_not_found(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(plugin_config(emulator, [*NAMES, "ghost"])).client
    error = _refused(lambda: client.get_cluster(cluster_id("ghost")))
    assert error.code == grpc.StatusCode.NOT_FOUND and error.reason == "CLUSTER_NOT_FOUND"
    error = _refused(lambda: client.upgrade_node_pool("np", cluster_id("c1"), "gpu", NEW))
    assert error.code == grpc.StatusCode.NOT_FOUND and error.reason == "NODE_POOL_NOT_FOUND"
    error = _refused(lambda: client.get_operation("aks-op-unknown"))
    assert error.code == grpc.StatusCode.NOT_FOUND


def test_bad_input_names_the_field(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    error = _refused(lambda: client.upgrade_control_plane("r", cluster_id("c1"), "latest"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT and error.metadata["field"] == "version"
    error = _refused(lambda: client.upgrade_control_plane("r", "", NEW))
    assert error.metadata["field"] == "cluster_id"


def test_a_wrong_token_is_not_authorized_and_never_echoed(emulator: AksEmulator) -> None:
    from prometheus_client import CollectorRegistry

    from plugins.aks import AksPlugin, AksPluginOptions, parse_config
    from tests.support.aks_emulator import StaticToken

    plugin = AksPlugin(
        AksPluginOptions(
            config=parse_config(plugin_config(emulator, NAMES)),
            registry=CollectorRegistry(),
            credential=StaticToken("wrong-token-value"),
        )
    )
    try:
        from plugins.sdk.client import PluginClient

        with PluginClient(plugin.address, caller="aks-tests") as client:
            error = _refused(lambda: client.get_cluster(cluster_id("c1")))
            assert error.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "HTTP 401" in str(error) and "wrong-token-value" not in str(error)
            probe = client.probe()
            assert not probe.ready and "wrong-token-value" not in probe.message
    finally:
        plugin.stop(grace=0)


def test_an_unreachable_arm_is_unavailable_and_probe_says_not_ready(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = plugin_config(emulator, NAMES)
    config["api"]["endpoint"] = f"https://127.0.0.1:{port}"
    client = start_plugin(config).client
    assert not client.probe().ready
    error = _refused(lambda: client.get_cluster(cluster_id("c1")))
    assert error.code == grpc.StatusCode.UNAVAILABLE and "unreachable" in str(error)


def _arm_error(
    emulator: AksEmulator, call: Callable[[ContainerServiceClient], object]
) -> PluginError:
    with (
        ContainerServiceClient(
            emulator.credential(),
            SUBSCRIPTION,
            base_url=emulator.endpoint,
            connection_verify=emulator.ca_file,
            retry_total=0,
        ) as sdk,
        pytest.raises(HttpResponseError) as raised,
    ):
        call(sdk)
    return plugin_error(raised.value, "upgrading")


def test_each_arm_refusal_maps_to_its_contract_reason(emulator: AksEmulator) -> None:
    def put(version: str) -> Callable[[ContainerServiceClient], object]:
        def call(sdk: ContainerServiceClient) -> object:
            cluster = sdk.managed_clusters.get(GROUP, "c3")
            assert cluster.properties is not None
            cluster.properties.kubernetes_version = version
            return sdk.managed_clusters.begin_create_or_update(GROUP, "c3", cluster)

        return call

    def pool(sdk: ContainerServiceClient) -> object:
        agent_pool = sdk.agent_pools.get(GROUP, "c3", "user")
        assert agent_pool.properties is not None
        agent_pool.properties.orchestrator_version = NEW
        return sdk.agent_pools.begin_create_or_update(GROUP, "c3", "user", agent_pool)

    rows = [
        (put("1.30.4"), FailedPrecondition, "VERSION_NOT_OFFERED"),
        (put(NEXT_MINOR), FailedPrecondition, "MINOR_VERSION_SKIP"),
        (put("1.28.1"), FailedPrecondition, "VERSION_NOT_OFFERED"),
        (pool, FailedPrecondition, "NODE_POOL_AHEAD_OF_CONTROL_PLANE"),
        (lambda sdk: sdk.managed_clusters.get(GROUP, "nope"), NotFound, "CLUSTER_NOT_FOUND"),
    ]
    for call, kind, reason in rows:
        error = _arm_error(emulator, call)
        assert isinstance(error, kind) and error.reason == reason, (reason, error.message)
        assert not error.retryable
    emulator.throttle(1, retry_after=3)
    throttled = _arm_error(emulator, lambda sdk: sdk.managed_clusters.get(GROUP, "c1"))
    assert isinstance(throttled, Unavailable) and throttled.retry_after == 3


class _NoCredential:
    """A TokenCredential that cannot get a token (as azure-identity without its environment)."""

    def get_token(self, *scopes: str, **kwargs: object) -> object:
        from azure.identity import CredentialUnavailableError

        raise CredentialUnavailableError("federated token file /secret/path unreadable")


def test_no_token_is_unavailable_with_fixed_words(emulator: AksEmulator) -> None:
    from prometheus_client import CollectorRegistry

    from plugins.aks import AksPlugin, AksPluginOptions, parse_config
    from plugins.sdk.client import PluginClient

    plugin = AksPlugin(
        AksPluginOptions(
            config=parse_config(plugin_config(emulator, NAMES)),
            registry=CollectorRegistry(),
            credential=_NoCredential(),  # type: ignore[arg-type]
        )
    )
    try:
        with PluginClient(plugin.address, caller="aks-tests") as client:
            error = _refused(lambda: client.get_cluster(cluster_id("c1")))
            assert error.code == grpc.StatusCode.UNAVAILABLE
            assert "no Azure token" in str(error) and "/secret/path" not in str(error)
            assert not client.probe().ready
    finally:
        plugin.stop(grace=0)
