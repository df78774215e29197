"""manifests/gke stays consistent with the plugin: the ConfigMap parses, the sidecar's flags and
mounts match it, and the example ClusterVersion is accepted by the CRD."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from orchestrator import api
from plugins.gke import parse_config
from plugins.gke.ids import parse_cluster_id
from plugins.gke.server import build_parser
from tests.support.kube import KubeCluster

GKE = Path(__file__).resolve().parents[3] / "manifests" / "gke"


def _load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((GKE / name).read_text()))


def _sidecar() -> dict[str, Any]:
    containers = _load("deployment-patch.yaml")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "plugin-gke")


def test_the_configmap_is_a_valid_plugin_configuration() -> None:
    config = parse_config(
        yaml.safe_load(_load("plugin-config.yaml")["data"]["config.yaml"]), "plugin-config.yaml"
    )
    assert config.api.credentials == "default" and not config.api.container_endpoint
    assert config.traffic.mode == "backendServices"
    assert set(config.traffic.backends) <= set(config.clusters.ids)
    sidecar = _sidecar()
    args = build_parser().parse_args(sidecar["args"])
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["plugin-gke-config"])
    assert Path(config.operations.state_file).parent == Path(mounts["plugin-gke-state"])
    assert args.listen.startswith("127.0.0.1:")


def test_the_example_clusterversion_targets_the_configured_clusters(
    control_plane: KubeCluster, namespace: str
) -> None:
    example = _load("clusterversion.yaml")
    config = parse_config(yaml.safe_load(_load("plugin-config.yaml")["data"]["config.yaml"]))
    ids = [c["id"] for c in example["spec"]["clusters"]]
    assert all(parse_cluster_id(i) for i in ids) and set(ids) <= set(config.clusters.ids)
    port = _sidecar()["args"][1].rsplit(":", 1)[1]
    assert example["spec"]["opsEndpoint"]["endpoint"] == f"localhost:{port}"
    objects = k8s.CustomObjectsApi(control_plane.api_client())
    created = objects.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, example
    )
    assert created["spec"]["clusters"][0]["version"] == example["spec"]["clusters"][0]["version"]


def test_the_overlay_builds_with_the_gke_sidecar_instead_of_the_sim() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the kustomize build is checked where it is")
    built = subprocess.run(
        [kubectl, "kustomize", str(GKE)], capture_output=True, check=True, timeout=60
    )
    docs = list(yaml.safe_load_all(built.stdout))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["orchestrator", "plugin-gke"]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"].endswith(
        ".iam.gserviceaccount.com"
    )
    assert any(
        d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fleet-plugin-gke" for d in docs
    )
