"""manifests/ocm: the configurations parse, the example ClusterVersion is accepted, and the plugin
does all its work with nothing but the RBAC of rbac.yaml (no wildcard, nothing more)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from devtools.controlplane import REPO_ROOT
from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm import parse_config
from plugins.sdk.client import PluginCallError, PluginClient
from tests.plugins.ocm.conftest import (
    NEW,
    OLD,
    PLAN_FEEDBACK,
    StartPlugin,
    curator_config,
    work_config,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.ocm_emulator import MC, OcmEmulator
from tests.support.orchestrator import CV

MANIFESTS = REPO_ROOT / "manifests" / "ocm"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]


def test_the_shipped_configurations_are_valid() -> None:
    configs = [parse_config(yaml.safe_load(d["data"]["config.yaml"])) for d in _docs("config.yaml")]
    assert [c.upgrade_method for c in configs] == ["ClusterCurator", "ManifestWork"]
    # The curator upgrades to OpenShift versions: the OpenShift version is what is compared.
    assert [c.version_source for c in configs] == [
        "clusterClaim:version.openshift.io",
        "kubernetes",
    ]
    work = configs[1].manifest_work
    assert work is not None and work.template["kind"] == "Plan"
    assert work.feedback.succeeded.name == PLAN_FEEDBACK["succeeded"]["name"]


def test_the_sidecar_runs_the_plugin_on_loopback_with_the_config() -> None:
    [deployment] = _docs("sidecar.yaml")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["fleet-plugin-ocm"]
    assert "--listen=127.0.0.1:50061" in container["args"]
    assert "--config=/etc/fleet-plugin-ocm/config.yaml" in container["args"]
    [example] = _docs("clusterversion-example.yaml")
    assert example["spec"]["opsEndpoint"]["endpoint"] == "127.0.0.1:50061"


def test_the_example_cluster_version_is_accepted_by_the_crd(
    control_plane: KubeCluster, namespace: str
) -> None:
    [example] = _docs("clusterversion-example.yaml")
    example["metadata"]["namespace"] = namespace
    cvs = CV(control_plane, namespace)
    cvs.create(example)
    assert cvs.get("ocm-fleet")["spec"]["strategy"]["stages"][0]["name"] == "canary"


def test_rbac_has_no_wildcards() -> None:
    [role] = [d for d in _docs("rbac.yaml") if d["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]


def _restricted_kubeconfig(hub: KubeCluster, tmp_path: Path, namespace: str, account: str) -> Path:
    """A kubeconfig for the hub with the token of a ServiceAccount (TokenRequest API)."""
    api = hub.api_client()
    try:
        token = (
            k8s.CoreV1Api(api)
            .create_namespaced_service_account_token(
                account,
                namespace,
                k8s.AuthenticationV1TokenRequest(
                    spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
                ),
            )
            .status.token
        )
    finally:
        api.close()
    config = yaml.safe_load(hub.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = tmp_path / "restricted-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def rbac_applied(hub: KubeCluster) -> Callable[[], tuple[str, str]]:
    """Applies rbac.yaml to the hub (idempotent); returns (namespace, service account)."""

    def apply() -> tuple[str, str]:
        api = hub.api_client()
        core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
        found = ("", "")
        try:
            for doc in _docs("rbac.yaml"):
                kind, meta = doc["kind"], doc["metadata"]
                create, replace = {
                    "Namespace": (core.create_namespace, None),
                    "ServiceAccount": (
                        lambda b: core.create_namespaced_service_account(
                            b["metadata"]["namespace"], b
                        ),
                        None,
                    ),
                    "ClusterRole": (
                        rbac.create_cluster_role,
                        lambda b: rbac.replace_cluster_role(b["metadata"]["name"], b),
                    ),
                    "ClusterRoleBinding": (
                        rbac.create_cluster_role_binding,
                        lambda b: rbac.replace_cluster_role_binding(b["metadata"]["name"], b),
                    ),
                }[kind]
                try:
                    create(doc)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    if replace is not None:
                        replace(doc)
                if kind == "ServiceAccount":
                    found = (meta["namespace"], meta["name"])
        finally:
            api.close()
        return found

    return apply


@pytest.mark.parametrize("config", [curator_config(), work_config()], ids=["curator", "work"])
def test_the_plugin_does_its_work_with_the_shipped_rbac_only(
    hub: KubeCluster,
    emulator: OcmEmulator,
    start_plugin: StartPlugin,
    names: Callable[[int], list[str]],
    rbac_applied: Callable[[], tuple[str, str]],
    tmp_path: Path,
    config: dict[str, Any],
) -> None:
    [name] = names(1)
    emulator.add_cluster(name, OLD)
    emulator.set_deployment(name, "shop", "web", available=2, replicas=2)
    namespace, account = rbac_applied()
    kubeconfig = _restricted_kubeconfig(hub, tmp_path, namespace, account)
    plugin = start_plugin(config, kubeconfig=kubeconfig)
    client = plugin.client
    assert client.probe().ready
    assert name in {c.id for c in client.list_clusters()}
    for request, call in (("out", client.service_out), ("in", client.service_in)):
        assert _finish(client, call(request, name)).state == cluster_pb2.OPERATION_STATE_SUCCEEDED
    up = _finish(client, client.upgrade_control_plane("up", name, NEW))
    assert up.state == cluster_pb2.OPERATION_STATE_SUCCEEDED, up.error_message
    web = health_pb2.Workload(namespace="shop", name="web")
    wait_for(
        "workload reported",
        lambda: (
            client.check_workloads([name], [web])[0].health == health_pb2.WORKLOAD_HEALTH_HEALTHY
        ),
        15,
    )
    # The same identity cannot do what the plugin never needs.
    api = k8s.ApiClient(_config_from(kubeconfig))
    try:
        with pytest.raises(ApiException) as err:
            k8s.CustomObjectsApi(api).delete_cluster_custom_object(*MC, name)
        assert err.value.status == 403
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(api).list_namespaced_secret(name)
        assert err.value.status == 403
    finally:
        api.close()


def _finish(client: PluginClient, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    def ended() -> cluster_pb2.Operation | None:
        now = client.get_operation(op.id)
        return now if now.state in (3, 4) else None

    final: cluster_pb2.Operation = wait_for(f"operation {op.id} ends", ended, timeout=20)
    return final


def _config_from(kubeconfig: Path) -> k8s.Configuration:
    from kubernetes import config as kube_config

    cfg = k8s.Configuration()
    kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return cfg


def test_without_rbac_the_plugin_is_not_ready_and_says_why(
    hub: KubeCluster, start_plugin: StartPlugin, tmp_path: Path
) -> None:
    api = hub.api_client()
    try:
        k8s.CoreV1Api(api).create_namespace(
            k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="nobody-ns"))
        )
    except ApiException as exc:
        assert exc.status == 409
    try:
        k8s.CoreV1Api(api).create_namespaced_service_account(
            "nobody-ns", k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="nobody"))
        )
    except ApiException as exc:
        assert exc.status == 409
    api.close()
    kubeconfig = _restricted_kubeconfig(hub, tmp_path, "nobody-ns", "nobody")
    plugin = start_plugin(curator_config(), kubeconfig=kubeconfig, sync_wait=0.5)
    probe = plugin.client.probe()
    assert not probe.ready
    assert "managedclusters.cluster.open-cluster-management.io" in probe.message
    assert "forbidden" in probe.message.lower()
    with pytest.raises(PluginCallError) as err:
        plugin.client.list_clusters()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE
