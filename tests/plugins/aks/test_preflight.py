"""PreflightUpgrade from each cluster's upgrade profile: the same rules the upgrades enforce,
read-only, REFUSED_NEVER for targets AKS never takes, REFUSED_LATER while something runs."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.aks.conftest import NAMES, StartPlugin
from tests.plugins.aks.support import NEW, NEWER, NEXT_MINOR, OLD, cluster_id, plugin_config
from tests.support.aks_emulator import AksEmulator
from tests.support.plugin_harness import wait_terminal

ACCEPTED = cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
LATER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER
NEVER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER
MUTATIONS = (
    "ManagedClusters.CreateOrUpdate",
    "AgentPools.CreateOrUpdate",
    "AgentPools.UpgradeNodeImageVersion",
)


def _verdict(
    start_plugin: StartPlugin, plane: str, pools: dict[str, str] | None = None, name: str = "c1"
) -> tuple[int, str]:
    answer = start_plugin().client.preflight_upgrade(cluster_id(name), plane, pools or {})
    return answer.verdict, answer.reason_code


@pytest.mark.parametrize(
    ("plane", "pools", "expected"),
    [
        (NEW, {"system": NEW, "user": NEW}, (ACCEPTED, "")),
        (OLD, {}, (ACCEPTED, "")),
        (NEXT_MINOR, {}, (NEVER, "MINOR_VERSION_SKIP")),
        ("1.30.4", {}, (NEVER, "VERSION_NOT_OFFERED")),
        ("1.28.9", {}, (NEVER, "DOWNGRADE_NOT_SUPPORTED")),
        ("", {"user": NEW}, (NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE")),
        (NEW, {"user": NEWER}, (NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE")),
        ("", {"user": OLD}, (ACCEPTED, "")),
    ],
)
def test_verdicts_follow_the_upgrade_profile(
    emulator: AksEmulator,
    start_plugin: StartPlugin,
    plane: str,
    pools: dict[str, str],
    expected: tuple[int, str],
) -> None:
    assert _verdict(start_plugin, plane, pools) == expected
    assert all(emulator.calls(name) == 0 for name in MUTATIONS)  # read-only


def test_an_unknown_pool_is_not_found(start_plugin: StartPlugin) -> None:
    with pytest.raises(PluginCallError) as raised:
        start_plugin().client.preflight_upgrade(cluster_id("c1"), "", {"gpu": OLD})
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert raised.value.reason == "NODE_POOL_NOT_FOUND"


def test_an_operation_of_aks_refuses_later_but_a_bad_target_still_never(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.set_state(cluster_id("c2"), "Updating")  # AKS runs something of its own
    later = client.preflight_upgrade(cluster_id("c2"), NEW, {})
    assert (later.verdict, later.reason_code) == (LATER, "CLUSTER_BUSY")
    assert later.retry_after_seconds > 0
    never = client.preflight_upgrade(cluster_id("c2"), NEXT_MINOR, {})
    assert (never.verdict, never.reason_code) == (NEVER, "MINOR_VERSION_SKIP")
    # The mutation refuses the same way (FAILED_PRECONDITION with RetryInfo), starting nothing.
    with pytest.raises(PluginCallError) as raised:
        client.upgrade_control_plane("busy", cluster_id("c2"), NEW)
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.reason == "CLUSTER_BUSY" and raised.value.retry_after
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 0


def test_the_plugins_own_operation_refuses_later_until_it_ends(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    op = client.upgrade_control_plane("cp", cluster_id("c3"), NEW)
    busy = client.preflight_upgrade(cluster_id("c3"), NEW, {"user": NEW})
    assert (busy.verdict, busy.reason_code) == (LATER, "CLUSTER_BUSY")
    # Judged against the plane's version now (OLD until the operation ends): never as asked.
    ahead = client.preflight_upgrade(cluster_id("c3"), "", {"user": NEW})
    assert (ahead.verdict, ahead.reason_code) == (NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE")
    wait_terminal(client, op.id)
    after = client.preflight_upgrade(cluster_id("c3"), "", {"user": NEW, "system": NEW})
    assert after.verdict == ACCEPTED


def test_preflight_and_the_mutation_agree_on_a_never_target(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    verdict = client.preflight_upgrade(cluster_id("c4"), "1.30.4", {})
    with pytest.raises(PluginCallError) as raised:
        client.upgrade_control_plane("bad", cluster_id("c4"), "1.30.4")
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.reason == verdict.reason_code == "VERSION_NOT_OFFERED"
    assert raised.value.retry_after is None
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 0


def test_a_control_plane_upgrade_leaving_a_pool_three_minors_behind_is_refused(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(
        cluster_id("lagging"),
        location="westeurope",
        version=OLD,
        pools=[{"name": "system", "mode": "System"}, {"name": "legacy", "version": "1.27.9"}],
    )
    config = plugin_config(emulator, [*NAMES, "lagging"])
    client = start_plugin(config).client
    verdict = client.preflight_upgrade(cluster_id("lagging"), NEW, {})
    assert (verdict.verdict, verdict.reason_code) == (NEVER, "NODE_POOL_TOO_FAR_BEHIND")
    with pytest.raises(PluginCallError) as raised:
        client.upgrade_control_plane("lag", cluster_id("lagging"), NEW)
    assert raised.value.reason == "NODE_POOL_TOO_FAR_BEHIND"
    assert emulator.calls("ManagedClusters.CreateOrUpdate") == 0
    # Pools at the control plane's version: the same upgrade is accepted.
    assert client.preflight_upgrade(cluster_id("c1"), NEW, {}).verdict == ACCEPTED
