"""Conformance of mutating RPCs and operations: validation, idempotency, conflicts, watching."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginCallError, PluginClient, supports
from plugins.sdk.conformance.suite._kit import (
    IN_FLIGHT,
    TERMINAL,
    UNKNOWN_ID,
    Mutation,
    OperationRecorder,
    expect_error,
    new_request_id,
    require_rpc,
    wait_terminal,
)
from plugins.sdk.conformance.target import ConformanceTarget

_MUTATING = ("ServiceOut", "ServiceIn", "UpgradeControlPlane", "UpgradeNodePool")
_State = cluster_pb2.OperationState


@pytest.fixture(autouse=True)
def _needs_operations(capabilities: frozenset[int]) -> None:
    if not any(supports(capabilities, rpc) for rpc in _MUTATING):
        pytest.skip("no mutating capability is declared")


def _calls(
    client: PluginClient, cluster: cluster_pb2.Cluster
) -> dict[str, Callable[[str, str, str, str], cluster_pb2.Operation]]:
    """Each mutating RPC as f(request_id, cluster_id, node_pool, version)."""
    return {
        "ServiceOut": lambda rid, cid, _pool, _v: client.service_out(rid, cid),
        "ServiceIn": lambda rid, cid, _pool, _v: client.service_in(rid, cid),
        "UpgradeControlPlane": lambda rid, cid, _pool, v: client.upgrade_control_plane(rid, cid, v),
        "UpgradeNodePool": client.upgrade_node_pool,
    }


_FIELD_CASES = [
    ("ServiceOut", "request_id"),
    ("ServiceOut", "cluster_id"),
    ("ServiceIn", "request_id"),
    ("ServiceIn", "cluster_id"),
    ("UpgradeControlPlane", "request_id"),
    ("UpgradeControlPlane", "cluster_id"),
    ("UpgradeControlPlane", "version"),
    ("UpgradeNodePool", "request_id"),
    ("UpgradeNodePool", "cluster_id"),
    ("UpgradeNodePool", "node_pool"),
    ("UpgradeNodePool", "version"),
]


def _valid_args(rpc: str, cluster: cluster_pb2.Cluster) -> dict[str, str]:
    """A request that changes nothing (current versions) with every REQUIRED field set."""
    args = {
        "request_id": new_request_id(),
        "cluster_id": cluster.id,
        "node_pool": "",
        "version": "",
    }
    if rpc == "UpgradeControlPlane":
        args["version"] = cluster.control_plane_version
    if rpc == "UpgradeNodePool":
        if not cluster.node_pools:
            pytest.skip(f"cluster {cluster.id} has no node pools")
        args["node_pool"] = cluster.node_pools[0].name
        args["version"] = cluster.node_pools[0].version
    return args


@pytest.mark.parametrize(("rpc", "field"), _FIELD_CASES, ids=[f"{r}-{f}" for r, f in _FIELD_CASES])
def test_empty_required_field_is_invalid_argument_naming_it(
    client: PluginClient,
    capabilities: frozenset[int],
    cluster: cluster_pb2.Cluster,
    rpc: str,
    field: str,
) -> None:
    require_rpc(capabilities, rpc)
    args = _valid_args(rpc, cluster)
    args[field] = ""
    call = _calls(client, cluster)[rpc]
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: call(args["request_id"], args["cluster_id"], args["node_pool"], args["version"]),
        f"{rpc}({field}='')",
        names=field,
    )


@pytest.mark.parametrize("rpc", _MUTATING)
def test_unknown_cluster_is_not_found(
    client: PluginClient, capabilities: frozenset[int], cluster: cluster_pb2.Cluster, rpc: str
) -> None:
    require_rpc(capabilities, rpc)
    args = _valid_args(rpc, cluster)
    call = _calls(client, cluster)[rpc]
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: call(args["request_id"], UNKNOWN_ID, args["node_pool"], args["version"]),
        f"{rpc}(cluster_id={UNKNOWN_ID!r})",
    )


def test_get_operation_unknown_id_is_not_found(client: PluginClient) -> None:
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: client.get_operation(UNKNOWN_ID),
        f"GetOperation({UNKNOWN_ID!r})",
    )


def test_get_operation_empty_id_is_invalid_argument(client: PluginClient) -> None:
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: client.get_operation(""),
        "GetOperation(operation_id='')",
        names="operation_id",
    )


def _check_operation(
    op: cluster_pb2.Operation, mutation: Mutation, cluster_id: str, request_id: str
) -> None:
    assert op.id, f"{mutation.rpc}: the operation has an empty id"
    assert op.kind == mutation.kind, f"{mutation.rpc}: operation kind {op.kind}"
    assert op.cluster_id == cluster_id, f"{mutation.rpc}: operation for {op.cluster_id!r}"
    assert op.request_id == request_id, f"{mutation.rpc}: operation request_id {op.request_id!r}"
    assert op.state != cluster_pb2.OPERATION_STATE_UNSPECIFIED, f"{mutation.rpc}: state UNSPECIFIED"
    assert op.HasField("start_time"), f"{mutation.rpc}: operation {op.id} has no start_time"


def test_operation_is_idempotent_reaches_a_terminal_state_and_is_watched(
    client: PluginClient, cluster_id: str, mutation: Mutation, target: ConformanceTarget
) -> None:
    recorder = OperationRecorder(client, [cluster_id])
    try:
        request_id = new_request_id()
        first = mutation.start(request_id)
        _check_operation(first, mutation, cluster_id, request_id)
        if mutation.immediate:
            assert first.state == cluster_pb2.OPERATION_STATE_SUCCEEDED, (
                f"{mutation.rpc} has nothing to do on cluster {cluster_id}; the contract says "
                f"it answers SUCCEEDED at once, got {_State.Name(first.state)}"
            )
        repeat = mutation.start(request_id)
        assert repeat.id == first.id, (
            f"{mutation.rpc} with the same request_id started a second operation "
            f"({repeat.id} after {first.id})"
        )
        final = recorder.wait_for(
            lambda op: op.id == first.id and op.state in TERMINAL,
            target.timeout,
            f"the terminal state of operation {first.id}",
        )
        assert final.HasField("end_time"), f"terminal operation {final.id} has no end_time"
        if final.state == cluster_pb2.OPERATION_STATE_FAILED:
            assert final.error_code, f"FAILED operation {final.id} has no error_code"
            assert final.error_message, f"FAILED operation {final.id} has no error_message"
        others = sorted(
            {op.id for op in recorder.updates if op.cluster_id == cluster_id} - {first.id}
        )
        assert not others, (
            f"operations {others} appeared on {cluster_id}; only {first.id} was asked"
        )
        foreign = sorted({op.cluster_id for op in recorder.updates} - {cluster_id})
        assert not foreign, f"WatchOperations(cluster_ids=[{cluster_id}]) delivered {foreign}"
        fetched = client.get_operation(first.id)
        assert fetched.state == final.state, "GetOperation disagrees with WatchOperations"
        after = mutation.start(request_id)
        assert after.id == first.id, (
            f"{mutation.rpc} repeated after the end started {after.id}, not {first.id}"
        )
        assert after.state == final.state, "a repeated request changed a finished operation"
    finally:
        recorder.close()


def test_conflicting_request_is_aborted_naming_the_operation(
    client: PluginClient, cluster_id: str, mutation: Mutation, target: ConformanceTarget
) -> None:
    if mutation.immediate:
        pytest.skip(f"{mutation.rpc} on {cluster_id} has nothing to do, so no conflict can arise")
    first = mutation.start(new_request_id())
    if first.state not in IN_FLIGHT:
        pytest.skip(f"operation {first.id} finished at once; a conflict cannot be observed")
    try:
        second = mutation.start(new_request_id())
    except PluginCallError as exc:
        assert exc.code is grpc.StatusCode.ABORTED, (
            f"a new request_id during operation {first.id} answered {exc.code.name} "
            f"({exc.message!r}); expected ABORTED"
        )
        assert first.id in exc.message, (
            f"the ABORTED message {exc.message!r} does not name operation {first.id}"
        )
        assert exc.reason == "OPERATION_IN_FLIGHT", (
            f"the ABORTED answer's ErrorInfo reason is {exc.reason!r}; expected OPERATION_IN_FLIGHT"
        )
        assert exc.operation_id == first.id, (
            f"the ABORTED answer names operation {exc.operation_id!r} in its details, not "
            f"{first.id} (ErrorInfo metadata operation_id)"
        )
        wait_terminal(client, first.id, target.timeout)
        return
    now = client.get_operation(first.id)
    if now.state in IN_FLIGHT or second.id == first.id:
        pytest.fail(
            f"a new request_id on cluster {cluster_id} was accepted ({second.id}) while "
            f"operation {first.id} was {_State.Name(now.state)}; expected ABORTED"
        )
    pytest.skip(f"operation {first.id} finished before the conflicting request arrived")
