"""The webhook as installed on the real apiserver: the shipped configurations are accepted, and
self-managed certificates work with nothing but the shipped grants: the orchestrator
runs as its ServiceAccount (a real token), creates the certificate Secret in its namespace and
injects the CA into the configuration named `fleet-orchestrator`, and may patch no other
configuration and update no other Secret."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from orchestrator import api
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl, kustomize, yaml_docs
from tests.support.orchestrator import OrchestratorProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "manifests" / "install"
HOME, SA = "fleet-upgrade-system", "fleet-orchestrator"
DENIED = 'admission webhook "validate.multicluster-ops.io" denied the request'


def webhook_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((INSTALL / "webhook.yaml").read_text()) if d]


@pytest.fixture
def shipped_grants(control_plane: KubeCluster) -> Iterator[None]:
    """The install's namespace, rbac.yaml and webhook.yaml's RBAC, as shipped; removed after."""
    core = k8s.CoreV1Api(control_plane.api_client())
    try:
        core.read_namespace(HOME)
        existed = True
    except ApiException as error:
        assert error.status == 404, error
        existed = False
    rbac = [d for d in webhook_docs() if d["kind"].endswith(("Role", "RoleBinding"))]
    assert len(rbac) == 4
    text = yaml.safe_dump_all(rbac)
    kubectl(control_plane, "apply", "-f", str(INSTALL / "namespace.yaml"))
    kubectl(control_plane, "apply", "-f", str(INSTALL / "rbac.yaml"))
    kubectl(control_plane, "apply", "-f", "-", stdin=text)
    try:
        yield
    finally:
        kubectl(control_plane, "delete", "--ignore-not-found", "-f", "-", stdin=text)
        kubectl(control_plane, "delete", "--ignore-not-found", "-f", str(INSTALL / "rbac.yaml"))
        with contextlib.suppress(ApiException):
            core.delete_namespaced_secret("fleet-orchestrator-webhook-tls", HOME)
        if not existed:
            control_plane.delete_namespace(HOME)


def service_account_kubeconfig(cluster: KubeCluster, tmp: Path) -> Path:
    token = kubectl(cluster, "create", "token", SA, "-n", HOME, "--duration", "1h").strip()
    config = json.loads(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = tmp / "sa.kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def can_i(cluster: KubeCluster, verb: str, what: str, namespace: str | None = None) -> str:
    args = ["auth", "can-i", verb, what, f"--as=system:serviceaccount:{HOME}:{SA}"]
    if namespace:
        args += ["-n", namespace]
    done = subprocess.run(
        [shutil.which("kubectl") or "kubectl", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout.strip()


def test_the_shipped_grants_suffice_for_self_managed_certificates_and_no_more(
    control_plane: KubeCluster, shipped_grants: None, namespace: str, tmp_path: Path
) -> None:
    client = control_plane.api_client()
    admission = k8s.AdmissionregistrationV1Api(client)
    core = k8s.CoreV1Api(client)
    label = uuid.uuid4().hex[:10]
    core.patch_namespace(namespace, {"metadata": {"labels": {"fleet-webhook-test": label}}})
    port = free_port()
    (config,) = [d for d in webhook_docs() if d["kind"] == "ValidatingWebhookConfiguration"]
    config = copy.deepcopy(config)
    assert config["metadata"]["name"] == "fleet-orchestrator"  # the name the grant names
    for hook in config["webhooks"]:  # by URL on loopback, for this test's namespace only
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}/validate"}
        hook["namespaceSelector"] = {"matchLabels": {"fleet-webhook-test": label}}
    admission.create_validating_webhook_configuration(config)
    orchestrator = OrchestratorProcess(
        service_account_kubeconfig(control_plane, tmp_path),
        namespace,
        tmp_path / "orchestrator.log",
        "--orchestrator-namespace",
        HOME,
        "--webhook-addr",
        f"127.0.0.1:{port}",
        "--webhook-host",
        "127.0.0.1",
    ).start()
    try:

        def injected() -> bytes | None:
            hook = admission.read_validating_webhook_configuration("fleet-orchestrator").webhooks[0]
            bundle = hook.client_config.ca_bundle
            return base64.b64decode(bundle) if bundle else None

        ca = wait_for("the CA injected with the shipped grants", injected, timeout=60)
        secret = core.read_namespaced_secret("fleet-orchestrator-webhook-tls", HOME)
        assert base64.b64decode(secret.data["ca.crt"]) == ca
        assert secret.type == "kubernetes.io/tls"

        custom = k8s.CustomObjectsApi(client)
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": "probe"},
            "spec": {
                "requiredAvailableCount": 2,
                "opsEndpoint": {"endpoint": "localhost:9090", "insecure": True},
                "clusters": [{"id": "a", "version": "1.29.4"}, {"id": "b", "version": "1.29.4"}],
            },
        }

        def refused() -> bool:
            try:
                custom.create_namespaced_custom_object(
                    api.GROUP, api.VERSION, namespace, api.PLURAL, body, dry_run="All"
                )
            except ApiException as err:
                return DENIED in json.loads(err.body)["message"]
            return False

        wait_for("the apiserver calls the webhook", refused, timeout=30, interval=0.2)
    finally:
        orchestrator.stop()
        with contextlib.suppress(ApiException):
            admission.delete_validating_webhook_configuration("fleet-orchestrator")
    log = (tmp_path / "orchestrator.log").read_text()
    assert "Forbidden" not in log and "forbidden" not in log, log
    # Nothing beyond the one configuration and the one Secret.
    assert can_i(control_plane, "patch", "validatingwebhookconfigurations/fleet-orchestrator") == (
        "yes"
    )
    assert can_i(control_plane, "patch", "validatingwebhookconfigurations/another") == "no"
    # The who-asked webhook's configuration of the same name gets the same CA (issue 24 item 3).
    assert can_i(control_plane, "patch", "mutatingwebhookconfigurations/fleet-orchestrator") == (
        "yes"
    )
    assert can_i(control_plane, "patch", "mutatingwebhookconfigurations/another") == "no"
    assert can_i(control_plane, "update", "secrets/fleet-orchestrator-webhook-tls", HOME) == "yes"
    assert can_i(control_plane, "update", "secrets/another", HOME) == "no"
    assert can_i(control_plane, "create", "secrets", namespace) == "no"


@pytest.mark.parametrize("source", ["install", "overlays/cert-manager"])
def test_the_shipped_configuration_is_accepted_by_the_apiserver(
    control_plane: KubeCluster, source: str
) -> None:
    (config,) = [
        d
        for d in yaml_docs(kustomize(ROOT / "manifests" / source))
        if d["kind"] == "ValidatingWebhookConfiguration"
    ]
    admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
    stored = admission.create_validating_webhook_configuration(config, dry_run="All")
    (hook,) = stored.webhooks
    assert (hook.failure_policy, hook.timeout_seconds, hook.side_effects) == ("Ignore", 5, "None")
    assert hook.match_policy == "Equivalent" and hook.admission_review_versions == ["v1"]
    assert hook.client_config.service.name == "fleet-orchestrator-webhook"


@pytest.mark.parametrize("source", ["install", "overlays/cert-manager"])
def test_the_shipped_mutating_configuration_is_accepted_by_the_apiserver(
    control_plane: KubeCluster, source: str
) -> None:
    (config,) = [
        d
        for d in yaml_docs(kustomize(ROOT / "manifests" / source))
        if d["kind"] == "MutatingWebhookConfiguration"
    ]
    admission = k8s.AdmissionregistrationV1Api(control_plane.api_client())
    stored = admission.create_mutating_webhook_configuration(config, dry_run="All")
    (hook,) = stored.webhooks
    assert (hook.failure_policy, hook.timeout_seconds, hook.side_effects) == ("Ignore", 5, "None")
    assert hook.client_config.service.path == "/mutate"
    assert [r.resources for r in hook.rules] == [["clusterversions", "updateruns"]]
    if source == "overlays/cert-manager":
        assert "cert-manager.io/inject-ca-from" in (stored.metadata.annotations or {})
