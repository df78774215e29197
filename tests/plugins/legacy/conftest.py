"""Fixtures of the legacy bridge tests: an original-protocol server and bridges in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from plugins.legacy import BridgeOptions, LegacyBridge
from plugins.sdk.client import PluginClient
from tests.support.legacy_server import LegacyServer, legacy_fleet, legacy_server

OLD, NEW = "1.28.5", "1.29.1"
IDS = [f"projects/demo/locations/europe-west1/clusters/c{i}" for i in range(4)]
POOLS = ("default-pool", "workers")

StartBridge = Callable[..., LegacyBridge]


@pytest.fixture
def upstream() -> Iterator[LegacyServer]:
    """An original-protocol plugin server: four GKE-style clusters at OLD, two pools each."""
    with legacy_server(legacy_fleet(IDS, OLD, POOLS)) as server:
        yield server


@pytest.fixture
def start_bridge(upstream: LegacyServer) -> Iterator[StartBridge]:
    """Starts bridges in front of `upstream` (plaintext, every cluster, fast polling)."""
    bridges: list[LegacyBridge] = []

    def start(**overrides: object) -> LegacyBridge:
        values: dict[str, object] = {
            "upstream": upstream.address,
            "clusters": {cid: {} for cid in IDS},
            "poll_interval": 0.05,
            "listen": "127.0.0.1:0",
            "registry": CollectorRegistry(),
            **overrides,
        }
        bridge = LegacyBridge(BridgeOptions(**values))  # type: ignore[arg-type]
        bridges.append(bridge)
        return bridge

    yield start
    for bridge in bridges:
        bridge.stop(0)


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    """Where a durable bridge keeps its state."""
    return tmp_path / "state" / "legacy.json"


def client_of(bridge: LegacyBridge) -> PluginClient:
    """A contract client of the bridge (close it, or use it in a with block)."""
    return PluginClient(bridge.address, caller="legacy-test")
