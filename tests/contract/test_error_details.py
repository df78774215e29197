"""Errors carry google.rpc.ErrorInfo / RetryInfo end to end, and PreflightUpgrade is routed."""

from __future__ import annotations

from collections.abc import Mapping

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fleetupgrade.plugin.v1 import cluster_pb2, cluster_pb2_grpc, identity_pb2
from plugins.sdk import errors, preflight
from plugins.sdk.client import PluginCallError, PluginClient
from plugins.sdk.errors import ERROR_DOMAIN, Reason
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.server import PluginServer, PluginServicers
from plugins.sdk.servicers import ClusterServicer
from tests.contract.conftest import StartServer
from tests.support.echo_plugin import EchoIdentity

Cap = identity_pb2.PluginCapability


class _Refusing(cluster_pb2_grpc.ClusterServiceServicer):
    """GetCluster answers the error its cluster_id names."""

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        match request.cluster_id:
            case "not-offered":
                raise errors.FailedPrecondition(
                    "version 1.31.0 is not offered in us-east1", reason=Reason.VERSION_NOT_OFFERED
                )
            case "busy":
                raise errors.FailedPrecondition(
                    "cluster busy with a provider repair",
                    reason=Reason.CLUSTER_BUSY,
                    retry_after=30,
                )
            case "conflict":
                raise errors.Conflict("cluster c has operation op-3 in flight", "op-3")
            case "down":
                raise errors.Unavailable("provider API unreachable")
            case "bad":
                raise errors.InvalidArgument("cluster_id", "must be a cluster id")
            case "crash":
                raise RuntimeError("secret-token-123 leaked")
        raise errors.NotFound(f"cluster {request.cluster_id} not found")


@pytest.fixture
def refusing(start_server: StartServer) -> PluginServer:
    return start_server(PluginServicers(identity=EchoIdentity(), cluster=_Refusing()))


def _fail(server: PluginServer, cluster_id: str) -> PluginCallError:
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.get_cluster(cluster_id)
    return info.value


@pytest.mark.parametrize(
    ("cluster_id", "code", "reason", "retryable", "retry_after"),
    [
        ("not-offered", grpc.StatusCode.FAILED_PRECONDITION, "VERSION_NOT_OFFERED", False, None),
        ("busy", grpc.StatusCode.FAILED_PRECONDITION, "CLUSTER_BUSY", True, 30.0),
        ("conflict", grpc.StatusCode.ABORTED, "OPERATION_IN_FLIGHT", True, None),
        ("down", grpc.StatusCode.UNAVAILABLE, "PROVIDER_UNAVAILABLE", True, 0.0),
        ("bad", grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD", False, None),
        ("missing", grpc.StatusCode.NOT_FOUND, "NOT_FOUND", False, None),
        ("crash", grpc.StatusCode.INTERNAL, "INTERNAL", False, None),
    ],
)
def test_the_client_reads_reason_and_retryability_from_the_details(
    refusing: PluginServer,
    cluster_id: str,
    code: grpc.StatusCode,
    reason: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    error = _fail(refusing, cluster_id)
    assert error.code is code
    assert error.reason == reason
    assert error.domain == ERROR_DOMAIN
    assert error.contract_reason == reason
    # GetCluster is read-only, so ABORTED is retryable by the code table alone.
    assert error.retryable is retryable
    assert error.retry_after == retry_after
    assert "secret-token" not in error.message


def test_details_carry_the_field_and_the_operation_id(refusing: PluginServer) -> None:
    assert _fail(refusing, "bad").metadata == {"field": "cluster_id"}
    conflict = _fail(refusing, "conflict")
    assert conflict.metadata == {"operation_id": "op-3"}
    assert conflict.operation_id == "op-3"


def test_the_details_are_a_standard_google_rpc_status(refusing: PluginServer) -> None:
    # Any gRPC client can read them with grpcio-status, not only the SDK.
    channel = grpc.insecure_channel(refusing.address)
    stub = cluster_pb2_grpc.ClusterServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetCluster(cluster_pb2.GetClusterRequest(cluster_id="busy"), timeout=5)
    channel.close()
    status = rpc_status.from_call(info.value)  # type: ignore[arg-type]
    assert status is not None
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    kinds = {d.TypeName() for d in status.details}
    assert kinds == {"google.rpc.ErrorInfo", "google.rpc.RetryInfo"}
    retry = error_details_pb2.RetryInfo()
    next(d for d in status.details if d.Is(retry.DESCRIPTOR)).Unpack(retry)
    assert retry.retry_delay.seconds == 30


def test_a_conflict_on_a_mutating_rpc_stays_not_retryable(start_server: StartServer) -> None:
    class Busy(cluster_pb2_grpc.ClusterServiceServicer):
        def ServiceOut(
            self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
        ) -> cluster_pb2.ServiceOutResponse:
            raise errors.Conflict("cluster c has operation op-9 in flight", "op-9")

    server = start_server(PluginServicers(identity=EchoIdentity(), cluster=Busy()))
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.service_out("r-1", "c")
    assert info.value.code is grpc.StatusCode.ABORTED
    assert info.value.reason == "OPERATION_IN_FLIGHT"
    assert not info.value.retryable
    assert info.value.operation_id == "op-9"


def test_capability_refusals_carry_not_implemented(start_server: StartServer) -> None:
    identity = EchoIdentity(frozenset({Cap.PLUGIN_CAPABILITY_CLUSTER_INVENTORY}))
    server = start_server(PluginServicers(identity=identity, cluster=_Refusing()))
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.preflight_upgrade("c", "1.30.1")
    assert info.value.code is grpc.StatusCode.UNIMPLEMENTED
    assert info.value.reason == "NOT_IMPLEMENTED"
    assert not info.value.retryable


# -- PreflightUpgrade through the SDK servicer ----------------------------------------------


class _Backend:
    """A ClusterBackend with a preflight that refuses by the target version's minor."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, dict[str, str]]] = []

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        raise errors.NotFound(f"cluster {cluster_id} not found")

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        self.asked.append((cluster_id, control_plane_version, dict(node_pool_versions)))
        if cluster_id == "gone":
            raise errors.NotFound("cluster gone not found")

        def check() -> None:
            if control_plane_version.startswith("1.31"):
                raise errors.FailedPrecondition(
                    "1.31 is not offered", reason=Reason.VERSION_NOT_OFFERED
                )
            if control_plane_version.startswith("1.30"):
                raise errors.Conflict("operation op-1 is in flight", "op-1")

        return preflight.verdict_of_check(check)


def _preflight_server(
    start_server: StartServer, backend: object, capabilities: frozenset[int]
) -> PluginServer:
    identity = StaticIdentity("pf", "0.1", sorted(capabilities))  # type: ignore[arg-type]
    cluster = ClusterServicer(backend)  # type: ignore[arg-type]
    return start_server(PluginServicers(identity=identity, cluster=cluster))


def test_preflight_reaches_the_backend_and_answers_its_verdicts(start_server: StartServer) -> None:
    backend = _Backend()
    caps = frozenset(
        {Cap.PLUGIN_CAPABILITY_CLUSTER_INVENTORY, Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE}
    )
    server = _preflight_server(start_server, backend, caps)
    with PluginClient(server.address) as client:
        ok = client.preflight_upgrade("c1", "1.29.4", {"pool-a": "1.29.4"})
        never = client.preflight_upgrade("c1", "1.31.0")
        later = client.preflight_upgrade("c1", "1.30.2")
        with pytest.raises(PluginCallError) as gone:
            client.preflight_upgrade("gone", "1.29.4")
    assert ok.verdict == cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED
    assert (never.verdict, never.reason_code) == (
        cluster_pb2.PREFLIGHT_VERDICT_REFUSED_NEVER,
        "VERSION_NOT_OFFERED",
    )
    assert never.message == "1.31 is not offered"
    assert (later.verdict, later.reason_code) == (
        cluster_pb2.PREFLIGHT_VERDICT_REFUSED_LATER,
        "CLUSTER_BUSY",
    )
    assert gone.value.code is grpc.StatusCode.NOT_FOUND
    assert backend.asked[0] == ("c1", "1.29.4", {"pool-a": "1.29.4"})


@pytest.mark.parametrize(
    ("cluster_id", "control_plane", "pools", "field"),
    [
        ("", "1.29.4", {}, "cluster_id"),
        ("c1", "", {}, "control_plane_version"),
        ("c1", "one.two", {}, "control_plane_version"),
        ("c1", "", {"pool-a": "latest-ish"}, "node_pool_versions[pool-a]"),
    ],
)
def test_preflight_requests_are_checked_before_the_backend(
    start_server: StartServer,
    cluster_id: str,
    control_plane: str,
    pools: dict[str, str],
    field: str,
) -> None:
    backend = _Backend()
    caps = frozenset({Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE})
    server = _preflight_server(start_server, backend, caps)
    with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
        client.preflight_upgrade(cluster_id, control_plane, pools)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.message
    assert info.value.metadata["field"] == field
    assert backend.asked == []


def test_preflight_without_a_backend_method_or_capability_is_unimplemented(
    start_server: StartServer,
) -> None:
    class NoPreflight:
        pass

    declared = _preflight_server(
        start_server, NoPreflight(), frozenset({Cap.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE})
    )
    undeclared = _preflight_server(
        start_server, _Backend(), frozenset({Cap.PLUGIN_CAPABILITY_CLUSTER_INVENTORY})
    )
    for server in (declared, undeclared):
        with PluginClient(server.address) as client, pytest.raises(PluginCallError) as info:
            client.preflight_upgrade("c1", "1.29.4")
        assert info.value.code is grpc.StatusCode.UNIMPLEMENTED
