"""GKE's documented rules, end to end through the plugin and the emulator: version aliases,
release-channel and skew rules, Autopilot, busy clusters, ListOperations without an order and
with missingZones, and maintenance windows reported as information."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

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
    running_plugin,
)
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_terminal, wait_until

C1 = cluster_id("c1")
_S = cluster_pb2
PATCH = "1.28.9-gke.1000"  # a later patch of OLD's minor
RAPID_PATCH = "1.28.7-gke.1500"  # a patch of OLD's minor offered only in RAPID
OLDEST = "1.27.8-gke.1067004"


def _code(call: object, code: grpc.StatusCode, *needles: str) -> PluginCallError:
    with pytest.raises(PluginCallError) as err:
        call()  # type: ignore[operator]
    assert err.value.code is code, err.value.message
    for needle in needles:
        assert needle in err.value.message, err.value.message
    return err.value


def _done(client: PluginClient, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    final = wait_terminal(client, op.id)
    assert final.state == _S.OPERATION_STATE_SUCCEEDED, final.error_message
    return final


# ------------------------------------------------------------------------------ aliases


def test_version_aliases_resolve_from_get_server_config_to_an_explicit_version(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(mode="none").client
    op = client.upgrade_control_plane("cp", C1, "1.29")
    assert op.target_version == NEWER  # the highest 1.29 patch GKE offers
    assert client.upgrade_control_plane("cp", C1, "1.29").id == op.id  # same request again
    _done(client, op)
    assert emulator.requests("UpdateMaster") == [{"masterVersion": NEWER}]
    # "-" for nodes is the control plane's version; "1.28.5" the highest gke.N of 1.28.5.
    pool = _done(client, client.upgrade_node_pool("np", C1, "default-pool", "-"))
    assert pool.target_version == NEWER
    assert emulator.cluster(C1)["nodePools"][0]["version"] == NEWER
    c2 = cluster_id("c2")
    assert client.upgrade_control_plane("same", c2, "1.28.5").target_version == OLD
    assert emulator.calls("UpdateMaster") == 1  # 1.28.5 is where c2 is: nothing to do


def test_latest_resolves_and_an_alias_that_matches_nothing_is_invalid_naming_valid_versions(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    ahead = emulator.add_cluster(cluster_id("ahead"), master_version=NEWER)
    client = start_plugin(plugin_config(emulator, [*NAMES, "ahead"], mode="none")).client
    latest = _done(client, client.upgrade_control_plane("latest", ahead, "latest"))
    assert latest.target_version == NEXT_MINOR
    assert emulator.cluster(ahead)["currentMasterVersion"] == NEXT_MINOR
    error = _code(
        lambda: client.upgrade_control_plane("none", C1, "1.31"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "version: '1.31' matches no version GKE offers for control planes",
        f"valid: {NEXT_MINOR}, {NEWER}, {NEW}, {OLD}",
    )
    assert error.metadata.get("field") == "version"


# --------------------------------------------------------------------- channels, skew


def test_a_channel_cluster_takes_a_same_minor_patch_from_a_newer_channel_only(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_server_config(
        PROJECT,
        LOCATION,
        master_versions=OFFERED,
        channels={"REGULAR": [OLD, NEW], "RAPID": [RAPID_PATCH, NEWER, NEXT_MINOR]},
    )
    enrolled = emulator.add_cluster(
        cluster_id("regular"),
        master_version=OLD,
        channel="REGULAR",
        node_pools=[{"name": "default-pool", "version": OLD}],
    )
    client = start_plugin(plugin_config(emulator, [*NAMES, "regular"], mode="none")).client
    _done(client, client.upgrade_control_plane("rapid-patch", enrolled, RAPID_PATCH))
    _done(client, client.upgrade_node_pool("np", enrolled, "default-pool", RAPID_PATCH))
    assert emulator.cluster(enrolled)["currentMasterVersion"] == RAPID_PATCH
    # NEWER is in RAPID too, but in another minor version: not for a REGULAR cluster.
    _code(
        lambda: client.upgrade_control_plane("rapid-minor", enrolled, NEWER),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"version: {NEWER} is not offered",
        "REGULAR release channel",
    )
    assert emulator.calls("UpdateMaster") == 1


def test_a_control_plane_goes_back_to_an_earlier_patch_of_its_minor_but_not_across_minors(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_server_config(PROJECT, LOCATION, master_versions=[*OFFERED, PATCH])
    patched = emulator.add_cluster(cluster_id("patched"), master_version=PATCH)
    client = start_plugin(plugin_config(emulator, [*NAMES, "patched"], mode="none")).client
    _done(client, client.upgrade_control_plane("back", patched, OLD))
    assert emulator.cluster(patched)["currentMasterVersion"] == OLD
    _done(client, client.upgrade_control_plane("up", patched, NEW))
    _code(
        lambda: client.upgrade_control_plane("down-minor", patched, OLD),
        grpc.StatusCode.FAILED_PRECONDITION,
        "does not downgrade control planes to an earlier minor",
    )


def test_nodes_stay_within_two_minor_versions_of_the_control_plane(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_server_config(
        PROJECT, LOCATION, master_versions=[*OFFERED, OLDEST, "1.27.9-gke.100"]
    )
    # Control plane at 1.29, a pool at 1.27: the control plane cannot move to 1.30 before the
    # pool does (it would be 3 minors behind).
    skewed = emulator.add_cluster(
        cluster_id("skewed"),
        master_version=NEWER,
        node_pools=[{"name": "old", "version": OLDEST}, {"name": "new", "version": NEWER}],
    )
    client = start_plugin(plugin_config(emulator, [*NAMES, "skewed"], mode="none")).client
    _code(
        lambda: client.upgrade_control_plane("cp", skewed, NEXT_MINOR),
        grpc.StatusCode.FAILED_PRECONDITION,
        "would leave node pool old",
        "more than 2 minor versions behind",
    )
    _code(
        lambda: client.upgrade_node_pool("np-ahead", skewed, "old", NEXT_MINOR),
        grpc.StatusCode.FAILED_PRECONDITION,
        "newer than the control plane",
    )
    # Two minors behind is allowed; after the pool catches up the control plane may move.
    _done(client, client.upgrade_node_pool("np", skewed, "old", OLD))
    _done(client, client.upgrade_control_plane("cp-2", skewed, NEXT_MINOR))
    assert emulator.cluster(skewed)["currentMasterVersion"] == NEXT_MINOR


def test_an_autopilot_cluster_exposes_no_manual_node_pool_upgrades(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    auto = emulator.add_cluster(
        cluster_id("auto"),
        master_version=OLD,
        autopilot=True,
        node_pools=[{"name": "default-pool", "version": OLD}],
    )
    client = start_plugin(plugin_config(emulator, [*NAMES, "auto"], mode="none")).client
    listed = client.get_cluster(auto)
    assert listed.control_plane_version == OLD and list(listed.node_pools) == []
    _code(
        lambda: client.upgrade_node_pool("np", auto, "default-pool", OLD),
        grpc.StatusCode.FAILED_PRECONDITION,
        "Autopilot cluster",
        "upgrade only the control plane",
    )
    _done(client, client.upgrade_control_plane("cp", auto, NEW))  # REGULAR: [OLD, NEW]
    assert emulator.cluster(auto)["currentMasterVersion"] == NEW
    assert emulator.calls("UpdateNodePool") == 0


# ------------------------------------------------------------------------ busy clusters


def test_gkes_incompatible_operation_answer_becomes_aborted_naming_the_operation(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    # An operation GKE started between the plugin's look and its call: GKE answers HTTP 400
    # FAILED_PRECONDITION, reason failedPrecondition.
    client = start_plugin(mode="none").client
    emulator.fail_http(
        "UpdateMaster",
        400,
        "Cluster is running incompatible operation operation-1700000000000-4f1f2a3b.",
        "FAILED_PRECONDITION",
        reason="failedPrecondition",
    )
    error = _code(
        lambda: client.upgrade_control_plane("cp", C1, NEW),
        grpc.StatusCode.ABORTED,
        "projects/p/locations/l/operations/operation-1700000000000-4f1f2a3b",
    )
    assert (
        error.operation_id == "projects/p/locations/l/operations/operation-1700000000000-4f1f2a3b"
    )
    assert emulator.cluster(C1)["currentMasterVersion"] == OLD
    _done(client, client.upgrade_control_plane("cp-again", C1, NEW))


@pytest.mark.parametrize("shape", ["incompatible", "upgrading", "operating", "reason"])
def test_every_shape_of_gkes_busy_answer_is_aborted_naming_the_running_operation(
    emulator: GkeEmulator, start_plugin: StartPlugin, shape: str
) -> None:
    """GKE starts an auto-upgrade between the plugin's ListOperations and its UpdateMaster,
    then refuses the upgrade in one of its shapes (the emulator's busy_error: three texts
    naming the operation, or the ErrorInfo reason CLUSTER_ALREADY_HAS_OPERATION alone). Each
    is ABORTED naming the running operation, never a final FAILED_PRECONDITION."""
    client = start_plugin(mode="none").client
    emulator.set_busy_shape(shape)
    emulator.set_timing("UPGRADE_NODES", pending=0.05, running=2.0)
    started: list[str] = []
    emulator.before_next_call(
        "UpdateMaster",
        lambda: started.append(
            emulator.start_foreign_operation(C1, "UPGRADE_NODES", NEW, "default-pool")
        ),
    )
    error = _code(lambda: client.upgrade_control_plane("cp", C1, NEW), grpc.StatusCode.ABORTED)
    assert len(started) == 1
    assert error.operation_id == started[0]
    assert started[0] in error.message
    assert emulator.calls("UpdateMaster") == 1
    assert emulator.cluster(C1)["currentMasterVersion"] == OLD
    # Once GKE's operation ends, the same upgrade goes through.
    wait_until(
        lambda: client.get_cluster(C1).current_operation.id != started[0],
        timeout=30,
        what="the auto-upgrade ends",
    )
    _done(client, client.upgrade_control_plane("cp-again", C1, NEW))
    assert emulator.cluster(C1)["currentMasterVersion"] == NEW


def test_gkes_rate_quota_is_unavailable_with_backoff_never_missing_credentials(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """GKE's 429 RESOURCE_EXHAUSTED (ErrorInfo RATE_LIMIT_EXCEEDED) is UNAVAILABLE: retry."""
    client = start_plugin(mode="none").client
    emulator.set_quota("container", 0)
    error = _code(lambda: client.get_cluster(C1), grpc.StatusCode.UNAVAILABLE, "rate quota")
    assert error.retryable
    assert "roles/" not in error.message
    emulator.clear_quotas()
    assert client.get_cluster(C1).control_plane_version == OLD


def test_every_blocking_operation_counts_and_a_node_repair_holds_back_only_its_pool(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(mode="none").client
    _done(client, client.upgrade_control_plane("first", C1, NEW))
    for kind in ("AUTO_REPAIR_NODES", "UPGRADE_NODES"):
        emulator.set_timing(kind, pending=0.05, running=3.0)
    # An auto-repair of one node first (targetLink .../nodePools/workers/node/N), then an
    # auto-upgrade of default-pool beside it (GKE accepts it: a repair "may be concurrent with
    # other operations"): two operations RUNNING on one cluster.
    repair = emulator.start_foreign_operation(
        C1, "AUTO_REPAIR_NODES", "", "workers", node="gke-c1-workers-7d2c"
    )
    upgrade = emulator.start_foreign_operation(C1, "UPGRADE_NODES", NEW, "default-pool")
    # The control plane waits for the pool upgrade only.
    error = _code(lambda: client.upgrade_control_plane("cp", C1, NEW), grpc.StatusCode.ABORTED)
    assert error.operation_id == upgrade and upgrade in error.message
    assert repair not in error.message
    # The repaired pool waits for both, the oldest named first.
    error = _code(
        lambda: client.upgrade_node_pool("w", C1, "workers", NEW),
        grpc.StatusCode.ABORTED,
        repair,
        upgrade,
        "AUTO_REPAIR_NODES of node gke-c1-workers-7d2c in pool workers",
    )
    assert error.operation_id == repair
    # The default-pool request is served by GKE's own upgrade, whatever runs beside it.
    adopted = client.upgrade_node_pool("np", C1, "default-pool", NEW)
    assert adopted.id == upgrade and adopted.request_id == "np"
    assert emulator.calls("UpdateMaster") == 1 and emulator.calls("UpdateNodePool") == 0


def test_a_node_repair_or_a_management_update_does_not_hold_back_other_upgrades(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """Issue 20: AUTO_REPAIR_NODES and SET_NODE_POOL_MANAGEMENT may run beside other
    operations (cluster_service.proto); treating them as blocking stalled whole clusters."""
    client = start_plugin(mode="none").client
    for kind in ("AUTO_REPAIR_NODES", "SET_NODE_POOL_MANAGEMENT"):
        emulator.set_timing(kind, pending=0.05, running=60.0)
    emulator.start_foreign_operation(C1, "AUTO_REPAIR_NODES", "", "workers", node="n-1")
    emulator.start_foreign_operation(C1, "SET_NODE_POOL_MANAGEMENT", "", "default-pool")
    accepted = client.preflight_upgrade(C1, NEW, {"default-pool": NEW})
    assert accepted.verdict == _S.PREFLIGHT_VERDICT_ACCEPTED, accepted.message
    later = client.preflight_upgrade(C1, NEW, {"workers": NEW})
    assert later.verdict == _S.PREFLIGHT_VERDICT_REFUSED_LATER, later.message
    assert "AUTO_REPAIR_NODES" in later.message
    _done(client, client.upgrade_control_plane("cp", C1, NEW))
    _done(client, client.upgrade_node_pool("np", C1, "default-pool", NEW))
    assert emulator.cluster(C1)["currentMasterVersion"] == NEW
    pools = {p["name"]: p["version"] for p in emulator.cluster(C1)["nodePools"]}
    assert pools["default-pool"] == NEW and pools["workers"] == OLD


def test_a_gke_update_cluster_operation_is_current_never_adopted_while_it_runs(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """Issue 20: some GKE-initiated control-plane upgrades are UPDATE_CLUSTER operations (a
    broad type that may change metadata only, and carries no version). One shows as the
    cluster's current control-plane operation; a request waits (ABORTED) rather than adopting
    it, and once it has ended at the target, the request is served by it."""
    client = start_plugin(mode="none").client
    emulator.set_timing("UPDATE_CLUSTER", pending=0.05, running=1.5)
    update = emulator.start_foreign_operation(C1, "UPDATE_CLUSTER", NEW)
    current = client.get_cluster(C1).current_operation
    assert current.id == update
    assert current.kind == _S.OPERATION_KIND_UPGRADE_CONTROL_PLANE and not current.request_id
    error = _code(lambda: client.upgrade_control_plane("cp", C1, NEW), grpc.StatusCode.ABORTED)
    assert error.operation_id == update
    wait_until(
        lambda: not client.get_cluster(C1).HasField("current_operation"),
        timeout=30,
        what="GKE's update ends",
    )
    served = _done(client, client.upgrade_control_plane("cp", C1, NEW))
    assert served.id == update and served.request_id == "cp"
    assert emulator.calls("UpdateMaster") == 0
    assert emulator.cluster(C1)["currentMasterVersion"] == NEW


def test_list_operations_order_is_not_assumed(emulator: GkeEmulator) -> None:
    config = plugin_config(emulator, NAMES, mode="none")
    with running_plugin(config) as first:
        one = _done(first.client, first.client.upgrade_control_plane("one", C1, NEW))
        two = _done(first.client, first.client.upgrade_control_plane("two", C1, NEWER))
    # GKE lists operations in no documented order (the emulator: newest first). A restarted
    # plugin asked again for NEWER under a new request id finds the newest operation that did
    # the work, not the oldest.
    with running_plugin(config) as second:
        late = second.client.upgrade_control_plane("late", C1, NEWER)
        assert late.id == two.id != one.id
    assert emulator.calls("UpdateMaster") == 2


def test_missing_zones_make_a_mutation_unavailable_but_not_the_inventory(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(mode="none").client
    emulator.miss_zones([LOCATION], times=50)
    _code(
        lambda: client.upgrade_control_plane("cp", C1, NEW),
        grpc.StatusCode.UNAVAILABLE,
        f"could not reach zone(s) {LOCATION}",
    )
    assert [c.id for c in client.list_clusters()] == [cluster_id(n) for n in NAMES]
    emulator.state.missing_zones.clear()
    _done(client, client.upgrade_control_plane("cp", C1, NEW))
    assert emulator.calls("UpdateMaster") == 1


def test_operations_in_flight_are_polled_with_get_operation_not_whole_listings(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.05, running=2.5)
    client = start_plugin(mode="none", poll_seconds=0.1).client
    watch = client.watch_operations([C1])
    op = client.upgrade_control_plane("cp", C1, NEW)
    lists, gets = emulator.calls("ListOperations"), emulator.calls("GetOperation")
    final = None
    for update in watch:  # the poller reports the end: no RPC of ours asks in between
        if update.id == op.id and update.state == _S.OPERATION_STATE_SUCCEEDED:
            final = update
            break
    watch.cancel()
    assert final is not None and final.progress_percent == 100
    ticks = emulator.calls("GetOperation") - gets
    assert ticks >= 10  # about one GetOperation per 0.1 s tick over 2.5 s
    assert emulator.calls("ListOperations") - lists <= 3  # a full listing every 12 ticks


# ------------------------------------------------------------------ maintenance policy


def test_windows_and_exclusions_are_reported_on_the_cluster(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    start = datetime(2026, 1, 3, 2, 0, tzinfo=UTC)
    now = datetime.now(UTC)
    weekly = emulator.add_cluster(
        cluster_id("weekly"),
        master_version=OLD,
        window={
            "start": start,
            "end": start + timedelta(hours=6),
            "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
        },
        exclusions=[
            {
                "name": "no-minor",
                "start": now - timedelta(days=1),
                "end": now + timedelta(days=180),
                "scope": "NO_MINOR_OR_NODE_UPGRADES",
            },
            {"name": "freeze", "start": now, "end": now + timedelta(days=2)},
        ],
    )
    daily = emulator.add_cluster(cluster_id("daily"), master_version=OLD, window={"daily": "03:30"})
    names = [*NAMES, "weekly", "daily"]
    client = start_plugin(plugin_config(emulator, names, mode="none")).client
    got = list(client.get_cluster(weekly).maintenance_windows)
    assert [(w.kind, w.name, w.scope, w.recurrence) for w in got] == [
        (_S.MAINTENANCE_WINDOW_KIND_WINDOW, "", "", "FREQ=WEEKLY;BYDAY=SA,SU"),
        (_S.MAINTENANCE_WINDOW_KIND_EXCLUSION, "freeze", "NO_UPGRADES", ""),
        (_S.MAINTENANCE_WINDOW_KIND_EXCLUSION, "no-minor", "NO_MINOR_OR_NODE_UPGRADES", ""),
    ]
    assert got[0].start_time.ToDatetime(tzinfo=UTC) == start
    assert got[0].end_time.ToDatetime(tzinfo=UTC) == start + timedelta(hours=6)
    assert got[2].end_time.ToDatetime(tzinfo=UTC) > now + timedelta(days=179)
    (window,) = client.get_cluster(daily).maintenance_windows
    first = window.start_time.ToDatetime(tzinfo=UTC)
    assert (window.recurrence, first.hour, first.minute) == ("FREQ=DAILY", 3, 30)
    assert window.end_time.ToDatetime(tzinfo=UTC) - first == timedelta(hours=4)
    assert first - timedelta(days=1) < datetime.now(UTC) < first + timedelta(days=1, hours=4)
    listed = {c.id: c for c in client.list_clusters()}
    assert list(listed[weekly].maintenance_windows) == got


def test_a_state_file_keeps_an_alias_request_idempotent_across_restarts(
    emulator: GkeEmulator, tmp_path: Path
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.05, running=1.5)
    config = plugin_config(emulator, NAMES, mode="none", state_file=tmp_path / "state.json")
    with running_plugin(config) as first:
        op = first.client.upgrade_control_plane("alias", C1, "1.29")
    with running_plugin(config) as second:
        again = second.client.upgrade_control_plane("alias", C1, "1.29")
        assert (again.id, again.target_version) == (op.id, NEWER)
        wait_until(
            lambda: second.client.get_operation(op.id).state == _S.OPERATION_STATE_SUCCEEDED,
            what="upgrade done",
        )
    assert emulator.calls("UpdateMaster") == 1
