"""What every provider plugin's tests need around a plugin: a started plugin with a client of it,
waits for a condition and for an operation to end, and the conformance kit's outcome by check.

One home for what the GKE, EKS and AKS plugin tests (and the sim's and the legacy bridge's
conformance tests) each wrote; what is particular to a provider (its emulator, its config,
its constants) stays in tests/plugins/<name>/support.py.
"""

from __future__ import annotations

import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pytest
from kubernetes import client as k8s

from fleetupgrade.plugin.v1 import cluster_pb2
from orchestrator import api
from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.conformance import run_conformance
from tests.support.kube import KubeCluster
from tests.support.orchestrator import OrchestratorProcess

__all__ = [
    "TERMINAL",
    "FloorSampler",
    "RunningPlugin",
    "composed_fleet_provider",
    "kit_outcome",
    "orchestrator_process",
    "serving",
    "started",
    "wait_terminal",
    "wait_until",
]

T = TypeVar("T")

#: The states after which an operation never changes.
TERMINAL = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)


class _Served(Protocol):
    """A plugin server (plugins.sdk.FleetServer): its address, and a stop."""

    @property
    def address(self) -> str: ...

    def stop(self, grace: float | None = ...) -> object: ...


P = TypeVar("P", bound=_Served)


@dataclass
class RunningPlugin(Generic[P]):
    """A plugin on loopback and a client of it."""

    plugin: P
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address

    def stop(self) -> None:
        self.client.close()
        self.plugin.stop(grace=0)


def started(plugin: P, caller: str) -> RunningPlugin[P]:
    """The plugin, started already, with a client that names itself caller."""
    return RunningPlugin(plugin, PluginClient(plugin.address, caller=caller))


@contextmanager
def serving(plugin: P, caller: str) -> Iterator[RunningPlugin[P]]:
    """The started plugin and a client of it; both stopped on exit."""
    running = started(plugin, caller)
    try:
        yield running
    finally:
        running.stop()


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 15.0,
    what: str = "",
    interval: float = 0.05,
) -> T:
    """Polls predicate every interval seconds until it returns a truthy value; fails (an
    AssertionError naming what) after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        time.sleep(interval)


def wait_terminal(client: PluginClient, op_id: str, timeout: float = 15.0) -> cluster_pb2.Operation:
    """Polls GetOperation until the operation is SUCCEEDED or FAILED."""
    return wait_until(
        lambda: op if (op := client.get_operation(op_id)).state in TERMINAL else None,
        timeout,
        f"operation {op_id} terminal",
    )


def kit_outcome(
    address: str,
    report: Path,
    tls: ClientTLS | None = None,
    restart: Callable[[], None] | None = None,
) -> dict[str, list[str]]:
    """Runs the conformance kit (plugins.sdk.conformance) against the plugin at address and
    returns its checks by outcome: passed, failed, skipped (names), and "skipped, why" ("name:
    the kit's reason"); fails unless every check passed or was skipped. report: where the kit's
    JUnit XML goes."""
    code = run_conformance(
        address,
        tls,
        timeout=30.0,
        pytest_args=["-q", f"--junitxml={report}"],
        restart=restart,
    )
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": [], "skipped, why": []}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            outcome["failed"].append(name)
        elif (skipped := case.find("skipped")) is not None:
            outcome["skipped"].append(name)
            outcome["skipped, why"].append(f"{name}: {skipped.get('message', '')}")
        else:
            outcome["passed"].append(name)
    assert code == 0, outcome["failed"]
    return outcome


class FloorSampler:
    """Samples a fleet every 10 ms while in its `with` block: `sample()` (the callable given, or
    a subclass's method) says how many clusters serve (available and in service) and how many
    are out of service right now; kept are every count that served and the most out at once."""

    def __init__(self, sample: Callable[[], tuple[int, int]] | None = None) -> None:
        self._sample = sample
        self._stop = threading.Event()
        self.samples: list[int] = []
        self.most_out = 0
        self._thread = threading.Thread(target=self._run, name="floor-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            serving, out = self.sample()
            self.samples.append(serving)
            self.most_out = max(self.most_out, out)

    def sample(self) -> tuple[int, int]:
        """(clusters serving, clusters out of service) now."""
        assert self._sample is not None, "give FloorSampler a sample() or override it"
        return self._sample()

    def __enter__(self) -> FloorSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture(name="orchestrator")
def orchestrator_process(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> Iterator[OrchestratorProcess]:
    """Fixture `orchestrator`: the real `fleet-orchestrator run` on the test's namespace (a test
    module that imports this function gets it); stopped after the test."""
    proc = OrchestratorProcess(control_plane.kubeconfig, namespace, tmp_path / "orchestrator.log")
    yield proc.start()
    proc.stop()


@contextmanager
def composed_fleet_provider(
    cluster: KubeCluster,
    namespace: str,
    hub: tuple[str, str],
    upgrades: tuple[str, str],
    cluster_id: str,
) -> Iterator[str]:
    """A platform admin's FleetProviders for a composition (README, "Composing providers"):
    the hub plugin (inventory and traffic) and the upgrades plugin, each allowing nobody on its
    own, and their composition allowing namespace, with the upgrades part's clusterId template;
    deleted afterwards. hub, upgrades: (a name prefix, the plugin's endpoint). Yields the
    composition's name."""
    objects = k8s.CustomObjectsApi(cluster.api_client())
    token = uuid.uuid4().hex[:6]
    hub_name, up_name = f"{hub[0]}-{token}", f"{upgrades[0]}-{token}"
    composed = f"{hub[0]}-{upgrades[0]}-{token}"
    specs: dict[str, dict[str, Any]] = {
        hub_name: {"endpoint": hub[1], "insecure": True, "allowedNamespaces": {}},
        up_name: {"endpoint": upgrades[1], "insecure": True, "allowedNamespaces": {}},
        composed: {
            "parts": {
                "inventory": {"name": hub_name},
                "traffic": {"name": hub_name},
                "upgrades": {"name": up_name, "clusterId": cluster_id},
            },
            "allowedNamespaces": {"names": [namespace]},
        },
    }
    for name, spec in specs.items():
        objects.create_cluster_custom_object(
            api.GROUP,
            api.VERSION,
            api.FLEET_PROVIDER_PLURAL,
            {
                "apiVersion": api.API_VERSION,
                "kind": api.FLEET_PROVIDER_KIND,
                "metadata": {"name": name},
                "spec": spec,
            },
        )
    try:
        yield composed
    finally:
        for name in specs:
            objects.delete_cluster_custom_object(
                api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, name
            )
