"""Helpers of the GKE plugin tests: an emulated GKE fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke import GkePlugin, GkePluginOptions, parse_config
from plugins.sdk.client import PluginClient
from tests.support.gke_emulator import GkeEmulator, OpTiming

T = TypeVar("T")

PROJECT, LOCATION = "p", "l"
OLD = "1.28.5-gke.1200"
NEW = "1.29.1-gke.1589020"
NEWER = "1.29.3-gke.1093000"
NEXT_MINOR = "1.30.2-gke.1587003"
OFFERED = [OLD, NEW, NEWER, NEXT_MINOR]
TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)
NEG = "https://www.googleapis.com/compute/v1/projects/p/zones/l-a/networkEndpointGroups/neg-{}"


def cluster_id(name: str) -> str:
    """projects/p/locations/l/clusters/NAME."""
    return f"projects/{PROJECT}/locations/{LOCATION}/clusters/{name}"


def populate(
    emulator: GkeEmulator,
    names: list[str],
    *,
    backend_scalers: dict[str, float] | None = None,
    pools: tuple[str, ...] = ("default-pool", "workers"),
    web: bool = True,
) -> list[str]:
    """The emulated fleet: clusters at OLD with node pools, GetServerConfig offering OFFERED,
    and (web) a global backend service "web" with one NEG per cluster (capacityScaler 1.0
    unless backend_scalers says otherwise)."""
    emulator.set_server_config(
        PROJECT, LOCATION, master_versions=OFFERED, channels={"REGULAR": [OLD, NEW]}
    )
    ids = []
    for index, name in enumerate(names):
        ids.append(
            emulator.add_cluster(
                cluster_id(name),
                master_version=OLD,
                node_pools=[
                    {
                        "name": pool,
                        "version": OLD,
                        "imageType": "COS_CONTAINERD" if p == 0 else "UBUNTU_CONTAINERD",
                        "nodes": 3,
                        "upgradeSettings": {"maxSurge": 1, "maxUnavailable": 0}
                        if p == 0
                        else {
                            "strategy": "BLUE_GREEN",
                            "blueGreenSettings": {
                                "standardRolloutPolicy": {"batchPercentage": 0.5},
                                "nodePoolSoakDuration": "60s",
                            },
                        },
                    }
                    for p, pool in enumerate(pools)
                ],
                labels={"fleet": "demo", "ring": "canary" if index == 0 else "main"},
            )
        )
    scalers = backend_scalers or {}
    if not web:
        return ids
    emulator.add_backend_service(
        PROJECT,
        "web",
        [{"group": NEG.format(name), "capacityScaler": scalers.get(name, 1.0)} for name in names],
    )
    return ids


def plugin_config(
    emulator: GkeEmulator,
    names: list[str],
    *,
    mode: str = "backendServices",
    state_file: Path | None = None,
    poll_seconds: float = 0.1,
    **extra: Any,
) -> dict[str, Any]:
    """A plugin configuration (as data) for the emulated fleet."""
    data: dict[str, Any] = {
        "clusters": {"ids": [cluster_id(n) for n in names]},
        "traffic": {"mode": mode},
        "api": {
            "containerEndpoint": emulator.endpoint,
            "computeEndpoint": emulator.endpoint,
            "credentials": "anonymous",
        },
        "operations": {"pollSeconds": poll_seconds},
    }
    if mode == "backendServices":
        data["traffic"]["backendServices"] = [{"project": PROJECT, "name": "web"}]
        data["traffic"]["backends"] = {
            cluster_id(n): [f"projects/p/zones/l-a/networkEndpointGroups/neg-{n}"] for n in names
        }
    if state_file is not None:
        data["operations"]["stateFile"] = str(state_file)
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return data


@dataclass
class RunningPlugin:
    """A GKE plugin on loopback and a client of it."""

    plugin: GkePlugin
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address

    def stop(self) -> None:
        self.client.close()
        self.plugin.stop(grace=0)


@contextmanager
def running_plugin(config: dict[str, Any]) -> Iterator[RunningPlugin]:
    """A started plugin with the configuration data; stopped on exit."""
    plugin = GkePlugin(GkePluginOptions(config=parse_config(config), registry=CollectorRegistry()))
    running = RunningPlugin(plugin, PluginClient(plugin.address, caller="gke-tests"))
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


FAST = OpTiming(pending=0.05, running=0.3)
