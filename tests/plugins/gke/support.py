"""Helpers of the GKE plugin tests: an emulated GKE fleet, plugin configs pointing at it, waits."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from plugins.gke import GkePlugin, GkePluginOptions, parse_config
from tests.support.gke_emulator import GkeEmulator, OpTiming
from tests.support.plugin_harness import (  # the tests import them from here too
    RunningPlugin,
    serving,
)

PROJECT, LOCATION = "p", "l"
OLD = "1.28.5-gke.1200"
NEW = "1.29.1-gke.1589020"
NEWER = "1.29.3-gke.1093000"
NEXT_MINOR = "1.30.2-gke.1587003"
OFFERED = [OLD, NEW, NEWER, NEXT_MINOR]
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


def running_plugin(config: dict[str, Any]) -> AbstractContextManager[RunningPlugin[GkePlugin]]:
    """A started plugin with the configuration data and a client of it; stopped on exit."""
    options = GkePluginOptions(config=parse_config(config), registry=CollectorRegistry())
    return serving(GkePlugin(options), "gke-tests")


FAST = OpTiming(pending=0.05, running=0.3)
