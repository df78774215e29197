"""The EKS plugin's servicers: the SDK's Identity and Cluster over one EksFleet."""

from __future__ import annotations

from collections.abc import Mapping

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.eks.fleet import EksFleet
from plugins.sdk import ClusterServicer, PluginServicers, StaticIdentity

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "capabilities", "eks_servicers"]

PLUGIN_NAME = "eks.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
    identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
)
"""Inventory, traffic (mode none: recorded), control-plane and node-group upgrades, preflight."""


def capabilities(durable: bool) -> tuple[identity_pb2.PluginCapability.ValueType, ...]:
    """CAPABILITIES, plus DURABLE_OPERATIONS with a journal (operations.stateFile): EKS keeps
    its updates and their clientRequestTokens, the journal keeps the request_ids of no-op and
    traffic operations."""
    if durable:
        return (*CAPABILITIES, identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS)
    return CAPABILITIES


def eks_servicers(
    fleet: EksFleet, version: str, manifest: Mapping[str, str], fleet_id: str
) -> PluginServicers:
    """Probe asks EKS (fleet.probe); the cluster RPCs go to the fleet (PreflightUpgrade to
    fleet.preflight_upgrade through the SDK's routing)."""
    return PluginServicers(
        identity=StaticIdentity(
            PLUGIN_NAME,
            version,
            capabilities(fleet.store.durable),
            fleet.probe,
            manifest,
            fleet_id=fleet_id,
        ),
        cluster=ClusterServicer(fleet),
    )
