"""The simulated fleet's plugin servicers: the SDK's Identity, Cluster and Health over one Fleet."""

from __future__ import annotations

from collections.abc import Mapping

from fleetupgrade.plugin.v1 import identity_pb2
from plugins.sdk import ClusterServicer, HealthServicer, PluginServicers, StaticIdentity
from plugins.sim.fleet import Fleet

__all__ = ["CAPABILITIES", "PLUGIN_NAME", "sim_servicers"]

PLUGIN_NAME = "sim.fleetupgrade.io"

CAPABILITIES: tuple[identity_pb2.PluginCapability.ValueType, ...] = (
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_INVENTORY,
    identity_pb2.PLUGIN_CAPABILITY_CLUSTER_SERVICE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_CONTROL_PLANE,
    identity_pb2.PLUGIN_CAPABILITY_UPGRADE_NODE_POOL,
    identity_pb2.PLUGIN_CAPABILITY_CHECK_WORKLOADS,
    identity_pb2.PLUGIN_CAPABILITY_QUERY_METRIC,
    identity_pb2.PLUGIN_CAPABILITY_PREFLIGHT_UPGRADE,
)
"""What the sim serves: everything but gates (and durability, which needs a state dir)."""


def sim_servicers(
    fleet: Fleet, version: str, manifest: Mapping[str, str], fleet_id: str = ""
) -> PluginServicers:
    """The sim's servicers: always ready; the fleet file's RPC faults apply before every call.

    PLUGIN_CAPABILITY_DURABLE_OPERATIONS is declared when the fleet journals its operations.
    """
    capabilities = list(CAPABILITIES)
    if fleet.operations.durable:
        capabilities.append(identity_pb2.PLUGIN_CAPABILITY_DURABLE_OPERATIONS)
    return PluginServicers(
        identity=StaticIdentity(
            PLUGIN_NAME, version, capabilities, manifest=manifest, fleet_id=fleet_id
        ),
        cluster=ClusterServicer(fleet, before=fleet.before_rpc),
        health=HealthServicer(fleet, before=fleet.before_rpc),
    )
