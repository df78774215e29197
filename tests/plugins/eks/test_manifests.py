"""manifests/eks stays consistent with the plugin: the ConfigMap parses, the sidecar's flags and
mounts match it, the example ClusterVersion is accepted by the CRD and names configured
clusters, and the IAM policy grants exactly the EKS actions the plugin calls."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import boto3
import grpc
import pytest
import yaml
from kubernetes import client as k8s

from orchestrator import api
from orchestrator.adapters.webhook import admit
from plugins.eks import parse_config
from plugins.eks.ids import parse_cluster_id
from plugins.eks.server import build_parser
from plugins.sdk.client import PluginCallError
from tests.plugins.eks.conftest import NAMES, StartPlugin
from tests.plugins.eks.support import NEW, OLD, REGION, cluster_id, route53_traffic
from tests.support.eks_emulator import EksEmulator
from tests.support.eks_emulator.route53 import Route53Emulator
from tests.support.kube import KubeCluster
from tests.support.plugin_harness import wait_terminal

EKS = Path(__file__).resolve().parents[3] / "manifests" / "eks"


def _load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EKS / name).read_text()))


def _sidecar() -> dict[str, Any]:
    containers = _load("deployment-patch.yaml")["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "plugin-eks")


def _config() -> Any:
    return parse_config(
        yaml.safe_load(_load("plugin-config.yaml")["data"]["config.yaml"]), "plugin-config.yaml"
    )


def test_the_configmap_is_a_valid_plugin_configuration() -> None:
    config = _config()
    assert not config.api.endpoint and config.traffic.mode == "route53"
    assert config.traffic.route53 is not None and not config.traffic.route53.endpoint
    sidecar = _sidecar()
    args = build_parser().parse_args(sidecar["args"])
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert Path(args.config).parent == Path(mounts["plugin-eks-config"])
    assert Path(config.operations.state_file).parent == Path(mounts["plugin-eks-state"])
    assert args.listen.startswith("127.0.0.1:")
    env = {e["name"] for e in sidecar["env"]}
    assert not env & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
    account = _load("serviceaccount-patch.yaml")
    role = account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert role.startswith(f"arn:aws:iam::{config.account}:role/")


def test_the_example_clusterversion_targets_the_configured_clusters(
    control_plane: KubeCluster, namespace: str
) -> None:
    example = _load("clusterversion.yaml")
    config = _config()
    refs = [parse_cluster_id(c["id"]) for c in example["spec"]["clusters"]]
    assert all(r and r.account == config.account and r.region in config.regions for r in refs)
    assert {c["version"] for c in example["spec"]["clusters"]} == {"1.30"}
    assert config.traffic.route53 is not None
    assert set(config.traffic.route53.records) == {c["id"] for c in example["spec"]["clusters"]}
    port = _sidecar()["args"][1].rsplit(":", 1)[1]
    assert example["spec"]["opsEndpoint"]["endpoint"] == f"localhost:{port}"
    request = {
        "operation": "CREATE",
        "kind": {"group": api.GROUP, "version": api.VERSION, "kind": api.KIND},
        "namespace": namespace,
        "object": example,
    }
    assert admit(request) == []  # the admission webhook's judgement
    objects = k8s.CustomObjectsApi(control_plane.api_client())
    created = objects.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, example
    )
    assert created["spec"]["clusters"][0]["version"] == "1.30"


def _policy_actions() -> tuple[set[str], dict[str, set[str]]]:
    policy = json.loads((EKS / "iam-policy.json").read_text())
    actions: set[str] = set()
    by_resource: dict[str, set[str]] = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert all(a.startswith(("eks:", "route53:")) and "*" not in a for a in statement["Action"])
        actions.update(statement["Action"])
        by_resource.setdefault(statement["Resource"], set()).update(statement["Action"])
    return actions, by_resource


def test_the_iam_policy_grants_exactly_the_actions_the_plugin_calls(
    emulator: EksEmulator, route53: Route53Emulator, start_plugin: StartPlugin
) -> None:
    emulator.add_insight(REGION, "c2", NEW, "ERROR", "deprecated APIs", "APIs")
    client = start_plugin(traffic=route53_traffic(route53, NAMES)).client
    client.list_clusters()
    client.probe()
    client.preflight_upgrade(cluster_id("c2"), NEW, {})
    client.preflight_upgrade(cluster_id("c1"), NEW, {"workers": NEW})
    emulator.held = True
    op = client.upgrade_control_plane("r-cp", cluster_id("c1"), NEW)
    with pytest.raises(PluginCallError) as busy:
        client.upgrade_control_plane("r-busy", cluster_id("c1"), NEW)
    assert busy.value.code == grpc.StatusCode.ABORTED
    emulator.held = False
    wait_terminal(client, client.service_out("r-out", cluster_id("c3")).id)
    wait_terminal(client, client.service_in("r-in", cluster_id("c3")).id)
    wait_terminal(client, op.id)
    np = client.upgrade_node_pool("r-np", cluster_id("c1"), "workers", NEW)
    wait_terminal(client, np.id)
    eks = boto3.client("eks", region_name=REGION, endpoint_url=emulator.endpoint)
    emulator.held = True
    outside = eks.update_nodegroup_version(clusterName="c4", nodegroupName="system", version=OLD)
    with pytest.raises(PluginCallError) as found:  # the update found with ListUpdates
        client.upgrade_control_plane("r-c4", cluster_id("c4"), NEW)
    assert found.value.metadata["operation_id"].endswith(outside["update"]["id"])
    assert outside["update"]["status"] == "InProgress"
    actions, by_resource = _policy_actions()
    called = {f"eks:{n}" for n in emulator.called()} | {f"route53:{n}" for n in route53.called()}
    assert called == actions
    # Account-wide only what has no resource; upgrades scoped to the account's clusters,
    # record changes to the configured zone, names, types and to UPSERT.
    assert by_resource["*"] == {"eks:ListClusters", "eks:DescribeClusterVersions"}
    assert "eks:UpdateClusterVersion" in by_resource["arn:aws:eks:*:123456789012:cluster/*"]
    config = _config()
    assert config.traffic.route53 is not None
    records = [r for rs in config.traffic.route53.records.values() for r in rs]
    zones = {f"arn:aws:route53:::hostedzone/{r.hosted_zone_id}" for r in records}
    assert {
        res for res, acts in by_resource.items() if "route53:ChangeResourceRecordSets" in acts
    } == zones
    policy = json.loads((EKS / "iam-policy.json").read_text())
    change = next(
        s for s in policy["Statement"] if "route53:ChangeResourceRecordSets" in s["Action"]
    )
    condition = change["Condition"]["ForAllValues:StringEquals"]
    assert condition["route53:ChangeResourceRecordSetsActions"] == ["UPSERT"]
    assert set(condition["route53:ChangeResourceRecordSetsNormalizedRecordNames"]) == {
        r.name.rstrip(".") for r in records
    }
    assert set(condition["route53:ChangeResourceRecordSetsRecordTypes"]) == {
        r.type for r in records
    }


def test_the_overlay_builds_with_the_eks_sidecar_instead_of_the_sim() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the kustomize build is checked where it is")
    built = subprocess.run(
        [kubectl, "kustomize", str(EKS)], capture_output=True, check=True, timeout=60
    )
    docs = list(yaml.safe_load_all(built.stdout))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    names = [c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert sorted(names) == ["orchestrator", "plugin-eks"]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]
    assert any(
        d["kind"] == "ConfigMap" and d["metadata"]["name"] == "fleet-plugin-eks" for d in docs
    )
