"""PreflightUpgrade: EKS's offers (DescribeClusterVersions), one minor at a time, node groups
matching and not ahead of the control plane, upgrade insights (UPGRADE_READINESS ERROR for the
target refuses it with the insight's reason), node group health, updates in progress. The
verdict matches what the upgrade RPC then answers, and asking changes nothing."""

from __future__ import annotations

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.eks.conftest import StartPlugin
from tests.plugins.eks.support import NEW, NEXT, OLD, REGION, cluster_id
from tests.support.eks_emulator import EksEmulator
from tests.support.plugin_harness import wait_terminal

ACCEPTED = cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
LATER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER
NEVER = cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER


@pytest.mark.parametrize(
    ("control_plane", "pools", "verdict", "reason"),
    [
        (NEW, {}, ACCEPTED, ""),
        (OLD, {"system": OLD}, ACCEPTED, ""),
        (NEXT, {}, NEVER, "MINOR_VERSION_SKIP"),
        ("1.28", {}, NEVER, "DOWNGRADE_NOT_SUPPORTED"),
        ("1.40", {}, NEVER, "VERSION_NOT_OFFERED"),
        ("1.30.2", {}, NEVER, "VERSION_NOT_OFFERED"),
        ("", {"workers": NEW}, NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE"),
        (NEW, {"workers": NEW}, ACCEPTED, ""),
        (NEW, {"workers": NEXT}, NEVER, "NODE_POOL_AHEAD_OF_CONTROL_PLANE"),
    ],
)
def test_verdicts_follow_eks_rules_and_match_the_upgrade_rpc(
    emulator: EksEmulator,
    start_plugin: StartPlugin,
    control_plane: str,
    pools: dict[str, str],
    verdict: int,
    reason: str,
) -> None:
    client = start_plugin().client
    answer = client.preflight_upgrade(cluster_id("c1"), control_plane, pools)
    assert (answer.verdict, answer.reason_code) == (verdict, reason), answer.message
    assert emulator.calls("UpdateClusterVersion") == emulator.calls("UpdateNodegroupVersion") == 0
    if verdict == NEVER and (not pools or not control_plane):
        with pytest.raises(PluginCallError) as err:
            if control_plane:
                client.upgrade_control_plane("r", cluster_id("c1"), control_plane)
            else:
                [(pool, version)] = pools.items()
                client.upgrade_node_pool("r", cluster_id("c1"), pool, version)
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.reason == reason and err.value.retry_after is None
        assert emulator.calls("UpdateClusterVersion") == 0
        assert emulator.calls("UpdateNodegroupVersion") == 0


def test_an_error_insight_for_the_target_refuses_it_with_the_insight_reason(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_insight(
        REGION, "c2", NEW, "ERROR", "Deprecated API usage detected", "Deprecated APIs removed"
    )
    emulator.add_insight(REGION, "c2", NEW, "PASSING", "No issue", "Kubelet version skew")
    emulator.add_insight(REGION, "c3", NEW, "WARNING", "Check soon", "Add-on versions")
    emulator.add_insight(REGION, "c3", NEXT, "ERROR", "Not this target", "Later removals")
    client = start_plugin().client
    answer = client.preflight_upgrade(cluster_id("c2"), NEW, {})
    assert answer.verdict == LATER and answer.retry_after_seconds == 3600
    assert "Deprecated APIs removed" in answer.message
    assert "Deprecated API usage detected" in answer.message
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("r", cluster_id("c2"), NEW)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.retry_after == 3600 and "Deprecated API usage detected" in str(err.value)
    assert emulator.cluster(REGION, "c2")["updates"] == []
    # A warning, or an error for another version, refuses nothing.
    assert client.preflight_upgrade(cluster_id("c3"), NEW, {}).verdict == ACCEPTED


def test_a_degraded_node_group_is_refused_for_now(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    wait_terminal(client, client.upgrade_control_plane("r-cp", cluster_id("c1"), NEW).id)
    emulator.set_nodegroup_issues(
        REGION, "c1", "workers", [("AsgInstanceLaunchFailures", "capacity")]
    )
    answer = client.preflight_upgrade(cluster_id("c1"), "", {"workers": NEW})
    assert (answer.verdict, answer.reason_code) == (LATER, "CLUSTER_UNAVAILABLE")
    assert "AsgInstanceLaunchFailures" in answer.message
    with pytest.raises(PluginCallError) as err:
        client.upgrade_node_pool("r-np", cluster_id("c1"), "workers", NEW)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and err.value.retry_after
    emulator.set_nodegroup_issues(REGION, "c1", "workers", [])
    assert client.preflight_upgrade(cluster_id("c1"), "", {"workers": NEW}).verdict == ACCEPTED


def test_an_update_in_progress_is_refused_later(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.held = True
    client = start_plugin().client
    client.upgrade_control_plane("r", cluster_id("c4"), NEW)
    busy = client.preflight_upgrade(cluster_id("c4"), NEW, {})
    assert (busy.verdict, busy.reason_code) == (LATER, "CLUSTER_BUSY")
    # Never-acceptable targets say so even while busy.
    assert client.preflight_upgrade(cluster_id("c4"), NEXT, {}).verdict == NEVER


def test_unknown_clusters_and_pools_and_bad_versions_are_errors(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    for cluster, cp, pools, code in [
        (cluster_id("zz"), NEW, {}, grpc.StatusCode.NOT_FOUND),
        (cluster_id("c1"), "", {"nope": NEW}, grpc.StatusCode.NOT_FOUND),
        (cluster_id("c1"), "one.two", {}, grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(PluginCallError) as err:
            client.preflight_upgrade(cluster, cp, pools)
        assert err.value.code == code
