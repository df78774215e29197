"""Conformance of capabilities: RPCs outside them answer UNIMPLEMENTED, RPCs inside do not."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    gate_pb2,
    gate_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.sdk.client import RPC_CAPABILITIES, PluginClient, supports

_UNARY_SECONDS = 10.0
_STREAM_SECONDS = 1.0  # a stream still open after this long was served


def _identity(channel: grpc.Channel) -> dict[str, Callable[[float], object]]:
    stub = identity_pb2_grpc.IdentityServiceStub(channel)
    return {
        "GetPluginInfo": lambda t: stub.GetPluginInfo(
            identity_pb2.GetPluginInfoRequest(), timeout=t
        ),
        "GetPluginCapabilities": lambda t: stub.GetPluginCapabilities(
            identity_pb2.GetPluginCapabilitiesRequest(), timeout=t
        ),
        "Probe": lambda t: stub.Probe(identity_pb2.ProbeRequest(), timeout=t),
    }


def _cluster(channel: grpc.Channel) -> dict[str, Callable[[float], object]]:
    # Requests outside a read are empty: a plugin serving the RPC refuses them as
    # INVALID_ARGUMENT, so probing never changes a cluster.
    stub = cluster_pb2_grpc.ClusterServiceStub(channel)
    return {
        "ListClusters": lambda t: stub.ListClusters(
            cluster_pb2.ListClustersRequest(page_size=1), timeout=t
        ),
        "GetCluster": lambda t: stub.GetCluster(cluster_pb2.GetClusterRequest(), timeout=t),
        "ServiceOut": lambda t: stub.ServiceOut(cluster_pb2.ServiceOutRequest(), timeout=t),
        "ServiceIn": lambda t: stub.ServiceIn(cluster_pb2.ServiceInRequest(), timeout=t),
        "UpgradeControlPlane": lambda t: stub.UpgradeControlPlane(
            cluster_pb2.UpgradeControlPlaneRequest(), timeout=t
        ),
        "UpgradeNodePool": lambda t: stub.UpgradeNodePool(
            cluster_pb2.UpgradeNodePoolRequest(), timeout=t
        ),
        "GetOperation": lambda t: stub.GetOperation(cluster_pb2.GetOperationRequest(), timeout=t),
        "WatchOperations": lambda t: list(
            stub.WatchOperations(cluster_pb2.WatchOperationsRequest(), timeout=t)
        ),
        "PreflightUpgrade": lambda t: stub.PreflightUpgrade(
            cluster_pb2.PreflightUpgradeRequest(), timeout=t
        ),
        "StartOperations": lambda t: stub.StartOperations(
            cluster_pb2.StartOperationsRequest(), timeout=t
        ),
        "PreflightUpgrades": lambda t: stub.PreflightUpgrades(
            cluster_pb2.PreflightUpgradesRequest(), timeout=t
        ),
    }


def _health(channel: grpc.Channel) -> dict[str, Callable[[float], object]]:
    stub = health_pb2_grpc.HealthServiceStub(channel)
    return {
        "CheckWorkloads": lambda t: stub.CheckWorkloads(
            health_pb2.CheckWorkloadsRequest(), timeout=t
        ),
        "QueryMetric": lambda t: stub.QueryMetric(health_pb2.QueryMetricRequest(), timeout=t),
    }


def _gate(channel: grpc.Channel) -> dict[str, Callable[[float], object]]:
    stub = gate_pb2_grpc.GateServiceStub(channel)
    return {
        "ListGates": lambda t: stub.ListGates(gate_pb2.ListGatesRequest(), timeout=t),
        "WatchGates": lambda t: list(stub.WatchGates(gate_pb2.WatchGatesRequest(), timeout=t)),
        "ResolveGate": lambda t: stub.ResolveGate(gate_pb2.ResolveGateRequest(), timeout=t),
    }


_STREAMS = frozenset({"WatchOperations", "WatchGates"})
#: RPCs a plugin may leave out even within its capabilities (the caller then makes the single
#: RPCs): UNIMPLEMENTED is a fine answer to them.
_OPTIONAL = frozenset({"StartOperations", "PreflightUpgrades"})
_ALL_RPCS = ["GetPluginInfo", "GetPluginCapabilities", "Probe", *RPC_CAPABILITIES]


def _status(client: PluginClient, rpc: str) -> grpc.StatusCode:
    probes = {
        **_identity(client.channel),
        **_cluster(client.channel),
        **_health(client.channel),
        **_gate(client.channel),
    }
    seconds = _STREAM_SECONDS if rpc in _STREAMS else _UNARY_SECONDS
    try:
        probes[rpc](seconds)
    except grpc.RpcError as exc:
        code = exc.code()
        if rpc in _STREAMS and code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return grpc.StatusCode.OK  # the stream was open and served
        return code
    return grpc.StatusCode.OK


@pytest.mark.parametrize("rpc", _ALL_RPCS)
def test_rpc_answers_unimplemented_exactly_outside_capabilities(
    client: PluginClient, capabilities: frozenset[int], rpc: str
) -> None:
    code = _status(client, rpc)
    names = sorted(
        identity_pb2.PluginCapability.Name(identity_pb2.PluginCapability.ValueType(c))
        for c in capabilities
    )
    if supports(capabilities, rpc) and rpc in _OPTIONAL and code is grpc.StatusCode.UNIMPLEMENTED:
        return  # not offered, which the contract allows
    if supports(capabilities, rpc):
        assert code is not grpc.StatusCode.UNIMPLEMENTED, (
            f"{rpc} answers UNIMPLEMENTED although the declared capabilities {names} include it"
        )
        assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
            f"{rpc} answered {code.name} to an empty or minimal request; refuse bad input with "
            "INVALID_ARGUMENT naming the field"
        )
    else:
        assert code is grpc.StatusCode.UNIMPLEMENTED, (
            f"{rpc} is outside the declared capabilities {names} but answered {code.name} "
            "instead of UNIMPLEMENTED"
        )
