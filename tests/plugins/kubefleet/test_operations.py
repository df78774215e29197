"""Service-out / service-in operations survive a plugin restart: recorded on the MemberCluster
with their request ids, followed to their end by the next plugin process, never repeated."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.sdk.client import PluginCallError
from tests.plugins.kubefleet.conftest import StartPlugin
from tests.support.kube import wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator

TAINT = {
    "key": "fleetupgrade.io/out-of-service",
    "value": "fleet-orchestrator",
    "effect": "NoSchedule",
}
RECORDS = "fleetupgrade.io/operations"
SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED


def _member(emulator: KubeFleetEmulator, name: str) -> dict[str, object]:
    member = emulator.get("MemberCluster", name)
    assert member is not None
    return member


def _records(emulator: KubeFleetEmulator, name: str) -> list[dict[str, str]]:
    annotations = _member(emulator, name)["metadata"].get("annotations") or {}  # type: ignore[attr-defined]
    return list(json.loads(annotations.get(RECORDS, "[]")))


def _taints(emulator: KubeFleetEmulator, name: str) -> list[dict[str, str]]:
    return list((_member(emulator, name).get("spec") or {}).get("taints") or [])  # type: ignore[attr-defined]


def test_an_operation_and_its_request_id_survive_a_plugin_restart(
    emulator: KubeFleetEmulator, start_plugin: StartPlugin, names: Callable[[str], str]
) -> None:
    first = start_plugin()
    caps = first.client.capabilities()
    assert identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS in caps
    request_id = names("out")
    op = first.client.service_out(request_id, "member-2")
    # The taint and the record of its request id were written in one patch, before the reply.
    [record] = [r for r in _records(emulator, "member-2") if r["requestId"] == request_id]
    assert record["id"] == op.id and record["kind"] == "ServiceOut"
    assert TAINT in _taints(emulator, "member-2")
    first.plugin.stop(grace=0)  # the plugin goes away mid-operation

    second = start_plugin()
    found = second.client.get_operation(op.id)  # a new process knows the operation
    assert (found.id, found.request_id, found.cluster_id) == (op.id, request_id, "member-2")
    done = wait_for(
        "the operation followed to its end by the new process",
        lambda: (o := second.client.get_operation(op.id)).state == SUCCEEDED and o,
        timeout=30,
    )
    assert done.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT
    wait_for(
        "its end recorded on the MemberCluster",
        lambda: any(
            r["id"] == op.id and r["state"] == "Succeeded" for r in _records(emulator, "member-2")
        ),
        timeout=30,
    )
    # The same request id is the same operation: nothing is done twice.
    again = second.client.service_out(request_id, "member-2")
    assert again.id == op.id and again.state == SUCCEEDED
    assert _taints(emulator, "member-2").count(TAINT) == 1
    with pytest.raises(PluginCallError) as reused:
        second.client.service_in(request_id, "member-2")
    assert reused.value.code == grpc.StatusCode.INVALID_ARGUMENT

    back = second.client.service_in(names("in"), "member-2")
    wait_for(
        "service-in done",
        lambda: second.client.get_operation(back.id).state == SUCCEEDED,
        timeout=30,
    )
    assert TAINT not in _taints(emulator, "member-2")
    second.plugin.stop(grace=0)
    third = start_plugin()  # both operations, and their ends, are known after another restart
    assert third.client.get_operation(op.id).state == SUCCEEDED
    assert third.client.get_operation(back.id).state == SUCCEEDED
    emulator.patch("MemberCluster", "member-2", {"metadata": {"annotations": {RECORDS: None}}})
