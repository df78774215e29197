"""Upgrades as ARM long-running operations: what ARM ends with, one operation per request_id,
one per cluster, failures, node images, and operations that survive a plugin restart."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.aks.conftest import NAMES, StartPlugin
from tests.plugins.aks.support import NEW, OLD, cluster_id, launch_plugin, plugin_config
from tests.support.aks_emulator import AksEmulator, Fault
from tests.support.plugin_harness import wait_terminal, wait_until

SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
FAILED = cluster_pb2.OPERATION_STATE_FAILED
PUT_CLUSTER = "ManagedClusters.CreateOrUpdate"
PUT_POOL = "AgentPools.CreateOrUpdate"


def _versions(emulator: AksEmulator, name: str) -> tuple[str, dict[str, str]]:
    props = emulator.cluster(cluster_id(name))["properties"]
    pools = {p["name"]: p["currentOrchestratorVersion"] for p in props["agentPoolProfiles"]}
    return props["currentKubernetesVersion"], pools


def test_the_control_plane_upgrades_alone_and_the_operation_follows_arm(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    op = client.upgrade_control_plane("req-cp", cluster_id("c1"), NEW)
    assert op.state == cluster_pb2.OPERATION_STATE_RUNNING and op.target_version == NEW
    assert client.get_cluster(cluster_id("c1")).current_operation.id == op.id
    # The same request again: the same operation, no second PUT.
    assert client.upgrade_control_plane("req-cp", cluster_id("c1"), NEW).id == op.id
    # Another request while it runs: ABORTED naming it.
    with pytest.raises(PluginCallError) as raised:
        client.upgrade_node_pool("req-np", cluster_id("c1"), "user", OLD)
    assert raised.value.code == grpc.StatusCode.ABORTED
    assert raised.value.metadata["operation_id"] == op.id
    done = wait_terminal(client, op.id)
    assert done.state == SUCCEEDED and done.progress_percent == 100
    assert _versions(emulator, "c1") == (NEW, {"system": OLD, "user": OLD})
    assert emulator.calls(PUT_CLUSTER) == 1
    body = emulator.requests(PUT_CLUSTER)[0]
    assert body is not None and body["properties"]["kubernetesVersion"] == NEW
    assert {p["orchestratorVersion"] for p in body["properties"]["agentPoolProfiles"]} == {OLD}


def test_node_pools_upgrade_after_the_control_plane(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    wait_terminal(client, client.upgrade_control_plane("cp", cluster_id("c2"), NEW).id)
    for pool in ("system", "user"):
        op = client.upgrade_node_pool(f"np-{pool}", cluster_id("c2"), pool, NEW)
        assert wait_terminal(client, op.id).state == SUCCEEDED
    assert _versions(emulator, "c2") == (NEW, {"system": NEW, "user": NEW})
    assert emulator.calls(PUT_POOL) == 2
    pools = client.get_cluster(cluster_id("c2")).node_pools
    assert {(p.name, p.version) for p in pools} == {("system", NEW), ("user", NEW)}


def test_a_target_already_reached_succeeds_at_once_and_calls_nothing(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    op = client.upgrade_control_plane("same", cluster_id("c3"), OLD)
    assert op.state == SUCCEEDED
    op = client.upgrade_node_pool("same-pool", cluster_id("c3"), "user", OLD)
    assert op.state == SUCCEEDED
    assert emulator.calls(PUT_CLUSTER) == 0 and emulator.calls(PUT_POOL) == 0
    assert emulator.calls("AgentPools.UpgradeNodeImageVersion") == 0


def test_node_image_upgrades_when_the_pool_is_at_the_version_and_the_option_is_on(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin(upgrades={"nodeImageWhenCurrent": True}).client
    op = client.upgrade_node_pool("image", cluster_id("c4"), "user", OLD)
    assert op.state == cluster_pb2.OPERATION_STATE_RUNNING
    assert wait_terminal(client, op.id).state == SUCCEEDED
    pool = next(
        p
        for p in emulator.cluster(cluster_id("c4"))["properties"]["agentPoolProfiles"]
        if p["name"] == "user"
    )
    assert pool["nodeImageVersion"] == emulator.state.latest_node_image
    assert pool["currentOrchestratorVersion"] == OLD
    # The image is now the latest: the same ask has nothing to do.
    again = client.upgrade_node_pool("image-again", cluster_id("c4"), "user", OLD)
    assert again.state == SUCCEEDED
    assert emulator.calls("AgentPools.UpgradeNodeImageVersion") == 1


def test_a_failed_arm_operation_fails_the_contract_operation_without_arm_words(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.fail_next(cluster_id("c1"), Fault(code="UpgradeFailed", message="secret-ish words"))
    op = wait_terminal(client, client.upgrade_control_plane("fail", cluster_id("c1"), NEW).id)
    assert op.state == FAILED
    assert op.error_code == "UpgradeFailed"
    assert "secret-ish" not in op.error_message
    cluster = client.get_cluster(cluster_id("c1"))
    assert not cluster.available and cluster.control_plane_version == OLD
    # A person retries: a new request_id upgrades the failed cluster.
    retried = client.upgrade_control_plane("fail-retry", cluster_id("c1"), NEW)
    assert wait_terminal(client, retried.id).state == SUCCEEDED
    assert _versions(emulator, "c1")[0] == NEW


def test_throttling_while_polling_does_not_fail_the_operation(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    op = client.upgrade_control_plane("throttled", cluster_id("c2"), NEW)
    emulator.throttle(2, retry_after=0)
    emulator.transient(1)
    assert wait_terminal(client, op.id).state == SUCCEEDED
    assert _versions(emulator, "c2")[0] == NEW


def test_operations_survive_a_restart_and_are_not_started_twice(
    emulator: AksEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "aks-ops.jsonl"
    emulator.state.op_seconds = 2.0
    config = plugin_config(emulator, NAMES, state_file=state)
    first = launch_plugin(emulator, config)
    try:
        op = first.client.upgrade_control_plane("durable", cluster_id("c1"), NEW)
    finally:
        first.stop()
    arm_map = json.loads(Path(f"{state}.arm.json").read_text())
    assert list(arm_map["operations"]) == [op.id]
    assert emulator.token not in Path(f"{state}.arm.json").read_text()
    assert emulator.token not in state.read_text()
    second = launch_plugin(emulator, config)
    try:
        again = second.client.upgrade_control_plane("durable", cluster_id("c1"), NEW)
        assert again.id == op.id
        assert second.client.get_operation(op.id).request_id == "durable"
        assert wait_terminal(second.client, op.id).state == SUCCEEDED
        assert emulator.calls(PUT_CLUSTER) == 1
        assert _versions(emulator, "c1")[0] == NEW
        wait_until(lambda: not json.loads(Path(f"{state}.arm.json").read_text())["operations"])
    finally:
        second.stop()


def test_an_operation_whose_arm_token_was_lost_is_followed_by_its_resource(
    emulator: AksEmulator, tmp_path: Path
) -> None:
    state = tmp_path / "aks-ops.jsonl"
    emulator.state.op_seconds = 1.0
    config = plugin_config(emulator, NAMES, state_file=state)
    first = launch_plugin(emulator, config)
    try:
        op = first.client.upgrade_node_pool("lost", cluster_id("c3"), "user", OLD)
        assert op.state == SUCCEEDED  # nothing to do: no ARM operation
        op = first.client.upgrade_control_plane("lost-cp", cluster_id("c3"), NEW)
    finally:
        first.stop()
    Path(f"{state}.arm.json").unlink()  # as if the plugin died before writing it
    second = launch_plugin(emulator, config)
    try:
        assert wait_terminal(second.client, op.id).state == SUCCEEDED
        assert emulator.calls(PUT_CLUSTER) == 1
    finally:
        second.stop()


def test_losing_the_token_while_polling_does_not_fail_the_operation(
    emulator: AksEmulator, start_plugin: StartPlugin
) -> None:
    client = start_plugin().client
    emulator.state.op_seconds = 1.0
    op = client.upgrade_control_plane("no-token", cluster_id("c3"), NEW)
    token, emulator.server.token = emulator.server.token, "revoked"  # ARM answers 401 a while
    wait_until(lambda: emulator.server.unauthorized >= 2, what="polls answered 401")
    emulator.server.token = token
    assert wait_terminal(client, op.id).state == SUCCEEDED
    assert _versions(emulator, "c3")[0] == NEW
    assert emulator.calls(PUT_CLUSTER) == 1
