"""gRPC servicers of the OCM plugin: Identity, Cluster and Health over one OcmFleet."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Iterator, Mapping

import grpc

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.ocm.fleet import OcmFleet
from plugins.sdk.errors import Unimplemented
from plugins.sdk.validate import check_version, require, require_all, require_request_id

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "OcmClusterServicer",
    "OcmHealthServicer",
    "OcmIdentityServicer",
]

PLUGIN_NAME = "ocm.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
)
"""Inventory, taint service-out, control-plane upgrades and workload health.

No UPGRADE_NODE_POOL: a ManagedCluster reports no node pools (the upgrade method upgrades the
whole cluster). No QUERY_METRIC and no GATES.
"""


class OcmIdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    """Names the plugin, declares its capabilities, and is ready when the hub caches are."""

    def __init__(self, fleet: OcmFleet, version: str, manifest: Mapping[str, str]) -> None:
        self._fleet = fleet
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
        ready, why = self._fleet.readiness()
        return identity_pb2.ProbeResponse(ready=ready, message=why)


class OcmClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService over the hub's ManagedClusters."""

    def __init__(self, fleet: OcmFleet) -> None:
        self._fleet = fleet

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        return self._fleet.list_clusters(
            request.page_size, request.page_token, request.match_labels
        )

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        cluster = self._fleet.get_cluster(require("cluster_id", request.cluster_id))
        return cluster_pb2.GetClusterResponse(cluster=cluster)

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        return cluster_pb2.ServiceOutResponse(
            operation=self._fleet.service_out(request_id, cluster_id)
        )

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        return cluster_pb2.ServiceInResponse(
            operation=self._fleet.service_in(request_id, cluster_id)
        )

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        version = check_version("version", request.version)
        return cluster_pb2.UpgradeControlPlaneResponse(
            operation=self._fleet.upgrade(request_id, cluster_id, version)
        )

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        # Outside the declared capabilities: the SDK server answers UNIMPLEMENTED first.
        raise Unimplemented("UpgradeNodePool: ManagedClusters report no node pools")

    def GetOperation(
        self, request: cluster_pb2.GetOperationRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetOperationResponse:
        op = self._fleet.get_operation(require("operation_id", request.operation_id))
        return cluster_pb2.GetOperationResponse(operation=op)

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        cluster_ids = list(request.cluster_ids)
        for index, cluster_id in enumerate(cluster_ids):
            require(f"cluster_ids[{index}]", cluster_id)
        for op in self._fleet.watch_operations(cluster_ids, request.include_in_flight, context):
            yield cluster_pb2.WatchOperationsResponse(operation=op)


class OcmHealthServicer(health_pb2_grpc.HealthServiceServicer):
    """CheckWorkloads from ManifestWork status feedback; QueryMetric is not offered."""

    def __init__(self, fleet: OcmFleet) -> None:
        self._fleet = fleet

    def CheckWorkloads(
        self, request: health_pb2.CheckWorkloadsRequest, context: grpc.ServicerContext
    ) -> health_pb2.CheckWorkloadsResponse:
        cluster_ids = require_all("cluster_ids", request.cluster_ids)
        if not request.workloads:
            require("workloads", "")
        for index, workload in enumerate(request.workloads):
            require(f"workloads[{index}].namespace", workload.namespace)
            require(f"workloads[{index}].name", workload.name)
        results = self._fleet.check_workloads(cluster_ids, request.workloads)
        return health_pb2.CheckWorkloadsResponse(results=results)

    def QueryMetric(
        self, request: health_pb2.QueryMetricRequest, context: grpc.ServicerContext
    ) -> health_pb2.QueryMetricResponse:
        raise Unimplemented("QueryMetric: the OCM plugin does not query metrics")
