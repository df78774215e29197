"""The GKE plugin's servicers: the SDK's Identity and Cluster over one GkeFleet."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Mapping

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, identity_pb2
from plugins.gke.fleet import GkeFleet
from plugins.sdk import (
    ClusterServicer,
    PluginServicers,
    StaticIdentity,
    caller_of,
    require,
    require_request_id,
)

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "GkeClusterServicer", "gke_servicers"]

PLUGIN_NAME = "gke.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
    identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
)
"""Inventory, traffic, control-plane and node-pool upgrades, preflight."""

WORD_ALIASES = frozenset({"latest", "-"})
"""GKE's version aliases that are not version numbers (UpdateMasterRequest.master_version,
UpdateNodePoolRequest.node_version); the fleet resolves them from GetServerConfig."""


class GkeClusterServicer(ClusterServicer):
    """The SDK's ClusterServicer, letting GKE's "latest" and "-" aliases through to the fleet
    (the SDK's version check accepts only version numbers; "1.X" and "1.X.Y" pass it)."""

    def __init__(self, fleet: GkeFleet) -> None:
        super().__init__(fleet)
        self._fleet = fleet

    def UpgradeControlPlane(
        self, request: cluster_pb2.UpgradeControlPlaneRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeControlPlaneResponse:
        if request.version not in WORD_ALIASES:
            return super().UpgradeControlPlane(request, context)
        op = self._fleet.upgrade_control_plane(
            require_request_id(request),
            require("cluster_id", request.cluster_id),
            request.version,
            caller_of(context),
        )
        return cluster_pb2.UpgradeControlPlaneResponse(operation=op)

    def UpgradeNodePool(
        self, request: cluster_pb2.UpgradeNodePoolRequest, context: grpc.ServicerContext
    ) -> cluster_pb2.UpgradeNodePoolResponse:
        if request.version not in WORD_ALIASES:
            return super().UpgradeNodePool(request, context)
        op = self._fleet.upgrade_node_pool(
            require_request_id(request),
            require("cluster_id", request.cluster_id),
            require("node_pool", request.node_pool),
            request.version,
            caller_of(context),
        )
        return cluster_pb2.UpgradeNodePoolResponse(operation=op)


def gke_servicers(
    fleet: GkeFleet, version: str, manifest: Mapping[str, str], fleet_id: str = ""
) -> PluginServicers:
    """The plugin's servicers: Probe asks GKE (fleet.probe), the cluster RPCs go to the fleet
    (PreflightUpgrade to fleet.preflight_upgrade through the SDK's routing)."""
    return PluginServicers(
        identity=StaticIdentity(
            PLUGIN_NAME, version, CAPABILITIES, fleet.probe, manifest, fleet_id=fleet_id
        ),
        cluster=GkeClusterServicer(fleet),
    )
