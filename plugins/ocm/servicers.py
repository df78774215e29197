"""The OCM plugin's servicers: the SDK's Identity, Cluster and Health over OcmHubs."""

from __future__ import annotations

from collections.abc import Mapping

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.ocm.hubs import OcmHubs
from plugins.sdk import ClusterServicer, HealthServicer, PluginServicers, StaticIdentity

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "ocm_servicers"]

PLUGIN_NAME = "ocm.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
    identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
    identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS,
)
"""Inventory, taint service-out, control-plane upgrades, workload health, preflight, and
durable operations (every operation is recorded in its ManagedCluster's ledger on the hub).

No UPGRADE_NODE_POOL: a ManagedCluster reports no node pools (the upgrade method upgrades the
whole cluster). No QUERY_METRIC and no GATES.
"""


def ocm_servicers(
    hubs: OcmHubs, version: str, manifest: Mapping[str, str], fleet_id: str = ""
) -> PluginServicers:
    """The plugin's servicers: ready when every hub's caches are (hubs.readiness)."""
    return PluginServicers(
        identity=StaticIdentity(
            PLUGIN_NAME, version, CAPABILITIES, hubs.readiness, manifest, fleet_id=fleet_id
        ),
        cluster=ClusterServicer(hubs),
        health=HealthServicer(hubs),
    )
