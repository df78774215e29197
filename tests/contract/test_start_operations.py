"""StartOperations (the SDK's ClusterServicer, over real gRPC): each item is answered as its
own RPC answers it (the same operation, the same error: code, words, reason, retryability,
the in-flight operation's id), in order, one item's error keeping to it; a plugin without it
answers UNIMPLEMENTED once and the caller makes the single RPCs instead."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from orchestrator.engine.decide import Call
from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.driver import CallError
from plugins.sdk import errors
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.server import PluginServicers
from plugins.sdk.servicers import MAX_OPERATION_ITEMS, ClusterServicer
from plugins.sim import SimOptions
from tests.contract.conftest import StartServer, grpc_provider

Cap = identity_pb2.PluginCapability


@pytest.fixture
def sim_options() -> SimOptions:
    return SimOptions(generate=4, step_seconds=30, seed=5, registry=CollectorRegistry())


def _single(client: PluginClient, kind: str, *args: str) -> cluster_pb2.Operation | PluginCallError:
    """The item's own RPC, blocking: its Operation or its error."""
    calls = {
        "service_out": client.service_out,
        "service_in": client.service_in,
        "upgrade_control_plane": client.upgrade_control_plane,
        "upgrade_node_pool": client.upgrade_node_pool,
    }
    try:
        return calls[kind](*args)  # type: ignore[operator]
    except PluginCallError as err:
        return err


def _batch(
    client: PluginClient, items: list[cluster_pb2.OperationRequest]
) -> list[cluster_pb2.Operation | PluginCallError]:
    pending = client.start_operations(items)
    assert pending is not None, "the SDK's ClusterServicer offers StartOperations"
    return pending.results()


def _same_error(a: PluginCallError, b: PluginCallError) -> None:
    assert (a.rpc, a.code, a.message, a.reason, a.domain, a.metadata) == (
        b.rpc,
        b.code,
        b.message,
        b.reason,
        b.domain,
        b.metadata,
    )
    assert (a.retryable, a.retry_after, a.operation_id) == (
        b.retryable,
        b.retry_after,
        b.operation_id,
    )


def test_each_item_answers_as_its_own_rpc_in_order(client: PluginClient) -> None:
    c1, c2, c3, c4 = sorted(c.id for c in client.list_clusters())
    third = client.get_cluster(c3)
    pool, cp = third.node_pools[0].name, third.control_plane_version
    busy = client.service_out("busy-1", c1)  # c1 now runs an operation (steps of 30 s)
    cases: list[tuple[str, tuple[str, ...]]] = [
        ("service_out", ("busy-2", c1)),  # ABORTED: c1's operation is in flight
        ("service_out", ("busy-1", c1)),  # the same request id: the same operation
        ("service_in", ("", c2)),  # INVALID_ARGUMENT: no request id
        ("upgrade_control_plane", ("cp-1", "no-such-cluster", "1.30.1")),  # NOT_FOUND
        ("upgrade_control_plane", ("cp-2", c2, "not-a-version")),  # INVALID_ARGUMENT
        ("upgrade_node_pool", ("np-1", c3, "", "1.30.1")),  # INVALID_ARGUMENT: no pool
        ("upgrade_node_pool", ("np-2", c3, pool, cp)),  # starts (or is done)
    ]
    items = [
        client.operation_request(
            kind,
            *args[:2],
            version=args[-1] if kind.startswith("upgrade") else "",
            node_pool=args[2] if kind == "upgrade_node_pool" else "",
        )
        for kind, args in cases
    ]
    batched = _batch(client, items)
    assert len(batched) == len(cases)
    # The same requests again, one RPC each (every one is idempotent or refused alike): the
    # batch's answers are theirs, item by item.
    singles = [_single(client, kind, *args) for kind, args in cases]
    for (kind, _), got, want in zip(cases, batched, singles, strict=True):
        if isinstance(want, PluginCallError):
            assert isinstance(got, PluginCallError), (kind, got)
            _same_error(got, want)
        else:
            assert isinstance(got, cluster_pb2.Operation), (kind, got)
            assert (got.id, got.cluster_id, got.request_id) == (
                want.id,
                want.cluster_id,
                want.request_id,
            )
    assert isinstance(batched[0], PluginCallError)
    assert batched[0].code is grpc.StatusCode.ABORTED
    assert batched[0].operation_id == busy.id  # the in-flight operation, as the RPC says
    assert isinstance(batched[1], cluster_pb2.Operation) and batched[1].id == busy.id
    codes = [b.code for b in batched[2:6] if isinstance(b, PluginCallError)]
    assert codes == [
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
    ]
    assert isinstance(batched[6], cluster_pb2.Operation)
    assert c4 not in {b.cluster_id for b in batched if isinstance(b, cluster_pb2.Operation)}


def test_a_whole_request_out_of_bounds_is_refused(client: PluginClient) -> None:
    for count in (0, MAX_OPERATION_ITEMS + 1):
        items = [client.operation_request("service_out", f"r{i}", "c") for i in range(count)]
        pending = client.start_operations(items)
        assert pending is not None
        answers = pending.results()
        assert len(answers) == count
        if count:
            assert all(
                isinstance(a, PluginCallError) and a.code is grpc.StatusCode.INVALID_ARGUMENT
                for a in answers
            )
            assert isinstance(answers[0], PluginCallError)
            assert "split the batch" in answers[0].message


class _Backend:
    """Starts every service-out; a control-plane upgrade of cluster "crash" raises."""

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        return cluster_pb2.Operation(id=f"op-{request_id}", cluster_id=cluster_id)

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        if cluster_id == "crash":
            raise RuntimeError("secret-token-123 leaked")
        raise errors.Unavailable("provider API unreachable", retry_after=7)


def test_items_outside_the_capabilities_and_crashes_keep_to_their_item(
    start_server: StartServer, registry: CollectorRegistry
) -> None:
    identity = StaticIdentity(
        "narrow",
        "1.0.0",
        [Cap.PLUGIN_CAPABILITY_CLUSTER_SERVICE, Cap.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE],
    )
    server = start_server(
        PluginServicers(identity=identity, cluster=ClusterServicer(_Backend()))  # type: ignore[arg-type]
    )
    with PluginClient(server.address) as client:
        items = [
            client.operation_request("service_out", "r1", "a"),
            client.operation_request("upgrade_node_pool", "r2", "a", "1.30.1", "pool"),
            client.operation_request("upgrade_control_plane", "r3", "crash", "1.30.1"),
            client.operation_request("service_out", "r4", "b"),
        ]
        out = _batch(client, items)
        with pytest.raises(PluginCallError) as refused:
            client.upgrade_node_pool("r2", "a", "pool", "1.30.1")
    assert isinstance(out[0], cluster_pb2.Operation) and out[0].id == "op-r1"
    assert isinstance(out[1], PluginCallError)
    _same_error(out[1], refused.value)  # UNIMPLEMENTED, as the RPC itself answers
    assert out[1].code is grpc.StatusCode.UNIMPLEMENTED
    assert isinstance(out[2], PluginCallError) and out[2].code is grpc.StatusCode.INTERNAL
    assert "secret-token" not in out[2].message  # the exception's words stay in the log
    assert isinstance(out[3], cluster_pb2.Operation) and out[3].id == "op-r4"

    # The plugin counts each item as its own RPC (its counts per RPC are the same batched or
    # not), and the batch once.
    def count(method: str, code: str) -> float | None:
        labels = {"plugin": "test", "method": f"ClusterService/{method}", "code": code}
        return registry.get_sample_value("fleet_plugin_rpc_total", labels)

    assert count("ServiceOut", "OK") == 2
    assert count("UpgradeNodePool", "UNIMPLEMENTED") == 2  # the item's, then the RPC's
    assert count("UpgradeControlPlane", "INTERNAL") == 1
    assert count("StartOperations", "OK") == 1


def test_an_error_with_retry_info_keeps_it(start_server: StartServer) -> None:
    identity = StaticIdentity("p", "1.0.0", [Cap.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE])
    server = start_server(
        PluginServicers(identity=identity, cluster=ClusterServicer(_Backend()))  # type: ignore[arg-type]
    )
    with PluginClient(server.address) as client:
        (got,) = _batch(
            client, [client.operation_request("upgrade_control_plane", "r", "x", "1.3")]
        )
        with pytest.raises(PluginCallError) as single:
            client.upgrade_control_plane("r", "x", "1.3")
    assert isinstance(got, PluginCallError)
    _same_error(got, single.value)
    assert got.code is grpc.StatusCode.UNAVAILABLE and got.retry_after == 7.0


def test_the_adapter_tracks_each_operation_and_raises_each_error(client: PluginClient) -> None:
    c1, c2, *_ = sorted(c.id for c in client.list_clusters())
    provider = grpc_provider(client)
    calls = [
        Call(OpKind.SERVICE_OUT, c1, "run:a", "u1"),
        Call(OpKind.SERVICE_OUT, "no-such-cluster", "run:b", "u2"),
        Call(OpKind.SERVICE_OUT, c2, "run:c", "u3"),
    ]
    answers = provider.start_calls(calls)
    assert answers is not None and len(answers) == 3
    first = answers[0]()
    with pytest.raises(CallError) as missing:
        answers[1]()
    third = answers[2]()
    assert missing.value.code == "NOT_FOUND"
    assert (first.cluster_id, third.cluster_id) == (c1, c2)
    known = provider.tracker.by_request()
    assert known["run:a"].id == first.id and known["run:c"].id == third.id


def test_a_plugin_without_it_is_asked_once_then_the_single_rpcs_are_made(
    echo_client: PluginClient,
) -> None:
    client = echo_client
    provider = grpc_provider(client)
    cid = sorted(c.id for c in client.list_clusters())[0]
    call = Call(OpKind.SERVICE_OUT, cid, "run:a", "u1")
    assert provider.start_calls([call]) is None  # UNIMPLEMENTED: nothing started
    assert not client.batches()
    assert provider.start_calls([call]) is None  # not asked again
    assert "run:a" not in provider.tracker.by_request()
    op = provider.start_call(call)()  # the single RPC still works
    assert op.cluster_id == cid
