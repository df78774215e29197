"""Fixtures of the legacy bridge tests: an original-protocol server and bridges in front of it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from plugins.legacy import BridgeOptions, LegacyBridge
from plugins.sdk.client import PluginCallError, PluginClient
from tests.support.kube import wait_for
from tests.support.legacy_server import LegacyServer, legacy_fleet, legacy_server
from tests.support.orchestrator import ROOT, free_port

OLD, NEW = "1.28.5", "1.29.1"
IDS = [f"projects/demo/locations/europe-west1/clusters/c{i}" for i in range(4)]
POOLS = ("default-pool", "workers")

StartBridge = Callable[..., LegacyBridge]
COMMAND = [str(Path(sys.executable).parent / "fleet-plugin-legacy")]  # the console script


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


def _ready(client: PluginClient) -> bool:
    try:
        return client.probe().ready
    except PluginCallError:
        return False  # not listening yet (slow start under load)


@contextmanager
def bridge_process(
    args: list[str], log: Path, port: int = 0
) -> Iterator[tuple[subprocess.Popen[bytes], PluginClient]]:
    """fleet-plugin-legacy as a child process on 127.0.0.1:port (0: a free one), once ready;
    killed on exit if still running."""
    port = port or free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*COMMAND, "--listen", f"127.0.0.1:{port}", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with PluginClient(f"127.0.0.1:{port}") as client:
            try:
                wait_for("the bridge is ready", lambda: _ready(client), timeout=30, interval=0.2)
            except TimeoutError:
                pytest.fail(f"bridge not ready:\n{log.read_text()[-3000:]}")
            yield proc, client
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
