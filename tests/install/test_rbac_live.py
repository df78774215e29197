"""The install's RBAC is enough: the orchestrator, running as its ServiceAccount with exactly
those rules, completes a mutual-TLS rollout (Secrets), halts, retries on request (annotation
patch), records Events and holds its Lease, with no request refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from plugins.sdk.server import ServerTLS
from plugins.sim.server import SimOptions, Simulator
from tests.support.certs import generate_pki
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import create_tls_secrets, kubectl, yaml_docs
from tests.support.orchestrator import CV, OrchestratorProcess, monitor

RBAC = REPO_ROOT / "manifests" / "install" / "rbac.yaml"
TLS_EXAMPLE = REPO_ROOT / "manifests" / "examples" / "tls.yaml"
#: The opt-in that lets the orchestrator read a namespace's own TLS Secrets (shipped RBAC reads
#: Secrets only in the orchestrator's namespace).
INLINE_TLS_BINDING = (
    REPO_ROOT / "manifests" / "overlays" / "inline-tls-secrets" / "rolebinding.yaml"
)
SA_NAME = "fleet-orchestrator"
OLD = "1.28.5"


@pytest.fixture
def install_rbac(control_plane: KubeCluster, install_namespace: str) -> Iterator[None]:
    """rbac.yaml applied for real (ServiceAccount, roles, bindings); removed afterwards."""
    kubectl(control_plane, "apply", "-f", str(RBAC))
    yield
    kubectl(control_plane, "delete", "--ignore-not-found", "-f", str(RBAC))


def _service_account_kubeconfig(cluster: KubeCluster, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the install's ServiceAccount (TokenRequest API)."""
    token = kubectl(cluster, "create", "token", SA_NAME, "-n", namespace, "--duration", "1h")
    config = json.loads(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token.strip()}
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def _tls_fleet(tmp: Path) -> Path:
    step = {k: 0.2 for k in ("serviceOut", "serviceIn", "controlPlane", "nodePool")}
    pools = [{"name": "default-pool", "version": OLD}]
    fleet = {
        "defaults": {"stepSeconds": step, "jitter": 0},
        "clusters": [
            {
                "id": "prod-01",
                "controlPlaneVersion": OLD,
                "nodePools": [*pools, {"name": "gpu", "version": OLD}],
            },
            {"id": "prod-02", "controlPlaneVersion": OLD, "nodePools": pools},
            {"id": "prod-03", "controlPlaneVersion": OLD, "nodePools": pools},
        ],
        "faults": {
            "failStep": [
                {
                    "step": "controlPlane",
                    "clusters": ["prod-02"],
                    "times": 1,
                    "message": "simulated: control plane upgrade timed out",
                }
            ]
        },
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def _events(cluster: KubeCluster, namespace: str, names: set[str]) -> list[Any]:
    """Events about the named objects (a run's ClusterUpgrades record one per transition)."""
    with cluster.api_client() as client:
        events = k8s.CoreV1Api(client).list_namespaced_event(namespace)
    return [e for e in events.items if e.involved_object.name in names]


def test_orchestrator_needs_nothing_beyond_the_install_rbac(
    control_plane: KubeCluster,
    namespace: str,
    install_namespace: str,
    install_rbac: None,
    tmp_path: Path,
) -> None:
    pki = generate_pki(tmp_path / "pki")
    create_tls_secrets(
        control_plane, namespace, pki.ca_file, pki.client.cert_file, pki.client.key_file
    )
    # This namespace names its own TLS Secrets in the manifest: opted in as documented.
    (binding,) = yaml.safe_load_all(INLINE_TLS_BINDING.read_text())
    binding["metadata"]["namespace"] = namespace
    binding["subjects"][0]["namespace"] = install_namespace
    kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(binding))
    subject = f"system:serviceaccount:{install_namespace}:{SA_NAME}"

    def can_read_secrets() -> bool:
        try:
            out = kubectl(
                control_plane, "auth", "can-i", "get", "secrets", "-n", namespace, "--as", subject
            )
        except AssertionError:  # "no" exits 1
            return False
        return out.strip() == "yes"

    wait_for("the RoleBinding takes effect", can_read_secrets, timeout=30)
    sim = Simulator(
        SimOptions(
            fleet_file=str(_tls_fleet(tmp_path)),
            listen="localhost:0",
            tls=ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file),
            reload_interval=0,
        )
    )
    kubeconfig = _service_account_kubeconfig(
        control_plane, install_namespace, tmp_path / "sa.kubeconfig"
    )
    lease_id = f"fleet-orchestrator-{namespace}"
    identity = f"rbac-test-{namespace}"
    log = tmp_path / "orchestrator.log"
    orchestrator = OrchestratorProcess(
        kubeconfig,
        namespace,
        log,
        "--enable-leader-election",
        *("--leader-election-namespace", install_namespace),
        *("--leader-election-id", lease_id),
        identity=identity,
    )
    try:
        port = sim.address.rsplit(":", 1)[1]
        (body,) = yaml_docs([TLS_EXAMPLE])
        assert body["spec"]["opsEndpoint"]["insecure"] is False
        body["spec"]["opsEndpoint"]["endpoint"] = f"localhost:{port}"
        kubectl(control_plane, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(body))
        orchestrator.start()
        cvs = CV(control_plane, namespace)
        name = body["metadata"]["name"]

        wait_for("rollout halts", lambda: cvs.phase_is(name, "Halted"), timeout=60)
        failed = cvs.failed(name)
        assert list(failed) == ["prod-02"]
        assert "control plane upgrade timed out" in failed["prod-02"]["message"]

        kubectl(
            control_plane,
            *("-n", namespace, "annotate", "clusterversion", name),
            f"{api.ANNOTATION_RETRY_CLUSTERS}=prod-02",
        )
        done = wait_for("rollout completes", lambda: cvs.phase_is(name, "Completed"), timeout=60)
        assert done["summary"]["upToDate"] == 3
        wait_for(
            "the retry annotation is removed by the orchestrator",
            lambda: (
                api.ANNOTATION_RETRY_CLUSTERS
                not in (cvs.get(name)["metadata"].get("annotations") or {})
            ),
            timeout=30,
        )
        m = monitor(sim)
        assert m["clusters_by_version"] == {"1.29.4": 3}
        assert m["duplicate_mutations"] == 0
        assert m["min_available_in_service"] >= 2

        with control_plane.api_client() as client:
            lease = k8s.CoordinationV1Api(client).read_namespaced_lease(lease_id, install_namespace)
        assert lease.spec.holder_identity == identity
        upgrades = {o["metadata"]["name"] for o in cvs.upgrades(name).values()}
        reasons = wait_for(
            "events recorded",
            lambda: {e.reason for e in _events(control_plane, namespace, upgrades)} or None,
        )
        assert "Failed" in reasons and "Upgraded" in reasons
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()
    text = log.read_text()
    assert "forbidden" not in text.lower(), text[-3000:]
    assert "TLSConfigError" not in text
