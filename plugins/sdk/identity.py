"""IdentityService for any plugin: fixed name, version, manifest, capabilities; probe callable."""

# The method names are the contract's RPC names.
# ruff: noqa: N802

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import metadata

import grpc

from fleetupgrade.plugin.v1 import identity_pb2, identity_pb2_grpc

__all__ = ["DISTRIBUTION", "StaticIdentity", "always_ready", "package_version"]

DISTRIBUTION = "fleet-upgrade-orchestrator"
"""The Python distribution the plugins ship in; its version is every plugin's vendor_version."""


def package_version(distribution: str = DISTRIBUTION) -> str:
    """The installed version of distribution, or "0.0.0" when it is not installed (a checkout)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "0.0.0"


def always_ready() -> tuple[bool, str]:
    """A probe for plugins that are ready as soon as they serve."""
    return True, ""


class StaticIdentity(identity_pb2_grpc.IdentityServiceServicer):
    """Names the plugin and declares its capabilities (both fixed); Probe asks probe().

    probe returns (ready, message); the message says why not ready ("" when ready).
    fleet_id: what this plugin instance acts on, the same by whichever address it is reached
    and across restarts (GetPluginInfoResponse.fleet_id; docs/plugin-contract.md).
    """

    def __init__(
        self,
        name: str,
        version: str,
        capabilities: Iterable[identity_pb2.PluginCapability.ValueType],
        probe: Callable[[], tuple[bool, str]] = always_ready,
        manifest: Mapping[str, str] | None = None,
        fleet_id: str = "",
    ) -> None:
        self._info = identity_pb2.GetPluginInfoResponse(
            name=name, vendor_version=version, manifest=dict(manifest or {}), fleet_id=fleet_id
        )
        self._capabilities = identity_pb2.GetPluginCapabilitiesResponse(
            capabilities=list(capabilities)
        )
        self._probe = probe

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
        ready, message = self._probe()
        return identity_pb2.ProbeResponse(ready=ready, message=message)
