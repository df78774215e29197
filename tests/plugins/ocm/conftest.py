"""Fixtures of the OCM plugin tests: hub apiservers with the upstream OCM CRDs and the hub's
ManagedCluster webhook, the emulator, plugins."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm import OcmOptions, OcmPlugin, parse_config
from plugins.sdk.client import PluginClient
from tests.plugins.ocm.webhook import managed_cluster_webhook
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import MANAGED_CLUSTER_INFO_CRD, MC, OcmEmulator
from tests.support.upstream import load_upstream_crds

OCM_CRDS = "ocm_*.yaml"
"""The upstream OCM and ClusterCurator CRDs in ../shared/upstream/crds (SOURCES.md)."""
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


def _webhook_active(hub: KubeCluster) -> bool:
    """True once the apiserver calls the webhook: a new taint with timeAdded is denied."""
    api = hub.api_client()
    custom = k8s.CustomObjectsApi(api)
    name = "webhook-probe"
    try:
        with contextlib.suppress(ApiException):
            custom.create_cluster_custom_object(
                *MC,
                {
                    "apiVersion": "cluster.open-cluster-management.io/v1",
                    "kind": "ManagedCluster",
                    "metadata": {"name": name},
                    "spec": {"hubAcceptsClient": True},
                },
            )
        probe = {
            "key": "probe.example.com/t",
            "effect": "NoSelect",
            "timeAdded": "2020-01-01T00:00:00Z",
        }
        try:
            custom.patch_cluster_custom_object(*MC, name, {"spec": {"taints": [probe]}})
        except ApiException as exc:
            if exc.status == 400 and "not allowed to set TimeAdded" in str(exc.body):
                custom.delete_cluster_custom_object(*MC, name)
                return True
            raise
        custom.patch_cluster_custom_object(*MC, name, {"spec": {"taints": None}})
        return False
    finally:
        api.close()


def _hub(
    extra_apiserver: Callable[[str], KubeCluster], name: str, workdir: Path
) -> Iterator[KubeCluster]:
    cluster = extra_apiserver(name)
    cluster.install_crds(*load_upstream_crds(OCM_CRDS), MANAGED_CLUSTER_INFO_CRD)
    with managed_cluster_webhook(cluster, workdir):
        wait_for(
            f"the ManagedCluster webhook of {name} is called", lambda: _webhook_active(cluster)
        )
        yield cluster


@pytest.fixture(scope="session")
def hub(
    extra_apiserver: Callable[[str], KubeCluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """The OCM hub: its own apiserver with the upstream OCM CRDs (CEL stripped for 1.20), a
    minimal ManagedClusterInfo schema (no upstream file here) and the hub's ManagedCluster
    mutating webhook served over HTTPS (tests/plugins/ocm/webhook.py)."""
    yield from _hub(extra_apiserver, "ocm-hub", tmp_path_factory.mktemp("ocm-hub-webhook"))


@pytest.fixture(scope="session")
def second_hub(
    extra_apiserver: Callable[[str], KubeCluster], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """Another OCM hub (a kealm virtual hub) set up like `hub`, on its own apiserver."""
    yield from _hub(extra_apiserver, "ocm-hub-2", tmp_path_factory.mktemp("ocm-hub2-webhook"))


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

    def end(self, op_id: str, timeout: float = 30) -> cluster_pb2.Operation:
        """The operation once it has ended (SUCCEEDED or FAILED)."""
        final: cluster_pb2.Operation = wait_for(
            f"operation {op_id} ends",
            lambda: (o := self.client.get_operation(op_id)).state in _ENDED and o,
            timeout=timeout,
        )
        return final


_ENDED = (cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED)

StartPlugin = Callable[..., RunningPlugin]


def failed_curation(
    emulator: OcmEmulator, start_plugin: StartPlugin, name: str, request_id: str
) -> tuple[RunningPlugin, cluster_pb2.Operation]:
    """A curator plugin whose first upgrade of the (new) cluster failed in its curation job."""
    emulator.add_cluster(name, OLD)
    emulator.fail_next_curation(name, "Timed out waiting for monitor upgrade job")
    plugin = start_plugin(curator_config())
    failed = plugin.end(plugin.client.upgrade_control_plane(request_id, name, NEW).id)
    assert failed.state == cluster_pb2.OPERATION_STATE_FAILED, failed
    return plugin, failed


@pytest.fixture
def start_plugin(hub: KubeCluster) -> Iterator[StartPlugin]:
    """start_plugin(config_dict, kubeconfig=None, sync_wait=10): an in-process plugin on the hub."""
    running: list[RunningPlugin] = []

    def start(
        config: dict[str, Any], kubeconfig: Path | None = None, sync_wait: float = 10.0
    ) -> RunningPlugin:
        options = OcmOptions(
            config=parse_config(config),
            # The configuration's hubs, or this one.
            kubeconfig=None if config.get("hubs") else str(kubeconfig or hub.kubeconfig),
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
