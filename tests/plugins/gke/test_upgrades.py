"""Control-plane and node-pool upgrades through GKE operations: mapping, idempotency across
plugin restarts, conflicts, failures and cancellation."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.gke.conftest import NAMES, StartPlugin
from tests.plugins.gke.support import NEW, NEWER, OLD, cluster_id, plugin_config, running_plugin
from tests.support.gke_emulator import GkeEmulator
from tests.support.plugin_harness import wait_terminal, wait_until

C1 = cluster_id("c1")
_S = cluster_pb2


def test_control_plane_upgrade_is_one_update_master_followed_to_success(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.1, running=1.0)
    client = start_plugin().client
    watch = client.watch_operations([C1], include_in_flight=True)
    op = client.upgrade_control_plane("cp-1", C1, NEW)
    assert op.id.startswith("projects/p/locations/l/operations/operation-")
    assert (op.kind, op.cluster_id, op.target_version, op.request_id) == (
        _S.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
        C1,
        NEW,
        "cp-1",
    )
    assert op.state in (_S.OPERATION_STATE_PENDING, _S.OPERATION_STATE_RUNNING)
    assert client.upgrade_control_plane("cp-1", C1, NEW).id == op.id
    busy = client.get_cluster(C1)
    assert busy.current_operation.id == op.id
    assert "RECONCILING" in wait_until(
        lambda: client.get_cluster(C1).unavailable_reason, what="cluster RECONCILING"
    )
    seen: list[cluster_pb2.Operation] = []
    for update in watch:
        seen.append(update)
        if update.id == op.id and update.state == _S.OPERATION_STATE_SUCCEEDED:
            break
    watch.cancel()
    running = [u for u in seen if u.state == _S.OPERATION_STATE_RUNNING]
    assert running and any(0 < u.progress_percent < 100 for u in running)
    assert seen[-1].progress_percent == 100 and seen[-1].HasField("end_time")
    assert emulator.calls("UpdateMaster") == 1
    assert emulator.requests("UpdateMaster") == [{"masterVersion": NEW}]
    after = client.get_cluster(C1)
    assert after.control_plane_version == NEW and after.available
    assert not after.HasField("current_operation")
    assert client.upgrade_control_plane("cp-1", C1, NEW).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.calls("UpdateMaster") == 1


def test_node_pool_upgrade_keeps_image_type_and_upgrade_settings(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    done = wait_terminal(client, client.upgrade_control_plane("cp", C1, NEW).id)
    assert done.state == _S.OPERATION_STATE_SUCCEEDED
    before = {p["name"]: p for p in emulator.cluster(C1)["nodePools"]}
    op = client.upgrade_node_pool("np", C1, "workers", NEW)
    assert (op.kind, op.node_pool) == (_S.OPERATION_KIND_UPGRADE_NODE_POOL, "workers")
    pools = wait_until(
        lambda: (
            {p.name: p.status for p in client.get_cluster(C1).node_pools}
            if client.get_cluster(C1).node_pools[1].status == _S.NODE_POOL_STATUS_UPGRADING
            else None
        ),
        what="pool UPGRADING",
    )
    assert pools == {
        "default-pool": _S.NODE_POOL_STATUS_READY,
        "workers": _S.NODE_POOL_STATUS_UPGRADING,
    }
    assert wait_terminal(client, op.id).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.requests("UpdateNodePool") == [
        {"nodeVersion": NEW, "imageType": "UBUNTU_CONTAINERD"}
    ]
    after = {p["name"]: p for p in emulator.cluster(C1)["nodePools"]}
    assert after["workers"]["version"] == NEW and after["default-pool"]["version"] == OLD
    assert after["workers"]["upgradeSettings"] == before["workers"]["upgradeSettings"]
    assert after["workers"]["upgradeSettings"]["strategy"] == "BLUE_GREEN"
    assert after["workers"]["config"]["imageType"] == "UBUNTU_CONTAINERD"


def test_an_upgrade_with_nothing_to_do_succeeds_at_once_without_calling_gke(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    op = client.upgrade_control_plane("same", C1, OLD)
    assert op.state == _S.OPERATION_STATE_SUCCEEDED and op.HasField("end_time")
    pool = client.upgrade_node_pool("same-pool", C1, "default-pool", OLD)
    assert pool.state == _S.OPERATION_STATE_SUCCEEDED
    assert client.get_operation(op.id).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.calls("UpdateMaster") == 0 and emulator.calls("UpdateNodePool") == 0


def test_a_second_request_during_an_upgrade_is_aborted_naming_it(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.1, running=2.0)
    client = start_plugin().client
    first = client.upgrade_control_plane("first", C1, NEW)
    for call in (
        lambda: client.upgrade_node_pool("other", C1, "default-pool", OLD),
        lambda: client.service_out("out", C1),
    ):
        with pytest.raises(PluginCallError) as err:
            call()
        assert err.value.code is grpc.StatusCode.ABORTED
        assert first.id in err.value.message
    assert emulator.calls("UpdateNodePool") == 0


def test_an_operation_gke_started_itself_blocks_and_shows_as_current(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_NODES", pending=0.1, running=2.0)
    client = start_plugin().client
    auto = emulator.start_foreign_operation(C1, "UPGRADE_NODES", NEW, "default-pool")
    cluster = client.get_cluster(C1)
    assert cluster.current_operation.id == auto
    assert cluster.current_operation.request_id == ""
    assert cluster.current_operation.node_pool == "default-pool"
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("cp", C1, NEW)
    assert err.value.code is grpc.StatusCode.ABORTED and auto in err.value.message
    assert emulator.calls("UpdateMaster") == 0


def test_a_failed_gke_operation_fails_with_its_message(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.fail_next_upgrade("UPGRADE_MASTER", C1, "etcd quorum lost during the upgrade")
    client = start_plugin().client
    op = wait_terminal(client, client.upgrade_control_plane("cp", C1, NEW).id)
    assert op.state == _S.OPERATION_STATE_FAILED
    assert op.error_code == "UPGRADE_FAILED"
    assert "etcd quorum lost during the upgrade" in op.error_message and op.id in op.error_message
    assert client.get_cluster(C1).control_plane_version == OLD
    retry = client.upgrade_control_plane("cp-retry", C1, NEW)
    assert retry.id != op.id
    assert wait_terminal(client, retry.id).state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.calls("UpdateMaster") == 2


def test_a_cancelled_gke_operation_runs_while_aborting_then_fails_cancelled(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.0, running=5.0)
    emulator.state.abort_seconds = 0.5
    client = start_plugin().client
    op = client.upgrade_control_plane("cp", C1, NEW)
    emulator.cancel(op.id)
    assert emulator.operations(C1)[0]["status"] == "ABORTING"
    assert client.get_operation(op.id).state == _S.OPERATION_STATE_RUNNING
    final = wait_terminal(client, op.id)
    assert (final.state, final.error_code) == (_S.OPERATION_STATE_FAILED, "CANCELLED")


def test_reusing_a_request_id_for_another_version_is_invalid(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    client.upgrade_control_plane("cp", C1, NEW)
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("cp", C1, "1.29.3-gke.1093000")
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id" in err.value.message


def test_unknown_node_pool_and_unselected_cluster_are_not_found(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.add_cluster(cluster_id("other"), master_version=OLD)
    client = start_plugin().client
    for call in (
        lambda: client.upgrade_node_pool("np", C1, "no-such-pool", NEW),
        lambda: client.upgrade_control_plane("cp", cluster_id("other"), NEW),
        lambda: client.get_cluster(cluster_id("other")),
    ):
        with pytest.raises(PluginCallError) as err:
            call()
        assert err.value.code is grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("state_file", [True, False], ids=["state-file", "no-state-file"])
def test_a_plugin_restart_mid_operation_resumes_without_a_second_update_master(
    emulator: GkeEmulator, tmp_path: Path, state_file: bool
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.1, running=2.0)
    config = plugin_config(
        emulator, NAMES, state_file=tmp_path / "state.json" if state_file else None
    )
    with running_plugin(config) as first:
        op = first.client.upgrade_control_plane("rollout:c1:controlPlane:0", C1, NEW)
        assert op.state in (_S.OPERATION_STATE_PENDING, _S.OPERATION_STATE_RUNNING)
    with running_plugin(config) as second:
        client = second.client
        # The operation id is GKE's: it is found again after the restart.
        resumed = client.get_operation(op.id)
        assert resumed.state in (_S.OPERATION_STATE_PENDING, _S.OPERATION_STATE_RUNNING)
        assert client.get_cluster(C1).current_operation.id == op.id
        # The same request again returns the same operation, never a second UpdateMaster.
        again = client.upgrade_control_plane("rollout:c1:controlPlane:0", C1, NEW)
        assert again.id == op.id and again.request_id == "rollout:c1:controlPlane:0"
        assert again.target_version == NEW
        final = wait_terminal(client, op.id)
        assert final.state == _S.OPERATION_STATE_SUCCEEDED
        assert client.upgrade_control_plane("rollout:c1:controlPlane:0", C1, NEW).id == op.id
    with running_plugin(config) as third:
        # After the end, too (the GKE operation is recent and did what was asked).
        late = third.client.upgrade_control_plane("rollout:c1:controlPlane:0", C1, NEW)
        assert late.id == op.id and late.state == _S.OPERATION_STATE_SUCCEEDED
    assert emulator.calls("UpdateMaster") == 1
    assert emulator.cluster(C1)["currentMasterVersion"] == NEW


def test_an_adopted_auto_upgrade_that_lands_past_the_requested_version_succeeds(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    # A release channel's auto-upgrade may land past the requested version; the orchestrator
    # accepts a cluster whose version meets the target, so the adopted operation does too.
    emulator.set_timing("UPGRADE_MASTER", pending=0.1, running=0.8)
    client = start_plugin().client
    emulator.start_foreign_operation(C1, "UPGRADE_MASTER", NEWER)
    adopted = client.upgrade_control_plane("cp", C1, NEW)
    final = wait_terminal(client, adopted.id)
    assert (final.state, final.target_version, final.request_id) == (
        _S.OPERATION_STATE_SUCCEEDED,
        NEW,
        "cp",
    )
    assert emulator.cluster(C1)["currentMasterVersion"] == NEWER
    assert emulator.calls("UpdateMaster") == 0


def test_an_adopted_operation_that_stops_short_of_the_requested_version_fails(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    emulator.set_timing("UPGRADE_MASTER", pending=0.1, running=0.8)
    client = start_plugin().client
    emulator.start_foreign_operation(C1, "UPGRADE_MASTER", NEW)
    adopted = client.upgrade_control_plane("cp", C1, NEWER)
    final = wait_terminal(client, adopted.id)
    assert (final.state, final.error_code) == (_S.OPERATION_STATE_FAILED, "TARGET_NOT_REACHED")
    assert NEW in final.error_message and NEWER in final.error_message
    assert emulator.calls("UpdateMaster") == 0


def test_pools_report_their_strategy_and_soak_and_a_blue_green_upgrade_soaks(
    emulator: GkeEmulator, start_plugin: StartPlugin
) -> None:
    """Issue 20: a blue-green upgrade soaks inside its one UPGRADE_NODES operation; the pool
    reports its strategy and soak (the orchestrator adds the soak to its node-pool bound)."""
    client = start_plugin(mode="none").client
    pools = {p.name: p for p in client.get_cluster(C1).node_pools}
    assert (pools["default-pool"].upgrade_strategy, pools["default-pool"].upgrade_soak_seconds) == (
        "SURGE",
        0,
    )
    # workers: 3 nodes drained in batches of 50 % (two batches, no batch soak), then
    # nodePoolSoakDuration 60 s.
    assert (pools["workers"].upgrade_strategy, pools["workers"].upgrade_soak_seconds) == (
        "BLUE_GREEN",
        60,
    )
    first = wait_terminal(client, client.upgrade_control_plane("cp", C1, NEW).id)
    assert first.state == _S.OPERATION_STATE_SUCCEEDED
    started = time.monotonic()
    pool = wait_terminal(client, client.upgrade_node_pool("w", C1, "workers", NEW).id)
    assert pool.state == _S.OPERATION_STATE_SUCCEEDED
    assert time.monotonic() - started >= 0.6  # the 60 s soak at the emulator's 1/100 scale
