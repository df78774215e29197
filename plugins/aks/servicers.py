"""The AKS plugin's servicers: the SDK's Identity and Cluster over one AksFleet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.aks.config import AksConfig
from plugins.aks.fleet import AksFleet
from plugins.sdk import ClusterServicer, PluginServicers, StaticIdentity

__all__ = ["PLUGIN_NAME", "aks_servicers", "capabilities"]

PLUGIN_NAME = "aks.fleetupgrade.io"

_Cap: TypeAlias = identity_pb2.PluginCapability.ValueType


def capabilities(config: AksConfig) -> tuple[_Cap, ...]:
    """Inventory, control-plane and node-pool upgrades, preflight; service only in traffic mode
    recordOnly; durable operations with operations.stateFile."""
    caps: list[_Cap] = [
        identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
        identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
        identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
        identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
    ]
    if config.traffic.mode == "recordOnly":
        caps.append(identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE)
    if config.operations.state_file:
        caps.append(identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS)
    return tuple(caps)


def aks_servicers(
    fleet: AksFleet, version: str, manifest: Mapping[str, str], fleet_id: str
) -> PluginServicers:
    """Probe asks ARM (fleet.probe); the cluster RPCs go to the fleet (PreflightUpgrade to
    fleet.preflight_upgrade through the SDK's routing)."""
    return PluginServicers(
        identity=StaticIdentity(
            PLUGIN_NAME,
            version,
            capabilities(fleet.config),
            fleet.probe,
            manifest,
            fleet_id=fleet_id,
        ),
        cluster=ClusterServicer(fleet),
    )
