"""The OCM plugin's servicers: the SDK's Identity, Cluster and Health over one OcmFleet."""

from __future__ import annotations

from collections.abc import Mapping

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.ocm.fleet import OcmFleet
from plugins.sdk.identity import StaticIdentity
from plugins.sdk.server import PluginServicers
from plugins.sdk.servicers import ClusterServicer, HealthServicer

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "ocm_servicers"]

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


def ocm_servicers(fleet: OcmFleet, version: str, manifest: Mapping[str, str]) -> PluginServicers:
    """The plugin's servicers: ready when the hub caches are (fleet.readiness)."""
    return PluginServicers(
        identity=StaticIdentity(PLUGIN_NAME, version, CAPABILITIES, fleet.readiness, manifest),
        cluster=ClusterServicer(fleet),
        health=HealthServicer(fleet),
    )
