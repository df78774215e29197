"""Conformance of GateService: listing and ResolveGate's errors."""

from __future__ import annotations

import grpc

from fleetupgrade.plugin.v1 import gate_pb2
from plugins.sdk.client import PluginClient
from plugins.sdk.conformance.suite._kit import UNKNOWN_ID, expect_error, require_rpc


def test_list_gates_answers_well_formed_gates_pending_first(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "ListGates")
    gates = client.list_gates()
    for gate in gates:
        assert gate.id, "a gate has an empty id"
        assert gate.state != gate_pb2.GATE_STATE_UNSPECIFIED, f"gate {gate.id}: state UNSPECIFIED"
    pending = [g.state == gate_pb2.GATE_STATE_PENDING for g in gates]
    assert pending == sorted(pending, reverse=True), "ListGates must list pending gates first"


def test_resolve_gate_empty_id_is_invalid_argument(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "ResolveGate")
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.resolve_gate("", gate_pb2.GATE_DECISION_APPROVE, "conformance check"),
        "ResolveGate(gate_id='')",
        names="gate_id",
    )


def test_resolve_gate_unknown_id_is_not_found(
    client: PluginClient, capabilities: frozenset[int]
) -> None:
    require_rpc(capabilities, "ResolveGate")
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: client.resolve_gate(UNKNOWN_ID, gate_pb2.GATE_DECISION_REJECT, "conformance check"),
        f"ResolveGate({UNKNOWN_ID!r})",
    )
