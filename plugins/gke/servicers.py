"""The GKE plugin's servicers: the SDK's Identity and Cluster over one GkeFleet."""

from __future__ import annotations

from collections.abc import Mapping

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.gke.fleet import GkeFleet
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.server import PluginServicers
from plugins.sdk.servicers import ClusterServicer

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "gke_servicers"]

PLUGIN_NAME = "gke.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
)
"""Inventory, traffic, control-plane and node-pool upgrades."""


def gke_servicers(fleet: GkeFleet, version: str, manifest: Mapping[str, str]) -> PluginServicers:
    """The plugin's servicers: Probe asks GKE (fleet.probe), the cluster RPCs go to the fleet."""
    return PluginServicers(
        identity=StaticIdentity(PLUGIN_NAME, version, CAPABILITIES, fleet.probe, manifest),
        cluster=ClusterServicer(fleet),
    )
