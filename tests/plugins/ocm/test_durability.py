"""Operations survive a plugin restart: the ledger on each ManagedCluster, read back at start."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.ocm.ledger import ANNOTATION_OPERATIONS, LEDGER_SIZE
from plugins.sdk.client import PluginCallError
from tests.plugins.ocm.conftest import (
    NEW,
    OLD,
    RunningPlugin,
    StartPlugin,
    curator_config,
    failed_curation,
)
from tests.support.ocm_emulator import OcmEmulator

RUNNING, SUCCEEDED, FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)
OUT, IN, UPGRADE = (
    cluster_pb2.OPERATION_KIND_SERVICE_OUT,
    cluster_pb2.OPERATION_KIND_SERVICE_IN,
    cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE,
)


def _restart(old: RunningPlugin, start_plugin: StartPlugin) -> RunningPlugin:
    old.client.close()
    old.plugin.stop(grace=0)
    return start_plugin(curator_config())


def test_operations_and_their_request_ids_survive_a_restart(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    first = start_plugin(curator_config())
    caps = first.client.capabilities()
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in caps
    out = first.client.service_out("out-1", name)
    # Restarted mid-operation: before this plugin saw its service-out end.
    second = _restart(first, start_plugin)
    again = second.client.service_out("out-1", name)
    assert again.id == out.id and again.kind == OUT and again.request_id == "out-1"
    assert second.end(out.id).state == SUCCEEDED
    back = second.end(second.client.service_in("in-1", name).id)
    assert back.state == SUCCEEDED
    up = second.client.upgrade_control_plane("up-1", name, NEW)
    assert second.end(up.id).state == SUCCEEDED

    third = _restart(second, start_plugin)
    found = {op_id: third.client.get_operation(op_id) for op_id in (out.id, back.id, up.id)}
    assert [(o.kind, o.state, o.request_id) for o in found.values()] == [
        (OUT, SUCCEEDED, "out-1"),
        (IN, SUCCEEDED, "in-1"),
        (UPGRADE, SUCCEEDED, "up-1"),
    ]
    assert found[up.id].target_version == NEW
    # A repeat of an old request answers its operation and changes nothing: the cluster,
    # serviced in since, is not taken out again, and no second curation starts.
    repeat = third.client.service_out("out-1", name)
    assert repeat.id == out.id and repeat.state == SUCCEEDED
    assert third.client.get_cluster(name).in_service
    assert emulator.taints_of(name) == []
    assert third.client.upgrade_control_plane("up-1", name, NEW).id == up.id
    assert emulator.curations_started == {name: 1}
    # What the hub holds: one record per request, newest last.
    notes = emulator.managed_cluster(name)["metadata"]["annotations"]
    ledger = json.loads(notes[ANNOTATION_OPERATIONS])
    assert [(r["requestId"], r["kind"], r["state"]) for r in ledger] == [
        ("out-1", "ServiceOut", "Succeeded"),  # written with the taint change itself
        ("in-1", "ServiceIn", "Succeeded"),
        ("up-1", "UpgradeControlPlane", "Succeeded"),
    ]


def test_a_failed_upgrade_is_remembered_with_its_error_and_the_ledger_stays_bounded(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    first, failed = failed_curation(emulator, start_plugin, name, "up-1")
    flips: list[str] = []
    for index in range(LEDGER_SIZE + 2):
        kind = first.client.service_out if index % 2 == 0 else first.client.service_in
        flip = first.end(kind(f"flip-{index}", name).id)
        assert flip.state == SUCCEEDED
        flips.append(flip.id)
    newest = f"flip-{LEDGER_SIZE + 1}"  # an odd index: a service-in
    second = _restart(first, start_plugin)
    repeat = second.client.service_in(newest, name)
    assert (repeat.request_id, repeat.kind, repeat.state) == (newest, IN, SUCCEEDED)
    # The oldest records made room (LEDGER_SIZE per cluster): flip-0 is forgotten; the failed
    # upgrade, out of the ledger too, is still known from the curator's annotations.
    with pytest.raises(PluginCallError) as err:
        second.client.get_operation(flips[0])
    assert err.value.code is grpc.StatusCode.NOT_FOUND
    remembered = second.end(failed.id)
    assert (remembered.state, remembered.error_code) == (FAILED, "CURATION_FAILED")
    ledger = json.loads(
        emulator.managed_cluster(name)["metadata"]["annotations"][ANNOTATION_OPERATIONS]
    )
    assert len(ledger) == LEDGER_SIZE
    assert ledger[-1]["requestId"] == newest


def test_an_upgrade_running_across_a_restart_is_followed_to_its_end(
    emulator: OcmEmulator, start_plugin: StartPlugin, names: Callable[[int], list[str]]
) -> None:
    [name] = names(1)
    emulator.upgrade_seconds = 2.5
    emulator.add_cluster(name, OLD)
    emulator.fail_next_curation(name, "Timed out waiting for monitor upgrade job")
    first = start_plugin(curator_config())
    op = first.client.upgrade_control_plane("up-1", name, NEW)
    second = _restart(first, start_plugin)
    assert second.client.get_operation(op.id).state == RUNNING
    final = second.end(op.id)
    assert final.state == FAILED and final.error_code == "CURATION_FAILED"
    third = _restart(second, start_plugin)
    remembered = third.client.get_operation(op.id)
    assert (remembered.state, remembered.error_code) == (FAILED, "CURATION_FAILED")
    assert "Timed out waiting for monitor upgrade job" in remembered.error_message
