"""Helpers of the sim tests: small fleet files, a running sim with its client, polling waits."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.client import PluginClient
from plugins.sim import Simulator
from tests.support.plugin_harness import wait_until as harness_wait_until

T = TypeVar("T")

TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)


def small_fleet(count: int = 3, step: float = 0.05, **extra: Any) -> dict[str, Any]:
    """A fleet file as data: c1..cN at 1.28.5 with pools p1 and p2, stage a/b alternating."""
    clusters = [
        {
            "id": f"c{i}",
            "labels": {"stage": "a" if i % 2 else "b", "n": str(i)},
            "controlPlaneVersion": "1.28.5",
            "nodePools": [
                {"name": "p1", "version": "1.28.5"},
                {"name": "p2", "version": "1.28.5"},
            ],
        }
        for i in range(1, count + 1)
    ]
    data: dict[str, Any] = {
        "defaults": {
            "stepSeconds": {
                "serviceOut": step,
                "serviceIn": step,
                "controlPlane": step,
                "nodePool": step,
            },
            "jitter": 0,
        },
        "clusters": clusters,
    }
    data.update(extra)
    return data


def admin_request(url: str, method: str, body: Any = None) -> tuple[int, Any]:
    """One JSON request to the sim's admin endpoint: (HTTP status, decoded body)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_until(predicate: Callable[[], T | None], timeout: float = 10.0, what: str = "") -> T:
    """tests.support.plugin_harness.wait_until, polling every 10 ms (the sim is fast)."""
    return harness_wait_until(predicate, timeout, what, interval=0.01)


@dataclass
class RunningSim:
    """A Simulator started in this process, a client of it, and where its outputs go."""

    sim: Simulator
    client: PluginClient
    registry: CollectorRegistry
    monitor_file: Path

    def monitor(self) -> dict[str, Any]:
        """The monitor file's content, once it has caught up with every change made so far."""
        sequence = self.sim.monitor.snapshot()["sequence"]

        def _current() -> dict[str, Any] | None:
            data: dict[str, Any] = json.loads(self.monitor_file.read_text())
            return data if data["sequence"] >= sequence else None

        return wait_until(_current, what=f"the monitor file at sequence {sequence}")

    def wait_monitor(
        self, predicate: Callable[[dict[str, Any]], bool], what: str
    ) -> dict[str, Any]:
        """Polls the monitor file until predicate holds for its content."""

        def _check() -> dict[str, Any] | None:
            data = self.monitor()
            return data if predicate(data) else None

        return wait_until(_check, what=what)

    def finish(self, op: cluster_pb2.Operation, timeout: float = 10.0) -> cluster_pb2.Operation:
        """Polls GetOperation until op is SUCCEEDED or FAILED."""

        def _done() -> cluster_pb2.Operation | None:
            current = self.client.get_operation(op.id)
            return current if current.state in TERMINAL else None

        return wait_until(_done, timeout, f"operation {op.id} to end")

    @property
    def admin_url(self) -> str:
        assert self.sim.admin is not None
        return f"http://{self.sim.admin.address}"
