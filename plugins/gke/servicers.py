"""gRPC servicers of the GKE plugin: Identity and Cluster over one GkeFleet."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Iterator, Mapping

import grpc

from fleetupgrade.plugin.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    identity_pb2,
    identity_pb2_grpc,
)
from plugins.gke.fleet import GkeFleet
from plugins.sdk.validate import check_version, require, require_request_id

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "GkeClusterServicer", "GkeIdentityServicer"]

PLUGIN_NAME = "gke.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
)
"""Inventory, traffic, control-plane and node-pool upgrades."""


class GkeIdentityServicer(identity_pb2_grpc.IdentityServiceServicer):
    """Names the plugin, declares its capabilities, probes GKE."""

    def __init__(self, fleet: GkeFleet, version: str, manifest: Mapping[str, str]) -> None:
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
        ready, message = self._fleet.probe()
        return identity_pb2.ProbeResponse(ready=ready, message=message)


class GkeClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService: request checks here, the work in GkeFleet."""

    def __init__(self, fleet: GkeFleet) -> None:
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
        op = self._fleet.service(cluster_pb2.OPERATION_KIND_SERVICE_OUT, request_id, cluster_id)
        return cluster_pb2.ServiceOutResponse(operation=op)

    def ServiceIn(
        self, request: cluster_pb2.ServiceInRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.ServiceInResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        op = self._fleet.service(cluster_pb2.OPERATION_KIND_SERVICE_IN, request_id, cluster_id)
        return cluster_pb2.ServiceInResponse(operation=op)

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        version = check_version("version", request.version)
        op = self._fleet.upgrade(
            cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE, request_id, cluster_id, "", version
        )
        return cluster_pb2.UpgradeControlPlaneResponse(operation=op)

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        request_id = require_request_id(request)
        cluster_id = require("cluster_id", request.cluster_id)
        node_pool = require("node_pool", request.node_pool)
        version = check_version("version", request.version)
        op = self._fleet.upgrade(
            cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL, request_id, cluster_id, node_pool, version
        )
        return cluster_pb2.UpgradeNodePoolResponse(operation=op)

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
