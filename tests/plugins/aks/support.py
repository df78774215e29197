"""Helpers of the AKS plugin tests: an emulated AKS fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from plugins.aks import AksPlugin, AksPluginOptions, parse_config
from tests.support.aks_emulator import AksEmulator
from tests.support.plugin_harness import (  # the tests import them from here too
    RunningPlugin,
    serving,
    started,
)

SUBSCRIPTION = "00000000-0000-0000-0000-0000000000a1"
GROUP = "fleet-rg"
LOCATION = "westeurope"
OLD = "1.29.7"
NEW = "1.30.3"
NEWER = "1.30.5"
NEXT_MINOR = "1.31.2"
OFFERED = [OLD, "1.29.9", NEW, NEWER, NEXT_MINOR]
POOLS = ("system", "user")
FAST = 0.3  # seconds an emulated ARM operation runs


def cluster_id(name: str, group: str = GROUP) -> str:
    """The plugin's id of a cluster: its ARM resource id (lower-case values)."""
    return (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{group}/providers/"
        f"Microsoft.ContainerService/managedClusters/{name}"
    )


def populate(emulator: AksEmulator, names: list[str], *, group: str = GROUP) -> list[str]:
    """Clusters at OLD with pools system (System mode) and user, tagged fleet=demo and ring
    canary (the first) or main; the region offers OFFERED."""
    emulator.set_versions(LOCATION, OFFERED)
    return [
        emulator.add_cluster(
            cluster_id(name, group),
            location=LOCATION,
            version=OLD,
            pools=[{"name": "system", "mode": "System"}, {"name": "user"}],
            tags={"fleet": "demo", "ring": "canary" if index == 0 else "main"},
        )
        for index, name in enumerate(names)
    ]


def plugin_config(
    emulator: AksEmulator,
    names: list[str] | None = None,
    *,
    state_file: Path | None = None,
    traffic: str = "recordOnly",
    poll_seconds: float = 0.1,
    **extra: Any,
) -> dict[str, Any]:
    """A plugin configuration (as data) for the emulated fleet: the named clusters by id, or
    the whole resource group by discovery."""
    clusters: dict[str, Any] = (
        {"ids": [cluster_id(n) for n in names]}
        if names is not None
        else {"discover": [{"subscription": SUBSCRIPTION, "resourceGroup": GROUP}]}
    )
    data: dict[str, Any] = {
        "clusters": clusters,
        "api": {"endpoint": emulator.endpoint, "caFile": emulator.ca_file},
        "operations": {"pollSeconds": poll_seconds},
        "traffic": {"mode": traffic},
    }
    if state_file is not None:
        data["operations"]["stateFile"] = str(state_file)
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def _plugin(emulator: AksEmulator, config: dict[str, Any]) -> AksPlugin:
    """A started plugin with the configuration data, its token from the emulator."""
    return AksPlugin(
        AksPluginOptions(
            config=parse_config(config),
            registry=CollectorRegistry(),
            credential=emulator.credential(),
        )
    )


def launch_plugin(emulator: AksEmulator, config: dict[str, Any]) -> RunningPlugin[AksPlugin]:
    """A started plugin and a client of it (the caller stops it)."""
    return started(_plugin(emulator, config), "aks-tests")


def running_plugin(
    emulator: AksEmulator, config: dict[str, Any]
) -> AbstractContextManager[RunningPlugin[AksPlugin]]:
    """A started plugin and a client of it; stopped on exit."""
    return serving(_plugin(emulator, config), "aks-tests")
