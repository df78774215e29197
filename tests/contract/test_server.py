"""The SDK server: health, reflection, error mapping, logging, metrics and graceful stop."""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Iterator

import grpc
import grpc_health.v1.health_pb2 as hc_pb2
import grpc_health.v1.health_pb2_grpc as hc_pb2_grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.sdk import errors
from plugins.sdk.interceptors import JsonFormatter
from plugins.sdk.server import (
    CLUSTER_SERVICE,
    GATE_SERVICE,
    HEALTH_SERVICE,
    IDENTITY_SERVICE,
    PluginServicers,
    ServerTLS,
    add_server_args,
    serve,
    server_tls_from_args,
)
from tests.contract.conftest import StartServer
from tests.support.echo_plugin import EchoGate, EchoIdentity, echo_servicers

SECRET = "s3cr3t-token-value"


class _Raising(cluster_pb2_grpc.ClusterServiceServicer):
    """Raises whatever exception the request's cluster_id names."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        kind = request.cluster_id
        if kind == "slow":
            self.entered.set()
            self.release.wait(10)
            return cluster_pb2.GetClusterResponse(cluster=cluster_pb2.Cluster(id="slow"))
        if kind == "boom":
            raise RuntimeError(f"database password {SECRET} rejected")
        if kind == "abort":
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "servicer aborted itself")
        if kind == "invalid":
            raise errors.InvalidArgument("cluster_id", "must not be 'invalid'")
        if kind == "conflict":
            raise errors.Conflict("cluster busy with op-7", "op-7")
        error_class = getattr(errors, kind)
        raise error_class(f"{kind} raised")

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        yield cluster_pb2.WatchOperationsResponse(operation=cluster_pb2.Operation(id="op-1"))
        raise errors.Unavailable("provider went away")


@pytest.fixture
def raising(start_server: StartServer) -> tuple[_Raising, grpc.Channel]:
    servicer = _Raising()
    server = start_server(PluginServicers(identity=EchoIdentity(), cluster=servicer))
    channel = grpc.insecure_channel(server.address)
    yield servicer, channel
    servicer.release.set()
    channel.close()


def _get_cluster_error(channel: grpc.Channel, cluster_id: str) -> grpc.RpcError:
    stub = cluster_pb2_grpc.ClusterServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetCluster(cluster_pb2.GetClusterRequest(cluster_id=cluster_id), timeout=5)
    return info.value


@pytest.mark.parametrize(
    ("error_class", "code"),
    [
        ("NotFound", grpc.StatusCode.NOT_FOUND),
        ("AlreadyExists", grpc.StatusCode.ALREADY_EXISTS),
        ("FailedPrecondition", grpc.StatusCode.FAILED_PRECONDITION),
        ("Unavailable", grpc.StatusCode.UNAVAILABLE),
        ("Unimplemented", grpc.StatusCode.UNIMPLEMENTED),
        ("PluginError", grpc.StatusCode.INTERNAL),
    ],
)
def test_plugin_errors_become_their_status_code_and_message(
    raising: tuple[_Raising, grpc.Channel], error_class: str, code: grpc.StatusCode
) -> None:
    error = _get_cluster_error(raising[1], error_class)
    assert error.code() is code
    assert error.details() == f"{error_class} raised"


def test_invalid_argument_names_the_field(raising: tuple[_Raising, grpc.Channel]) -> None:
    error = _get_cluster_error(raising[1], "invalid")
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "cluster_id: must not be 'invalid'"


def test_conflict_is_aborted_and_carries_the_operation_id(
    raising: tuple[_Raising, grpc.Channel],
) -> None:
    error = _get_cluster_error(raising[1], "conflict")
    assert error.code() is grpc.StatusCode.ABORTED
    assert ("x-fleetupgrade-operation-id", "op-7") in [
        (m.key, m.value) for m in error.trailing_metadata()
    ]


def test_unexpected_exception_is_internal_without_its_text(
    raising: tuple[_Raising, grpc.Channel],
) -> None:
    error = _get_cluster_error(raising[1], "boom")
    assert error.code() is grpc.StatusCode.INTERNAL
    assert SECRET not in (error.details() or "")
    assert "plugin's log" in (error.details() or "")


def test_a_servicer_that_aborts_itself_keeps_its_code(
    raising: tuple[_Raising, grpc.Channel],
) -> None:
    error = _get_cluster_error(raising[1], "abort")
    assert error.code() is grpc.StatusCode.PERMISSION_DENIED
    assert error.details() == "servicer aborted itself"


def test_an_rpc_the_servicer_does_not_override_is_unimplemented(
    raising: tuple[_Raising, grpc.Channel],
) -> None:
    stub = cluster_pb2_grpc.ClusterServiceStub(raising[1])
    with pytest.raises(grpc.RpcError) as info:
        stub.ServiceOut(cluster_pb2.ServiceOutRequest(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_an_unregistered_service_is_unimplemented(start_server: StartServer) -> None:
    server = start_server(PluginServicers(identity=EchoIdentity()))
    with grpc.insecure_channel(server.address) as channel:
        stub = gate_pb2_grpc.GateServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ListGates(gate_pb2.ListGatesRequest(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_a_stream_error_after_items_keeps_the_items_and_the_code(
    raising: tuple[_Raising, grpc.Channel],
) -> None:
    stub = cluster_pb2_grpc.ClusterServiceStub(raising[1])
    received = []
    with pytest.raises(grpc.RpcError) as info:
        for item in stub.WatchOperations(cluster_pb2.WatchOperationsRequest(), timeout=5):
            received.append(item.operation.id)
    assert received == ["op-1"]
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "provider went away"


def test_health_is_serving_for_the_server_and_each_service(start_server: StartServer) -> None:
    server = start_server(echo_servicers())
    with grpc.insecure_channel(server.address) as channel:
        stub = hc_pb2_grpc.HealthStub(channel)
        for name in ["", IDENTITY_SERVICE, CLUSTER_SERVICE, HEALTH_SERVICE, GATE_SERVICE]:
            status = stub.Check(hc_pb2.HealthCheckRequest(service=name), timeout=5).status
            assert status == hc_pb2.HealthCheckResponse.SERVING, name


def test_health_does_not_know_services_that_are_not_offered(start_server: StartServer) -> None:
    server = start_server(PluginServicers(identity=EchoIdentity()))
    with grpc.insecure_channel(server.address) as channel:
        stub = hc_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(hc_pb2.HealthCheckRequest(service=GATE_SERVICE), timeout=5)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_offered_services(start_server: StartServer) -> None:
    server = start_server(PluginServicers(identity=EchoIdentity(), gate=EchoGate()))
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert services == {
            IDENTITY_SERVICE,
            GATE_SERVICE,
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        # The descriptors themselves are served, so tools such as grpcurl can call the RPCs.
        file = database.FindFileContainingSymbol(GATE_SERVICE)
        assert file.package == "fleetupgrade.plugin.v1"
        methods = {m.name for s in file.service for m in s.method}
        assert methods == {"ListGates", "WatchGates", "ResolveGate"}


def test_stop_reports_not_serving_and_lets_in_flight_calls_finish(
    start_server: StartServer,
) -> None:
    servicer = _Raising()
    server = start_server(PluginServicers(identity=EchoIdentity(), cluster=servicer))
    channel = grpc.insecure_channel(server.address)
    health_stream = hc_pb2_grpc.HealthStub(channel).Watch(hc_pb2.HealthCheckRequest(service=""))
    statuses = iter(health_stream)
    assert next(statuses).status == hc_pb2.HealthCheckResponse.SERVING
    slow = cluster_pb2_grpc.ClusterServiceStub(channel).GetCluster.future(
        cluster_pb2.GetClusterRequest(cluster_id="slow"), timeout=10
    )
    assert servicer.entered.wait(5), "the slow call did not reach the servicer"
    stopper = threading.Thread(target=server.stop, kwargs={"grace": 10.0})
    stopper.start()
    assert next(statuses).status == hc_pb2.HealthCheckResponse.NOT_SERVING
    health_stream.cancel()  # streams left open would hold the stop for the whole grace
    servicer.release.set()
    assert slow.result(timeout=10).cluster.id == "slow"
    stopper.join(timeout=10)
    assert not stopper.is_alive()
    assert server.stopped
    channel.close()


def test_rpcs_are_counted_per_method_and_code(
    start_server: StartServer, registry: CollectorRegistry
) -> None:
    server = start_server(echo_servicers(), plugin_name="echo")
    with grpc.insecure_channel(server.address) as channel:
        identity = identity_pb2_grpc.IdentityServiceStub(channel)
        for _ in range(3):
            identity.GetPluginInfo(identity_pb2.GetPluginInfoRequest(), timeout=5)
        with pytest.raises(grpc.RpcError):
            cluster_pb2_grpc.ClusterServiceStub(channel).GetCluster(
                cluster_pb2.GetClusterRequest(cluster_id="nope"), timeout=5
            )
    labels = {"plugin": "echo", "method": "IdentityService/GetPluginInfo", "code": "OK"}
    assert registry.get_sample_value("fleet_plugin_rpc_total", labels) == 3
    not_found = {"plugin": "echo", "method": "ClusterService/GetCluster", "code": "NOT_FOUND"}
    assert registry.get_sample_value("fleet_plugin_rpc_total", not_found) == 1
    count = registry.get_sample_value(
        "fleet_plugin_rpc_duration_seconds_count",
        {"plugin": "echo", "method": "IdentityService/GetPluginInfo"},
    )
    assert count == 3


def test_serving_many_times_in_one_process_reuses_the_metrics(registry: CollectorRegistry) -> None:
    servers = [
        serve("127.0.0.1:0", echo_servicers(), registry=registry, plugin_name=f"p{i}")
        for i in range(3)
    ]
    default_registry_servers = [serve("127.0.0.1:0", echo_servicers()) for _ in range(2)]
    try:
        assert len({s.port for s in servers + default_registry_servers}) == 5
    finally:
        for server in servers + default_registry_servers:
            server.stop(0)


def test_each_rpc_is_logged_with_method_code_caller_but_never_the_request(
    start_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_server(echo_servicers(), plugin_name="echo")
    caplog.set_level(logging.DEBUG, logger="plugins.sdk.rpc")
    with grpc.insecure_channel(server.address) as channel:
        stub = gate_pb2_grpc.GateServiceStub(channel)
        with pytest.raises(grpc.RpcError):
            stub.ResolveGate(
                gate_pb2.ResolveGateRequest(
                    gate_id="g-1", decision=gate_pb2.GATE_DECISION_APPROVE, reason=SECRET
                ),
                metadata=(("x-fleetupgrade-caller", "orchestrator-0"),),
                timeout=5,
            )
    records = [r for r in caplog.records if r.name == "plugins.sdk.rpc"]
    assert len(records) == 1
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["method"] == "GateService/ResolveGate"
    assert line["code"] == "NOT_FOUND"
    assert line["caller"] == "orchestrator-0"
    assert line["plugin"] == "echo"
    assert line["duration_ms"] >= 0
    assert line["level"] == "info"
    assert SECRET not in JsonFormatter().format(records[0])


def test_server_flags_build_tls_settings() -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    plain = parser.parse_args([])
    assert plain.listen == "127.0.0.1:50051"
    assert server_tls_from_args(plain) is None
    mtls = parser.parse_args(
        ["--tls-cert", "s.crt", "--tls-key", "s.key", "--tls-client-ca", "ca.crt", "--debug"]
    )
    assert server_tls_from_args(mtls) == ServerTLS("s.crt", "s.key", "ca.crt")
    assert mtls.debug is True


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tls-cert", "s.crt"], "--tls-key"),
        (["--tls-key", "s.key"], "--tls-cert"),
        (["--tls-client-ca", "ca.crt"], "--tls-client-ca"),
    ],
)
def test_incomplete_tls_flags_name_the_missing_flag(flags: list[str], named: str) -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    with pytest.raises(ValueError, match=named):
        server_tls_from_args(parser.parse_args(flags))


def test_unreadable_certificate_file_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--tls-cert"):
        serve(
            "127.0.0.1:0",
            echo_servicers(),
            tls=ServerTLS(cert_file="/nonexistent/s.crt", key_file="/nonexistent/s.key"),
            registry=CollectorRegistry(),
        )


def test_a_taken_port_is_refused(start_server: StartServer) -> None:
    first = start_server(echo_servicers())
    with pytest.raises(OSError, match="listen"):
        serve(first.address, echo_servicers(), registry=CollectorRegistry())


def test_rpcs_outside_the_declared_capabilities_are_refused_by_the_server(
    start_server: StartServer,
) -> None:
    inventory_only = frozenset({identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY})
    server = start_server(echo_servicers(capabilities=inventory_only))
    with grpc.insecure_channel(server.address) as channel:
        stub = cluster_pb2_grpc.ClusterServiceStub(channel)
        listed = stub.ListClusters(cluster_pb2.ListClustersRequest(), timeout=5)
        assert len(listed.clusters) == 3
        request = cluster_pb2.ServiceOutRequest(request_id="r-1", cluster_id="echo-000")
        with pytest.raises(grpc.RpcError) as info:
            stub.ServiceOut(request, timeout=5)
        assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        assert info.value.details() == "ServiceOut is outside this plugin's declared capabilities"
        with pytest.raises(grpc.RpcError) as stream_info:
            list(stub.WatchOperations(cluster_pb2.WatchOperationsRequest(), timeout=5))
        assert stream_info.value.code() is grpc.StatusCode.UNIMPLEMENTED
        # Nothing was changed behind the refusal.
        cluster = stub.GetCluster(cluster_pb2.GetClusterRequest(cluster_id="echo-000"), timeout=5)
        assert cluster.cluster.in_service


def test_capability_enforcement_can_be_turned_off(start_server: StartServer) -> None:
    inventory_only = frozenset({identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY})
    server = start_server(
        echo_servicers(capabilities=inventory_only, op_seconds=0), enforce_capabilities=False
    )
    with grpc.insecure_channel(server.address) as channel:
        stub = cluster_pb2_grpc.ClusterServiceStub(channel)
        request = cluster_pb2.ServiceOutRequest(request_id="r-1", cluster_id="echo-000")
        operation = stub.ServiceOut(request, timeout=5).operation
    assert operation.state == cluster_pb2.OPERATION_STATE_SUCCEEDED
