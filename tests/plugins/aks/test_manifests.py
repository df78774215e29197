"""manifests/aks stays consistent with the plugin: the ConfigMap parses, the sidecar's flags and
mounts match it, the example ClusterVersion is accepted by the CRD, workload identity is wired,
and the Azure role grants exactly the actions the plugin's ARM calls need."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from orchestrator import api
from plugins.aks import parse_config
from plugins.aks.ids import parse_cluster_id
from plugins.aks.server import build_parser
from tests.plugins.aks.conftest import NAMES
from tests.plugins.aks.support import (
    NEW,
    OLD,
    SUBSCRIPTION,
    cluster_id,
    plugin_config,
    running_plugin,
)
from tests.support.aks_emulator import AksEmulator
from tests.support.kube import KubeCluster
from tests.support.plugin_harness import wait_terminal

AKS = Path(__file__).resolve().parents[3] / "manifests" / "aks"
_RP = "Microsoft.ContainerService"
# Each ARM route the emulator serves (the SDK operation's name) and the Azure RBAC action it
# needs (Azure resource provider operations, Microsoft.ContainerService).
ACTION_OF_ROUTE = {
    "ManagedClusters.List": f"{_RP}/managedClusters/read",
    "ManagedClusters.ListByResourceGroup": f"{_RP}/managedClusters/read",
    "ManagedClusters.Get": f"{_RP}/managedClusters/read",
    "ManagedClusters.CreateOrUpdate": f"{_RP}/managedClusters/write",
    "ManagedClusters.GetUpgradeProfile": f"{_RP}/managedClusters/upgradeProfiles/read",
    "MaintenanceConfigurations.ListByManagedCluster": (
        f"{_RP}/managedClusters/maintenanceConfigurations/read"
    ),
    "AgentPools.List": f"{_RP}/managedClusters/agentPools/read",
    "AgentPools.Get": f"{_RP}/managedClusters/agentPools/read",
    "AgentPools.CreateOrUpdate": f"{_RP}/managedClusters/agentPools/write",
    "AgentPools.GetUpgradeProfile": f"{_RP}/managedClusters/agentPools/upgradeProfiles/read",
    "AgentPools.UpgradeNodeImageVersion": (
        f"{_RP}/managedClusters/agentPools/upgradeNodeImageVersion/action"
    ),
    "Operations.Get": f"{_RP}/locations/operations/read",
    "OperationResults.Get": f"{_RP}/locations/operationresults/read",
}


def _load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((AKS / name).read_text()))


def _sidecar() -> dict[str, Any]:
    containers = _load("deployment-patch.yaml")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "plugin-aks")


def _config_data() -> Any:
    return yaml.safe_load(_load("plugin-config.yaml")["data"]["config.yaml"])


def test_the_configmap_is_a_valid_plugin_configuration() -> None:
    config = parse_config(_config_data(), "plugin-config.yaml")
    assert config.api.credentials == "workloadIdentity"
    assert config.api.endpoint == "https://management.azure.com"
    sidecar = _sidecar()
    args = build_parser().parse_args(sidecar["args"])
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["plugin-aks-config"])
    assert Path(config.operations.state_file).parent == Path(mounts["plugin-aks-state"])
    assert args.listen.startswith("127.0.0.1:")
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    labels = _load("deployment-patch.yaml")["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"


def test_the_example_clusterversion_targets_the_configured_clusters(
    control_plane: KubeCluster, namespace: str
) -> None:
    example = _load("clusterversion.yaml")
    config = parse_config(_config_data())
    ids = [c["id"] for c in example["spec"]["clusters"]]
    assert all(parse_cluster_id(i) for i in ids)
    assert {parse_cluster_id(i).id for i in ids if parse_cluster_id(i)} <= set(config.clusters.ids)
    port = _sidecar()["args"][1].rsplit(":", 1)[1]
    assert example["spec"]["opsEndpoint"]["endpoint"] == f"localhost:{port}"
    objects = k8s.CustomObjectsApi(control_plane.api_client())
    created = objects.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, example
    )
    assert created["spec"]["clusters"][0]["version"] == example["spec"]["clusters"][0]["version"]


def test_the_overlay_builds_with_the_aks_sidecar_instead_of_the_sim() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the kustomize build is checked where it is")
    built = subprocess.run(
        [kubectl, "kustomize", str(AKS)], capture_output=True, check=True, timeout=60
    )
    docs = list(yaml.safe_load_all(built.stdout))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["orchestrator", "plugin-aks"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["azure.workload.identity/use"] == "true"
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"]["azure.workload.identity/client-id"]
    assert any(
        d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fleet-plugin-aks" for d in docs
    )


def test_the_role_grants_exactly_what_the_plugins_calls_need(tmp_path: Path) -> None:
    role = json.loads((AKS / "role-definition.json").read_text())
    assert role["IsCustom"] is True
    assert role["NotActions"] == role["DataActions"] == role["NotDataActions"] == []
    assert all("*" not in action for action in role["Actions"])
    # Every kind of ARM call the plugin makes, against the emulator: inventory by subscription
    # and by resource group, preflight, control-plane, pool and node-image upgrades, a restart
    # that resumes an operation.
    with AksEmulator(op_seconds=0.2) as emulator:
        from tests.plugins.aks.support import populate

        populate(emulator, NAMES)
        config = plugin_config(
            emulator,
            NAMES,
            state_file=tmp_path / "ops.jsonl",
            upgrades={"nodeImageWhenCurrent": True},
        )
        config["clusters"]["discover"] = [{"subscription": SUBSCRIPTION}]
        with running_plugin(emulator, config) as plugin:
            client = plugin.client
            assert len(client.list_clusters()) == len(NAMES)
            client.preflight_upgrade(cluster_id("c1"), NEW, {"user": NEW})
            wait_terminal(client, client.upgrade_control_plane("cp", cluster_id("c1"), NEW).id)
            wait_terminal(client, client.upgrade_node_pool("np", cluster_id("c1"), "user", NEW).id)
            wait_terminal(client, client.upgrade_node_pool("im", cluster_id("c2"), "user", OLD).id)
        single = plugin_config(emulator, NAMES)
        with running_plugin(emulator, single) as plugin:
            plugin.client.get_cluster(cluster_id("c3"))
        used = {name for name, _ in emulator.state.calls}
    needed = {ACTION_OF_ROUTE[name] for name in used}
    assert set(role["Actions"]) == needed, sorted(used)
