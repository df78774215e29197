"""Conformance of IdentityService: info, capabilities, probe."""

from __future__ import annotations

from fleetupgrade.plugin.v1 import identity_pb2, identity_pb2_grpc
from plugins.sdk.client import PluginClient


def test_plugin_info_names_the_plugin_and_version(client: PluginClient) -> None:
    info = client.info()
    assert info.name, "GetPluginInfo.name is REQUIRED and empty"
    assert info.vendor_version, "GetPluginInfo.vendor_version is REQUIRED and empty"


def test_fleet_id_is_stable_and_bounded(client: PluginClient) -> None:
    """fleet_id (OPTIONAL) is what the orchestrator keys holdings and floors on: it must not
    change within a process, and fits in a ClusterUpgrade's spec.providerId."""
    first = client.info().fleet_id
    again = client.info().fleet_id
    assert first == again, (
        f"GetPluginInfo.fleet_id changed within one process: {first!r}, {again!r}"
    )
    assert len(first) <= 256, f"GetPluginInfo.fleet_id is {len(first)} characters; at most 256"
    assert first == first.strip(), f"GetPluginInfo.fleet_id {first!r} has surrounding space"


def test_capabilities_are_known_and_unique(client: PluginClient) -> None:
    stub = identity_pb2_grpc.IdentityServiceStub(client.channel)
    declared = list(
        stub.GetPluginCapabilities(
            identity_pb2.GetPluginCapabilitiesRequest(), timeout=5
        ).capabilities
    )
    known = set(identity_pb2.PluginCapability.values())
    assert identity_pb2.PLUGIN_CAPABILITY_UNSPECIFIED not in declared, (
        "capabilities must never contain PLUGIN_CAPABILITY_UNSPECIFIED"
    )
    assert len(declared) == len(set(declared)), f"duplicate capabilities in {declared}"
    assert set(declared) <= known, f"unknown capability values {set(declared) - known}"


def test_capabilities_do_not_change(client: PluginClient, capabilities: frozenset[int]) -> None:
    stub = identity_pb2_grpc.IdentityServiceStub(client.channel)
    again = stub.GetPluginCapabilities(identity_pb2.GetPluginCapabilitiesRequest(), timeout=5)
    assert frozenset(again.capabilities) == capabilities, (
        "GetPluginCapabilities answered differently within one process"
    )


def test_probe_answers(client: PluginClient) -> None:
    probe = client.probe()
    if not probe.ready:
        assert probe.message, "Probe says not ready but gives no message saying why"
