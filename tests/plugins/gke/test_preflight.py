"""PreflightUpgrade against GKE: ACCEPTED, REFUSED_NEVER from GetServerConfig and GKE's rules,
REFUSED_LATER while an operation runs (or inside an exclusion, when opted in); read-only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEW, NEWER, NEXT_MINOR, OLD, cluster_id, plugin_config
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_terminal

C1 = cluster_id("c1")
PATCH = "1.28.9-gke.1000"
POOL_OLD = "1.28.3-gke.1286000"
_S = cluster_pb2


def _no_mutation(emulator: GkeEmulator) -> None:
    for method in ("UpdateMaster", "UpdateNodePool", "compute.backendServices.patch"):
        assert emulator.calls(method) == 0, method


def test_preflight_is_declared_and_accepts_what_gke_would(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    assert identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE in client.capabilities()
    accepted = client.preflight_upgrade(C1, NEW, {"default-pool": NEW})
    assert (accepted.verdict, accepted.reason_code) == (_S.PREFLIGHT_VERDICT_ACCEPTED, "")
    # workers upgrades blue-green: accepted, with the soak notice (see the blue-green test)
    noted = client.preflight_upgrade(C1, NEW, {"default-pool": NEW, "workers": "1.29"})
    assert (noted.verdict, noted.reason_code) == (
        _S.PREFLIGHT_VERDICT_ACCEPTED,
        "BLUE_GREEN_UPGRADE",
    )
    unchanged = client.preflight_upgrade(C1, "", {"workers": OLD})
    assert (unchanged.verdict, unchanged.reason_code) == (
        _S.PREFLIGHT_VERDICT_ACCEPTED,  # nothing to do is accepted
        "",  # and a blue-green pool that does not change soaks nothing
    )
    _no_mutation(emulator)


@pytest.mark.parametrize(
    ("control_plane", "pools", "reason", "needle"),
    [
        ("1.29.2-gke.999", {}, "VERSION_NOT_OFFERED", "is not offered by GKE"),
        (NEXT_MINOR, {}, "MINOR_VERSION_SKIP", "skips a minor version"),
        ("", {"default-pool": NEW}, "NODE_POOL_AHEAD_OF_CONTROL_PLANE", "upgrade the control"),
        (NEW, {"default-pool": NEXT_MINOR}, "NODE_POOL_AHEAD_OF_CONTROL_PLANE", "newer than"),
    ],
)
def test_what_gke_refuses_is_refused_never(
    emulator: GkeEmulator,
    start_plugin: StartPlugin,
    control_plane: str,
    pools: dict[str, str],
    reason: str,
    needle: str,
) -> None:
    client = start_plugin(mode="none").client
    refused = client.preflight_upgrade(C1, control_plane, pools)
    assert (refused.verdict, refused.reason_code) == (_S.PREFLIGHT_VERDICT_REFUSED_NEVER, reason)
    assert needle in refused.message and refused.retry_after_seconds == 0
    _no_mutation(emulator)


def test_downgrades_skew_and_autopilot_pools_are_refused_never(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_server_config(
        "p",
        "l",
        master_versions=[OLD, NEW, NEWER, NEXT_MINOR, "1.27.8-gke.1067004"],
        channels={"REGULAR": [OLD, NEW]},
    )
    ahead = emulator.add_cluster(cluster_id("ahead"), master_version=NEW)
    skewed = emulator.add_cluster(
        cluster_id("skewed"),
        master_version=NEWER,
        node_pools=[{"name": "old", "version": "1.27.8-gke.1067004"}],
    )
    auto = emulator.add_cluster(
        cluster_id("auto"),
        master_version=OLD,
        autopilot=True,
        node_pools=[{"name": "default-pool", "version": OLD}],
    )
    names = [*NAMES, "ahead", "skewed", "auto"]
    client = start_plugin(plugin_config(emulator, names, mode="none")).client
    cases = {
        "DOWNGRADE_NOT_SUPPORTED": client.preflight_upgrade(ahead, OLD),
        "NODE_POOL_TOO_FAR_BEHIND": client.preflight_upgrade(skewed, NEXT_MINOR),
        "AUTOPILOT_NODE_POOL": client.preflight_upgrade(auto, NEW, {"default-pool": NEW}),
    }
    for reason, answer in cases.items():
        assert (answer.verdict, answer.reason_code) == (
            _S.PREFLIGHT_VERDICT_REFUSED_NEVER,
            reason,
        ), answer.message
    assert "node_pool_versions[default-pool]" in cases["AUTOPILOT_NODE_POOL"].message
    # The control plane alone is fine on Autopilot; the skewed pool's own upgrade too.
    assert client.preflight_upgrade(auto, NEW).verdict == _S.PREFLIGHT_VERDICT_ACCEPTED
    assert (
        client.preflight_upgrade(skewed, "", {"old": OLD}).verdict == _S.PREFLIGHT_VERDICT_ACCEPTED
    )
    _no_mutation(emulator)


def test_a_running_operation_is_refused_later_naming_it(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_NODES", pending=0.05, running=2.0)
    client = start_plugin(mode="none").client
    auto = emulator.start_foreign_operation(C1, "UPGRADE_NODES", OLD, "workers")
    later = client.preflight_upgrade(C1, NEW)
    assert (later.verdict, later.reason_code) == (
        _S.PREFLIGHT_VERDICT_REFUSED_LATER,
        "CLUSTER_BUSY",
    )
    assert auto in later.message and "UPGRADE_NODES of pool workers" in later.message
    assert later.retry_after_seconds > 0
    # A version GKE never offers is refused never, busy or not.
    never = client.preflight_upgrade(C1, "1.29.2-gke.999")
    assert never.verdict == _S.PREFLIGHT_VERDICT_REFUSED_NEVER
    wait_terminal(client, auto)
    assert client.preflight_upgrade(C1, NEW).verdict == _S.PREFLIGHT_VERDICT_ACCEPTED


def test_an_exclusion_is_information_unless_the_plugin_is_told_to_respect_it(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    now = datetime.now(UTC)
    emulator.set_server_config(
        "p", "l", master_versions=[OLD, NEW, NEWER, NEXT_MINOR, PATCH], channels={}
    )
    frozen = emulator.add_cluster(
        cluster_id("frozen"),
        master_version=OLD,
        node_pools=[{"name": "default-pool", "version": POOL_OLD}],
        exclusions=[
            {
                "name": "no-minor",
                "start": now - timedelta(hours=1),
                "end": now + timedelta(hours=2),
                "scope": "NO_MINOR_OR_NODE_UPGRADES",
            }
        ],
    )
    names = [*NAMES, "frozen"]
    default = start_plugin(plugin_config(emulator, names, mode="none")).client
    assert default.preflight_upgrade(frozen, NEW).verdict == _S.PREFLIGHT_VERDICT_ACCEPTED
    strict = start_plugin(
        plugin_config(emulator, names, mode="none", upgrades={"respectMaintenanceExclusions": True})
    ).client
    later = strict.preflight_upgrade(frozen, NEW)
    assert (later.verdict, later.reason_code) == (
        _S.PREFLIGHT_VERDICT_REFUSED_LATER,
        "MAINTENANCE_EXCLUSION",
    )
    assert 7000 < later.retry_after_seconds <= 7201  # until the exclusion ends
    # A patch of the control plane ("1.28": the highest 1.28 patch) is outside the scope.
    assert strict.preflight_upgrade(frozen, "1.28").verdict == _S.PREFLIGHT_VERDICT_ACCEPTED
    # Any node upgrade is inside it.
    node = strict.preflight_upgrade(frozen, "", {"default-pool": OLD})
    assert (node.verdict, node.reason_code) == (
        _S.PREFLIGHT_VERDICT_REFUSED_LATER,
        "MAINTENANCE_EXCLUSION",
    )


def test_unknown_clusters_and_pools_are_errors_and_unknown_aliases_refused_never(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(mode="none").client
    for call, code, needle in (
        (lambda: client.preflight_upgrade(cluster_id("nope"), NEW), grpc.StatusCode.NOT_FOUND, ""),
        (
            lambda: client.preflight_upgrade(C1, "", {"gpu": NEW}),
            grpc.StatusCode.NOT_FOUND,
            "node_pool_versions[gpu]",
        ),
    ):
        with pytest.raises(PluginCallError) as err:
            call()
        assert err.value.code is code and needle in err.value.message, err.value.message
    # An alias GKE cannot resolve is a verdict: never accepted as asked.
    never = client.preflight_upgrade(C1, "1.31")
    assert (never.verdict, never.reason_code) == (
        _S.PREFLIGHT_VERDICT_REFUSED_NEVER,
        "VERSION_NOT_OFFERED",
    )
    assert "control_plane_version: '1.31' matches no version" in never.message


def test_a_blue_green_pool_is_accepted_with_its_expected_soak_and_the_step_timeout_it_adds(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """Issue 20: a blue-green node-pool upgrade soaks inside its one UPGRADE_NODES operation
    (each drain batch's batchSoakDuration, then nodePoolSoakDuration, one hour when unset).
    PreflightUpgrade says so on ACCEPTED (reason BLUE_GREEN_UPGRADE): the expected soak from
    the pool's batch and soak settings, and that the node-pool step timeout includes it."""
    bg = cluster_id("bg")
    emulator.add_cluster(
        bg,
        master_version=NEW,
        node_pools=[
            {
                "name": "batched",  # 10 nodes in batches of 4: 3 batches x 5 min + 30 min
                "version": OLD,
                "imageType": "COS_CONTAINERD",
                "nodes": 10,
                "upgradeSettings": {
                    "strategy": "BLUE_GREEN",
                    "blueGreenSettings": {
                        "standardRolloutPolicy": {"batchNodeCount": 4, "batchSoakDuration": "300s"},
                        "nodePoolSoakDuration": "1800s",
                    },
                },
            },
            {
                "name": "defaulted",  # one batch, no batch soak, GKE's one-hour pool soak
                "version": OLD,
                "imageType": "COS_CONTAINERD",
                "nodes": 2,
                "upgradeSettings": {"strategy": "BLUE_GREEN", "blueGreenSettings": {}},
            },
            {
                "name": "surge",
                "version": OLD,
                "imageType": "COS_CONTAINERD",
                "nodes": 2,
                "upgradeSettings": {"maxSurge": 1, "maxUnavailable": 0},
            },
        ],
    )
    client = start_plugin(config=plugin_config(emulator, [*NAMES, "bg"])).client
    pools = {p.name: p for p in client.get_cluster(bg).node_pools}
    assert pools["batched"].upgrade_soak_seconds == 3 * 300 + 1800
    assert pools["defaulted"].upgrade_soak_seconds == 3600
    answer = client.preflight_upgrade(bg, "", {"batched": NEW, "surge": NEW})
    assert (answer.verdict, answer.reason_code) == (
        _S.PREFLIGHT_VERDICT_ACCEPTED,
        "BLUE_GREEN_UPGRADE",
    )
    assert (
        "node pool batched upgrades BLUE_GREEN: at least 45m of soak (3 batch(es) of its 10 "
        "node(s) x batchSoakDuration 5m + nodePoolSoakDuration 30m)" in answer.message
    )
    assert "surge" not in answer.message
    assert "timeouts.nodePool + the soak, here up to + 45m" in answer.message
    defaulted = client.preflight_upgrade(bg, "", {"defaulted": NEW})
    assert defaulted.reason_code == "BLUE_GREEN_UPGRADE"
    assert (
        "at least 1h of soak (1 batch(es) of its 2 node(s) x batchSoakDuration 0s + "
        "nodePoolSoakDuration 1h (unset: GKE's default))" in defaulted.message
    )
    surge_only = client.preflight_upgrade(bg, "", {"surge": NEW})
    assert (surge_only.verdict, surge_only.reason_code, surge_only.message) == (
        _S.PREFLIGHT_VERDICT_ACCEPTED,
        "",
        "",
    )
    _no_mutation(emulator)
