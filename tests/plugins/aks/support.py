"""Helpers of the AKS plugin tests: an emulated AKS fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.aks import AksPlugin, AksPluginOptions, parse_config
from plugins.sdk.client import PluginClient
from tests.support.aks_emulator import AksEmulator

T = TypeVar("T")

SUBSCRIPTION = "00000000-0000-0000-0000-0000000000a1"
GROUP = "fleet-rg"
LOCATION = "westeurope"
OLD = "1.29.7"
NEW = "1.30.3"
NEWER = "1.30.5"
NEXT_MINOR = "1.31.2"
OFFERED = [OLD, "1.29.9", NEW, NEWER, NEXT_MINOR]
POOLS = ("system", "user")
TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)
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


@dataclass
class RunningPlugin:
    """An AKS plugin on loopback and a client of it."""

    plugin: AksPlugin
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address

    def stop(self) -> None:
        self.client.close()
        self.plugin.stop(grace=0)


def launch_plugin(emulator: AksEmulator, config: dict[str, Any]) -> RunningPlugin:
    """A started plugin with the configuration data, its token from the emulator."""
    plugin = AksPlugin(
        AksPluginOptions(
            config=parse_config(config),
            registry=CollectorRegistry(),
            credential=emulator.credential(),
        )
    )
    return RunningPlugin(plugin, PluginClient(plugin.address, caller="aks-tests"))


@contextmanager
def running_plugin(emulator: AksEmulator, config: dict[str, Any]) -> Iterator[RunningPlugin]:
    running = launch_plugin(emulator, config)
    try:
        yield running
    finally:
        running.stop()


def wait_until(predicate: Callable[[], T | None], timeout: float = 15.0, what: str = "") -> T:
    """Polls predicate until it returns a truthy value; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def wait_terminal(client: PluginClient, op_id: str, timeout: float = 15.0) -> cluster_pb2.Operation:
    """Polls GetOperation until the operation is SUCCEEDED or FAILED."""
    return wait_until(
        lambda: op if (op := client.get_operation(op_id)).state in TERMINAL else None,
        timeout,
        f"operation {op_id} terminal",
    )
