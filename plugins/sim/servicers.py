"""gRPC servicers of the simulated fleet: Identity, Cluster and Health over one Fleet."""

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
from plugins.sdk.interceptors import CALLER_METADATA_KEY
from plugins.sdk.validate import check_version, require, require_all, require_request_id
from plugins.sim.fleet import Fleet

__all__ = [
    "CAPABILITIES",
    "PLUGIN_NAME",
    "SimClusterServicer",
    "SimHealthServicer",
    "SimIdentityServicer",
    "caller_of",
]

PLUGIN_NAME = "sim.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
    identity_pb2.PLUGIN_CAPABILITY_QUERY_METRIC,
)
"""What the sim serves: everything but gates."""


def caller_of(context: grpc.ServicerContext) -> str:
    """The caller's identity: metadata x-fleetupgrade-caller, else the peer address."""
    for key, value in context.invocation_metadata() or ():
        if key == CALLER_METADATA_KEY and value:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return f"peer:{context.peer()}"


class SimIdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    """Names the sim and declares its capabilities; always ready."""

    def __init__(self, version: str, manifest: Mapping[str, str]) -> None:
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
        return identity_pb2.ProbeResponse(ready=True)


class SimClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService over the simulated fleet; faults are applied first."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def _faults(self, method: str, context: grpc.ServicerContext) -> None:
        faults = self._fleet.rpc_faults
        if faults.active:
            faults.before(method, context)

    def ListClusters(
        self, request: cluster_pb2.ListClustersRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ListClustersResponse:
        self._faults("ListClusters", context)
        return self._fleet.list_clusters(
            request.page_size, request.page_token, request.match_labels
        )

    def GetCluster(
        self, request: cluster_pb2.GetClusterRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetClusterResponse:
        self._faults("GetCluster", context)
        return self._fleet.get_cluster(require("cluster_id", request.cluster_id))

    def ServiceOut(
        self, request: cluster_pb2.ServiceOutRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceOutResponse:
        self._faults("ServiceOut", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        op = self._fleet.service_out(request_id, cluster_id, caller_of(context))
        return cluster_pb2.ServiceOutResponse(operation=op)

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        self._faults("ServiceIn", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        op = self._fleet.service_in(request_id, cluster_id, caller_of(context))
        return cluster_pb2.ServiceInResponse(operation=op)

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        self._faults("UpgradeControlPlane", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        version = check_version("version", request.version)
        op = self._fleet.upgrade_control_plane(request_id, cluster_id, version, caller_of(context))
        return cluster_pb2.UpgradeControlPlaneResponse(operation=op)

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        self._faults("UpgradeNodePool", context)
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        node_pool = require("node_pool", request.node_pool)
        version = check_version("version", request.version)
        op = self._fleet.upgrade_node_pool(
            request_id, cluster_id, node_pool, version, caller_of(context)
        )
        return cluster_pb2.UpgradeNodePoolResponse(operation=op)

    def GetOperation(
        self, request: cluster_pb2.GetOperationRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.GetOperationResponse:
        self._faults("GetOperation", context)
        op = self._fleet.get_operation(require("operation_id", request.operation_id))
        return cluster_pb2.GetOperationResponse(operation=op)

    def WatchOperations(
        self, request: cluster_pb2.WatchOperationsRequest, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        self._faults("WatchOperations", context)
        cluster_ids = list(request.cluster_ids)
        for index, cluster_id in enumerate(cluster_ids):
            require(f"cluster_ids[{index}]", cluster_id)
        for op in self._fleet.watch_operations(cluster_ids, request.include_in_flight, context):
            yield cluster_pb2.WatchOperationsResponse(operation=op)


class SimHealthServicer(health_pb2_grpc.HealthServiceServicer):
    """HealthService answered from the workload health and metrics of the fleet file."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet

    def _faults(self, method: str, context: grpc.ServicerContext) -> None:
        faults = self._fleet.rpc_faults
        if faults.active:
            faults.before(method, context)

    def CheckWorkloads(
        self, request: health_pb2.CheckWorkloadsRequest, context: grpc.ServicerContext
    ) -> health_pb2.CheckWorkloadsResponse:
        self._faults("CheckWorkloads", context)
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
        self._faults("QueryMetric", context)
        query = require("query", request.query)
        return self._fleet.query_metric(query, request.args, request.cluster_id)
