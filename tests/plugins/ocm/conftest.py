"""Fixtures of the OCM plugin tests: the hub apiserver with OCM's CRDs, the emulator, plugins."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devtools.controlplane import REPO_ROOT
from plugins.ocm import OcmOptions, OcmPlugin, parse_config
from plugins.sdk.client import PluginClient
from tests.support.kube import KubeCluster
from tests.support.ocm_emulator import OcmEmulator

OCM_CRDS = REPO_ROOT / "manifests" / "ocm" / "crds"
OLD, NEW = "1.28.5", "1.29.1"

PLAN_TEMPLATE: dict[str, Any] = {
    "apiVersion": "upgrade.cattle.io/v1",
    "kind": "Plan",
    "metadata": {
        "name": "control-plane",
        "namespace": "system-upgrade",
        "labels": {"fleetupgrade.io/cluster": "{{cluster}}"},
    },
    "spec": {
        "version": "v{{version}}",
        "concurrency": 1,
        "cordon": True,
        "serviceAccountName": "system-upgrade",
        "nodeSelector": {
            "matchExpressions": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
            ]
        },
        "upgrade": {"image": "rancher/k3s-upgrade"},
    },
}

PLAN_FEEDBACK: dict[str, Any] = {
    "jsonPaths": [
        {"name": "complete", "path": '.status.conditions[?(@.type=="Complete")].status'},
        {"name": "reason", "path": '.status.conditions[?(@.type=="Complete")].reason'},
        {"name": "message", "path": '.status.conditions[?(@.type=="Complete")].message'},
        {"name": "latestVersion", "path": ".status.latestVersion"},
    ],
    "succeeded": {"name": "complete", "value": "True"},
    "failed": {"name": "reason", "value": "JobFailed"},
    "message": "message",
}


def curator_config(**extra: Any) -> dict[str, Any]:
    """A ClusterCurator configuration (short monitorTimeout for tests)."""
    return {"upgradeMethod": "ClusterCurator", "monitorTimeout": "60s", **extra}


def work_config(**extra: Any) -> dict[str, Any]:
    """A ManifestWork configuration delivering a system-upgrade-controller Plan."""
    return {
        "upgradeMethod": "ManifestWork",
        "monitorTimeout": "60s",
        "manifestWork": {"template": PLAN_TEMPLATE, "resource": "plans", "feedback": PLAN_FEEDBACK},
        **extra,
    }


@pytest.fixture(scope="session")
def hub(extra_apiserver: Callable[[str], KubeCluster]) -> KubeCluster:
    """The OCM hub: its own apiserver with the minimal OCM CRDs of manifests/ocm/crds."""
    cluster = extra_apiserver("ocm-hub")
    cluster.install_crds(OCM_CRDS)
    return cluster


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Callable[[int], list[str]]:
    """names(n): n fresh cluster names for this test, sorted (c0, c1, ...)."""
    token = uuid.uuid4().hex[:5]

    def make(count: int) -> list[str]:
        return [f"mc-{token}-{i}" for i in range(count)]

    return make


@pytest.fixture
def emulator(hub: KubeCluster) -> Iterator[OcmEmulator]:
    """The OCM agent emulator on the hub; the clusters it registered are removed afterwards."""
    emu = OcmEmulator(hub, upgrade_seconds=0.6).start()
    yield emu
    emu.stop()
    for name in emu.cluster_names():
        emu.remove_cluster(name)


@dataclass
class RunningPlugin:
    """A plugin on loopback and a client for it."""

    plugin: OcmPlugin
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address


StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture
def start_plugin(hub: KubeCluster) -> Iterator[StartPlugin]:
    """start_plugin(config_dict, kubeconfig=None, sync_wait=10): an in-process plugin on the hub."""
    running: list[RunningPlugin] = []

    def start(
        config: dict[str, Any], kubeconfig: Path | None = None, sync_wait: float = 10.0
    ) -> RunningPlugin:
        options = OcmOptions(
            config=parse_config(config),
            kubeconfig=str(kubeconfig or hub.kubeconfig),
            registry=CollectorRegistry(),
            sync_wait=sync_wait,
        )
        plugin = OcmPlugin(options)
        handle = RunningPlugin(plugin, PluginClient(plugin.address, caller="ocm-tests"))
        running.append(handle)
        return handle

    yield start
    for handle in reversed(running):
        handle.client.close()
        handle.plugin.stop(grace=0)
