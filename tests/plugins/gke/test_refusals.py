"""What the plugin refuses before calling GKE: each refusal is FAILED_PRECONDITION naming the
field, and GKE's UpdateMaster / UpdateNodePool are never called."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import (
    LOCATION,
    NEW,
    NEWER,
    NEXT_MINOR,
    OFFERED,
    OLD,
    PROJECT,
    cluster_id,
    plugin_config,
)
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_terminal

C1 = cluster_id("c1")
PATCH = "1.28.9-gke.1000"  # a later patch of OLD's minor
POOL_OLD = "1.28.3-gke.1286000"  # an earlier patch: where lagging node pools are


def _refused(call: Callable[[], object], *needles: str) -> str:
    with pytest.raises(PluginCallError) as err:
        call()
    assert err.value.code is grpc.StatusCode.FAILED_PRECONDITION, err.value.message
    for needle in needles:
        assert needle in err.value.message, err.value.message
    return err.value.message


def _lagging_cluster(emulator: GkeEmulator, name: str = "lagging", **options: Any) -> str:
    """Cluster "lagging": control plane at OLD, its default-pool at POOL_OLD; GetServerConfig
    offers PATCH and POOL_OLD as well."""
    emulator.set_server_config(
        PROJECT,
        LOCATION,
        master_versions=[*OFFERED, PATCH, POOL_OLD],
        channels={"REGULAR": [OLD, NEW]},
    )
    return emulator.add_cluster(
        cluster_id(name),
        master_version=OLD,
        node_pools=[{"name": "default-pool", "version": POOL_OLD}],
        **options,
    )


def _no_upgrade_calls(emulator: GkeEmulator) -> None:
    assert emulator.calls("UpdateMaster") == 0
    assert emulator.calls("UpdateNodePool") == 0


def test_a_version_gke_does_not_offer_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    lagging = _lagging_cluster(emulator)
    client = start_plugin(plugin_config(emulator, [*NAMES, "lagging"], mode="none")).client
    message = _refused(
        lambda: client.upgrade_control_plane("cp", C1, "1.29.2-gke.999"),
        "version: 1.29.2-gke.999 is not offered",
        "control planes in l",
        NEW,
    )
    assert "without a release channel" in message
    _refused(
        lambda: client.upgrade_node_pool("np", lagging, "default-pool", "1.28.4-gke.1"),
        "version: 1.28.4-gke.1 is not offered by GKE for node pools",
    )
    _no_upgrade_calls(emulator)


def test_a_version_outside_the_clusters_release_channel_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    enrolled = emulator.add_cluster(cluster_id("regular"), master_version=OLD, channel="REGULAR")
    names = [*NAMES, "regular"]
    client = start_plugin(plugin_config(emulator, names, mode="none")).client
    # NEWER is offered without a channel, but not in REGULAR ([OLD, NEW]).
    _refused(
        lambda: client.upgrade_control_plane("cp", enrolled, NEWER),
        "version: 1.29.3-gke.1093000",
        "REGULAR release channel",
        f"offered: {NEW}, {OLD}",
    )
    _no_upgrade_calls(emulator)
    op = client.upgrade_control_plane("cp-ok", enrolled, NEW)
    assert wait_terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED


def test_a_control_plane_downgrade_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    ahead = emulator.add_cluster(cluster_id("ahead"), master_version=NEW)
    client = start_plugin(plugin_config(emulator, [*NAMES, "ahead"], mode="none")).client
    _refused(
        lambda: client.upgrade_control_plane("cp", ahead, OLD),
        f"version: {OLD} is older than the control plane",
        "does not downgrade",
    )
    _no_upgrade_calls(emulator)


def test_a_node_pool_newer_than_its_control_plane_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    _refused(
        lambda: client.upgrade_node_pool("np", C1, "default-pool", NEW),
        f"version: {NEW} is newer than the control plane",
        "upgrade the control plane first",
    )
    _no_upgrade_calls(emulator)


def test_a_control_plane_minor_skip_is_refused(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    assert NEXT_MINOR in OFFERED
    client = start_plugin().client
    _refused(
        lambda: client.upgrade_control_plane("cp", C1, NEXT_MINOR),
        f"version: {NEXT_MINOR} skips a minor version",
        "one minor version at a time",
    )
    _no_upgrade_calls(emulator)


def _exclusion(scope: str | None, start: timedelta, end: timedelta) -> dict[str, object]:
    now = datetime.now(UTC)
    window: dict[str, object] = {"name": "holiday-freeze", "start": now + start, "end": now + end}
    if scope is not None:
        window["scope"] = scope
    return window


def _fleet_with_exclusion(
    emulator: GkeEmulator, start_plugin: StartPlugin, window: dict[str, object], **extra: object
) -> tuple[str, PluginClient]:
    frozen = _lagging_cluster(emulator, name="frozen", exclusions=[window])
    running = start_plugin(plugin_config(emulator, [*NAMES, "frozen"], mode="none", **extra))
    return frozen, running.client


RESPECT = {"upgrades": {"respectMaintenanceExclusions": True}}


def test_by_default_manual_upgrades_go_through_an_exclusion_as_in_gke(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    # The usual set-up: a long NO_MINOR_OR_NODE_UPGRADES exclusion keeps GKE's own upgrades
    # from racing the orchestrator; manual upgrades go through it (GKE docs: exclusions
    # forbid automatic maintenance only).
    frozen, client = _fleet_with_exclusion(
        emulator,
        start_plugin,
        _exclusion("NO_MINOR_OR_NODE_UPGRADES", -timedelta(hours=1), timedelta(days=180)),
    )
    op = client.upgrade_control_plane("minor", frozen, NEW)
    assert wait_terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    pool = client.upgrade_node_pool("np", frozen, "default-pool", NEW)
    assert wait_terminal(client, pool.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    assert emulator.cluster(frozen)["currentMasterVersion"] == NEW
    assert emulator.cluster(frozen)["nodePools"][0]["version"] == NEW


def test_an_upgrade_inside_a_no_upgrades_exclusion_is_refused_as_retryable_when_opted_in(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    frozen, client = _fleet_with_exclusion(
        emulator, start_plugin, _exclusion(None, -timedelta(hours=1), timedelta(days=2)), **RESPECT
    )
    message = _refused(
        lambda: client.upgrade_control_plane("cp", frozen, PATCH),
        "inside maintenance exclusion 'holiday-freeze'",
        "scope NO_UPGRADES",
        "retryable after it ends",
    )
    again = _refused(lambda: client.upgrade_control_plane("cp", frozen, PATCH))
    assert message == again  # deterministic: no clock in the text
    _refused(
        lambda: client.upgrade_node_pool("np", frozen, "default-pool", OLD),
        "maintenance exclusion",
    )
    _no_upgrade_calls(emulator)


def test_exclusion_scopes_block_only_what_they_name_when_opted_in(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    frozen, client = _fleet_with_exclusion(
        emulator,
        start_plugin,
        _exclusion("NO_MINOR_OR_NODE_UPGRADES", -timedelta(hours=1), timedelta(days=2)),
        **RESPECT,
    )
    # A minor control-plane upgrade and any node upgrade are blocked; a patch is not.
    _refused(
        lambda: client.upgrade_control_plane("minor", frozen, NEW),
        "scope NO_MINOR_OR_NODE_UPGRADES",
    )
    op = client.upgrade_control_plane("patch", frozen, PATCH)
    assert wait_terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    _refused(
        lambda: client.upgrade_node_pool("np", frozen, "default-pool", OLD),
        "scope NO_MINOR_OR_NODE_UPGRADES",
    )
    assert emulator.calls("UpdateMaster") == 1 and emulator.calls("UpdateNodePool") == 0


def test_an_exclusion_in_the_past_does_not_block_even_when_opted_in(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    frozen, client = _fleet_with_exclusion(
        emulator,
        start_plugin,
        _exclusion(None, -timedelta(days=3), -timedelta(days=1)),
        **RESPECT,
    )
    op = client.upgrade_control_plane("cp", frozen, PATCH)
    assert wait_terminal(client, op.id).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
