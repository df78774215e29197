"""Upgrades as EKS updates: UpdateClusterVersion / UpdateNodegroupVersion with the request's
clientRequestToken, followed with DescribeUpdate; idempotent by request_id in every process,
one operation per cluster, failures reported as EKS tells them."""

from __future__ import annotations

from pathlib import Path

import boto3
import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.eks.ids import client_token
from plugins.sdk.client import PluginCallError
from tests.plugins.eks.conftest import StartPlugin
from tests.plugins.eks.support import NEW, OLD, REGION, cluster_id, plugin_config, running_plugin
from tests.support.eks_emulator import EksEmulator
from tests.support.plugin_harness import wait_terminal

RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED


def test_control_plane_then_node_group_upgrade_reach_the_target(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.held = True
    op = client.upgrade_control_plane("r-cp", cluster_id("c1"), NEW)
    assert op.state == RUNNING and op.request_id == "r-cp" and op.target_version == NEW
    assert op.id.startswith(cluster_id("c1") + "/updates/")
    assert client.get_cluster(cluster_id("c1")).current_operation.id == op.id
    emulator.held = False
    assert wait_terminal(client, op.id).state == SUCCEEDED
    assert emulator.cluster(REGION, "c1")["version"] == NEW
    assert emulator.requests("UpdateClusterVersion") == [
        {"version": NEW, "clientRequestToken": client_token("r-cp")}
    ]
    pool = client.upgrade_node_pool("r-np", cluster_id("c1"), "workers", NEW)
    assert pool.id.startswith(cluster_id("c1") + "/nodegroups/workers/updates/")
    assert pool.kind == cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL
    assert wait_terminal(client, pool.id).state == SUCCEEDED
    assert emulator.cluster(REGION, "c1")["nodegroups"] == {"system": OLD, "workers": NEW}
    assert emulator.cluster(REGION, "c2")["version"] == OLD


def test_the_same_request_id_finds_its_update_in_this_process_and_the_next(
    emulator: EksEmulator, tmp_path: Path
) -> None:
    emulator.held = True
    config = plugin_config(emulator)
    with running_plugin(config) as first:
        op = first.client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
        again = first.client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
        assert again.id == op.id
    # A new process without a journal: EKS's clientRequestToken finds the same update.
    with running_plugin(config) as second:
        third = second.client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
        assert third.id == op.id and third.state == RUNNING
        emulator.held = False
        assert wait_terminal(second.client, op.id).state == SUCCEEDED
    with running_plugin(config) as fourth:
        # Done: the cluster is at the target; nothing starts again.
        done = fourth.client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
        assert done.state == SUCCEEDED
    assert [u[2] for u in emulator.cluster(REGION, "c1")["updates"]] == ["Successful"]


def test_a_request_id_reused_for_another_request_is_invalid(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
    with pytest.raises(PluginCallError) as err:
        client.upgrade_node_pool("r-1", cluster_id("c1"), "workers", OLD)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.reason == "REQUEST_ID_REUSED"


def test_a_new_request_while_an_update_runs_is_aborted_naming_it(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.held = True
    client = start_plugin().client
    op = client.upgrade_control_plane("r-1", cluster_id("c1"), NEW)
    for ask in (
        lambda: client.upgrade_control_plane("r-2", cluster_id("c1"), NEW),
        lambda: client.upgrade_node_pool("r-3", cluster_id("c1"), "workers", OLD),
        lambda: client.service_out("r-4", cluster_id("c1")),
    ):
        with pytest.raises(PluginCallError) as err:
            ask()
        assert err.value.code == grpc.StatusCode.ABORTED
        assert err.value.metadata.get("operation_id") == op.id
    assert len(emulator.cluster(REGION, "c1")["updates"]) == 1


def test_an_update_started_outside_the_plugin_is_reported_and_named_in_the_abort(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    emulator.held = True
    client = start_plugin().client
    eks = boto3.client("eks", region_name=REGION, endpoint_url=emulator.endpoint)
    outside = eks.update_nodegroup_version(
        clusterName="c2", nodegroupName="system", version=OLD, clientRequestToken="console"
    )["update"]
    with pytest.raises(PluginCallError) as err:
        client.upgrade_control_plane("r-1", cluster_id("c2"), NEW)
    named = f"{cluster_id('c2')}/nodegroups/system/updates/{outside['id']}"
    assert err.value.code == grpc.StatusCode.ABORTED
    assert err.value.metadata.get("operation_id") == named
    seen = client.get_operation(named)
    assert seen.kind == cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL and seen.node_pool == "system"
    assert emulator.cluster(REGION, "c2")["version"] == OLD
    # The inventory reports it as the cluster's current operation (not the plugin's: no
    # request_id), and preflight refuses for now: the caller drains nothing meanwhile.
    current = client.get_cluster(cluster_id("c2")).current_operation
    assert (current.id, current.state, current.request_id) == (named, RUNNING, "")
    listed = {c.id: c for c in client.list_clusters()}
    assert listed[cluster_id("c2")].current_operation.id == named
    assert not listed[cluster_id("c1")].HasField("current_operation")
    busy = client.preflight_upgrade(cluster_id("c2"), NEW, {})
    assert busy.verdict == cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER
    assert busy.reason_code == "CLUSTER_BUSY" and named in busy.message
    emulator.held = False
    assert wait_terminal(client, named).state == SUCCEEDED
    assert not client.get_cluster(cluster_id("c2")).HasField("current_operation")


@pytest.mark.parametrize(
    ("status", "code"), [("Failed", "UPGRADE_FAILED"), ("Cancelled", "CANCELLED")]
)
def test_a_failed_or_cancelled_update_fails_the_operation_with_eks_error(
    emulator: EksEmulator, start_plugin: StartPlugin, status: str, code: str
) -> None:
    emulator.fail_next_update(REGION, "c3", nodegroup="workers", status=status)
    client = start_plugin().client
    client.upgrade_control_plane("r-cp", cluster_id("c3"), NEW)
    wait_terminal(client, client.upgrade_control_plane("r-cp", cluster_id("c3"), NEW).id)
    op = client.upgrade_node_pool("r-np", cluster_id("c3"), "workers", NEW)
    done = wait_terminal(client, op.id)
    assert done.state == FAILED and done.error_code == code
    assert (
        "PodEvictionFailure" in done.error_message and op.id.rsplit("/", 1)[1] in done.error_message
    )
    assert emulator.cluster(REGION, "c3")["nodegroups"]["workers"] == OLD


def test_watch_delivers_the_end_of_an_update(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    with client.watch_operations(cluster_ids=[cluster_id("c4")]) as stream:
        op = client.upgrade_control_plane("r-w", cluster_id("c4"), NEW)
        states = []
        for seen in stream:
            assert seen.id == op.id
            states.append(seen.state)
            if seen.state in (SUCCEEDED, FAILED):
                break
    assert states[-1] == SUCCEEDED


def test_with_a_journal_operations_and_request_ids_survive_a_restart(
    emulator: EksEmulator, tmp_path: Path
) -> None:
    config = plugin_config(emulator, state_file=tmp_path / "ops.jsonl")
    with running_plugin(config) as first:
        assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in first.client.capabilities()
        noop = first.client.upgrade_node_pool("r-noop", cluster_id("c1"), "system", OLD)
        out = first.client.service_out("r-out", cluster_id("c1"))
        emulator.held = True
        op = first.client.upgrade_control_plane("r-cp", cluster_id("c1"), NEW)
        assert op.state == cluster_pb2.OPERATION_STATE_RUNNING
    with running_plugin(config) as second:
        emulator.held = False
        assert second.client.get_operation(noop.id).state == SUCCEEDED
        assert second.client.service_out("r-out", cluster_id("c1")).id == out.id
        assert not second.client.get_cluster(cluster_id("c1")).in_service
        # The update in flight is followed again from the journal.
        assert wait_terminal(second.client, op.id).state == SUCCEEDED
        assert second.client.upgrade_control_plane("r-cp", cluster_id("c1"), NEW).id == op.id
    assert len(emulator.cluster(REGION, "c1")["updates"]) == 1


def test_unknown_operations_are_not_found(start_plugin: StartPlugin) -> None:
    client = start_plugin().client
    for op_id in ("nope", f"{cluster_id('c1')}/updates/0000", f"{cluster_id('zz')}/updates/1"):
        with pytest.raises(PluginCallError) as err:
            client.get_operation(op_id)
        assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_a_v_prefixed_version_is_sent_as_eks_spells_it(
    emulator: EksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    assert client.preflight_upgrade(cluster_id("c2"), "v" + NEW, {}).verdict == (
        cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
    )
    op = client.upgrade_control_plane("r-v", cluster_id("c2"), "v" + NEW)
    assert op.target_version == "v" + NEW
    assert wait_terminal(client, op.id).state == SUCCEEDED
    assert emulator.requests("UpdateClusterVersion")[0]["version"] == NEW
    assert emulator.cluster(REGION, "c2")["version"] == NEW
