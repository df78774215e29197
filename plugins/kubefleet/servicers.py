"""gRPC servicers of the KubeFleet plugin: the SDK's Identity/Cluster/Health servicers over the
hub, and GateService over its approval requests."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    gate_pb2,
    gate_pb2_grpc,
    health_pb2,
    identity_pb2,
)
from plugins.kubefleet.fleet import KubeFleetHub
from plugins.sdk import (
    ClusterServicer,
    HealthServicer,
    InvalidArgument,
    StaticIdentity,
    Unimplemented,
    package_version,
    require,
)

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "HubBackend",
    "KubeFleetGateServicer",
    "servicers",
]

PLUGIN_NAME = "kubefleet.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
    identity_pb2.PLUGIN_CAPABILITY_GATES,
    identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS,
)
"""MemberCluster inventory, taint service-out, workload health and approval-request gates;
operations durable across restarts (recorded on the MemberCluster, see oplog.py).

No upgrades: KubeFleet places resources, it does not upgrade its members' Kubernetes. No
QUERY_METRIC: health checks query Prometheus themselves (provider "prometheus").
"""


class HubBackend:
    """The SDK's ClusterBackend and HealthBackend over one KubeFleetHub."""

    def __init__(self, hub: KubeFleetHub) -> None:
        self._hub = hub

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str], /
    ) -> cluster_pb2.ListClustersResponse:
        return self._hub.list_clusters(page_size, page_token, match_labels)

    def get_cluster(self, cluster_id: str, /) -> cluster_pb2.GetClusterResponse:
        return cluster_pb2.GetClusterResponse(cluster=self._hub.get_cluster(cluster_id))

    def service_out(
        self, request_id: str, cluster_id: str, caller: str, /
    ) -> cluster_pb2.Operation:
        return self._hub.service_out(request_id, cluster_id)

    def service_in(self, request_id: str, cluster_id: str, caller: str, /) -> cluster_pb2.Operation:
        return self._hub.service_in(request_id, cluster_id)

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation:
        # Outside the declared capabilities: the SDK server answers UNIMPLEMENTED first.
        raise Unimplemented("UpgradeControlPlane: KubeFleet does not upgrade member clusters")

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str, /
    ) -> cluster_pb2.Operation:
        raise Unimplemented("UpgradeNodePool: KubeFleet does not upgrade member clusters")

    def get_operation(self, operation_id: str, /) -> cluster_pb2.Operation:
        return self._hub.get_operation(operation_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext, /
    ) -> Iterable[cluster_pb2.Operation]:
        return self._hub.watch_operations(cluster_ids, include_in_flight, context)

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload], /
    ) -> list[health_pb2.WorkloadResult]:
        return self._hub.check_workloads(cluster_ids, workloads)

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str, /
    ) -> health_pb2.QueryMetricResponse:
        raise Unimplemented("QueryMetric: the KubeFleet plugin does not run metric queries")


class KubeFleetGateServicer(gate_pb2_grpc.GateServiceServicer):
    """GateService over ClusterApprovalRequests and ApprovalRequests."""

    def __init__(self, hub: KubeFleetHub) -> None:
        self._hub = hub

    def ListGates(
        self, request: gate_pb2.ListGatesRequest, context: grpc.ServicerContext
    ) -> gate_pb2.ListGatesResponse:
        return gate_pb2.ListGatesResponse(gates=self._hub.list_gates())

    def WatchGates(
        self, request: gate_pb2.WatchGatesRequest, context: grpc.ServicerContext
    ) -> Iterator[gate_pb2.WatchGatesResponse]:
        yield from self._hub.watch_gates(context)

    def ResolveGate(
        self, request: gate_pb2.ResolveGateRequest, context: grpc.ServicerContext
    ) -> gate_pb2.ResolveGateResponse:
        gate_id = require("gate_id", request.gate_id)
        if request.decision not in (gate_pb2.GATE_DECISION_APPROVE, gate_pb2.GATE_DECISION_REJECT):
            raise InvalidArgument(
                "decision", "must be GATE_DECISION_APPROVE or GATE_DECISION_REJECT"
            )
        reason = require("reason", request.reason)
        return gate_pb2.ResolveGateResponse(
            gate=self._hub.resolve_gate(gate_id, request.decision, reason)
        )


def servicers(
    hub: KubeFleetHub, manifest: Mapping[str, str], fleet_id: str = ""
) -> tuple[StaticIdentity, ClusterServicer, HealthServicer, KubeFleetGateServicer]:
    """Identity (ready when the hub caches are), Cluster, Health and Gate servicers."""
    backend = HubBackend(hub)
    identity = StaticIdentity(
        PLUGIN_NAME,
        package_version(),
        CAPABILITIES,
        probe=hub.readiness,
        manifest=manifest,
        fleet_id=fleet_id,
    )
    return identity, ClusterServicer(backend), HealthServicer(backend), KubeFleetGateServicer(hub)
