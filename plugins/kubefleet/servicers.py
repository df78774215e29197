"""gRPC servicers of the KubeFleet plugin: Identity, Cluster, Health and Gate over one hub."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Iterator, Mapping

import grpc

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
from plugins.kubefleet.fleet import KubeFleetHub
from plugins.sdk.errors import InvalidArgument, Unimplemented
from plugins.sdk.validate import require, require_all, require_request_id

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "KubeFleetClusterServicer",
    "KubeFleetGateServicer",
    "KubeFleetHealthServicer",
    "KubeFleetIdentityServicer",
]

PLUGIN_NAME = "kubefleet.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
    identity_pb2.PLUGIN_CAPABILITY_GATES,
)
"""MemberCluster inventory, taint service-out, workload health and approval-request gates.

No upgrades: KubeFleet places resources, it does not upgrade its members' Kubernetes. No
QUERY_METRIC: health checks query Prometheus themselves (provider "prometheus").
"""


class KubeFleetIdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    """Names the plugin, declares its capabilities, and is ready when the hub caches are."""

    def __init__(self, hub: KubeFleetHub, version: str, manifest: Mapping[str, str]) -> None:
        self._hub = hub
        self._info = identity_pb2.GetPluginInfoResponse(
            name=PLUGIN_NAME, vendor_version=version, manifest=dict(manifest)
        )
        self._capabilities = identity_pb2.GetPluginCapabilitiesResponse(capabilities=CAPABILITIES)

    def GetPluginInfo(
        self, request: identity_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginInfoResponse:
        return self._info

    def GetPluginCapabilities(
        self, request: identity_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> identity_pb2.GetPluginCapabilitiesResponse:
        return self._capabilities

    def Probe(
        self, request: identity_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> identity_pb2.ProbeResponse:
        ready, why = self._hub.readiness()
        return identity_pb2.ProbeResponse(ready=ready, message=why)


class KubeFleetClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService over the hub's MemberClusters: inventory and taint service-out / in."""

    def __init__(self, hub: KubeFleetHub) -> None:
        self._hub = hub

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        return self._hub.list_clusters(request.page_size, request.page_token, request.match_labels)

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        cluster = self._hub.get_cluster(require("cluster_id", request.cluster_id))
        return cluster_pb2.GetClusterResponse(cluster=cluster)

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        return cluster_pb2.ServiceOutResponse(
            operation=self._hub.service_out(request_id, cluster_id)
        )

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        return cluster_pb2.ServiceInResponse(operation=self._hub.service_in(request_id, cluster_id))

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        # Outside the declared capabilities: the SDK server answers UNIMPLEMENTED first.
        raise Unimplemented("UpgradeControlPlane: KubeFleet does not upgrade member clusters")

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        raise Unimplemented("UpgradeNodePool: KubeFleet does not upgrade member clusters")

    def GetOperation(
        self, request: cluster_pb2.GetOperationRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetOperationResponse:
        op = self._hub.get_operation(require("operation_id", request.operation_id))
        return cluster_pb2.GetOperationResponse(operation=op)

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        cluster_ids = list(request.cluster_ids)
        for index, cluster_id in enumerate(cluster_ids):
            require(f"cluster_ids[{index}]", cluster_id)
        for op in self._hub.watch_operations(cluster_ids, request.include_in_flight, context):
            yield cluster_pb2.WatchOperationsResponse(operation=op)


class KubeFleetHealthServicer(health_pb2_grpc.HealthServiceServicer):
    """CheckWorkloads from MetricCollectorReports (or the central Prometheus)."""

    def __init__(self, hub: KubeFleetHub) -> None:
        self._hub = hub

    def CheckWorkloads(
        self, request: health_pb2.CheckWorkloadsRequest, context: grpc.ServicerContext
    ) -> health_pb2.CheckWorkloadsResponse:
        cluster_ids = require_all("cluster_ids", request.cluster_ids)
        if not request.workloads:
            require("workloads", "")
        for index, workload in enumerate(request.workloads):
            require(f"workloads[{index}].namespace", workload.namespace)
            require(f"workloads[{index}].name", workload.name)
            if workload.min_healthy_replicas < 0:
                raise InvalidArgument(
                    f"workloads[{index}].min_healthy_replicas", "must be 0 or more (0 means 1)"
                )
        results = self._hub.check_workloads(cluster_ids, list(request.workloads))
        return health_pb2.CheckWorkloadsResponse(results=results)

    def QueryMetric(
        self, request: health_pb2.QueryMetricRequest, context: grpc.ServicerContext
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
