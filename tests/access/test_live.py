"""Who may do what, on the real apiserver with real tokens (TokenRequest) of differently
privileged ServiceAccounts: a namespace editor, and the orchestrator running as the install's
ServiceAccount with manifests/install/rbac.yaml applied as shipped."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException
from kubernetes.config import new_client_from_config

from devtools.controlplane import REPO_ROOT
from orchestrator import api
from orchestrator.adapters.kube import KubeClient, KubeError
from plugins.sdk.server import ServerTLS
from plugins.sim.server import SimOptions, Simulator
from tests.support.certs import generate_pki
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import create_tls_secrets, kubectl
from tests.support.orchestrator import CV, OrchestratorProcess, monitor
from tests.support.prometheus import SampleApp, prometheus_binary, running_prometheus

RBAC = REPO_ROOT / "manifests" / "install" / "rbac.yaml"
INLINE_TLS_BINDING = (
    REPO_ROOT / "manifests" / "overlays" / "inline-tls-secrets" / "rolebinding.yaml"
)
HOME = "fleet-upgrade-system"
ORCHESTRATOR_SA = "fleet-orchestrator"
OLD, NEW = "1.28.5", "1.29.4"
IDS = ("prod-01", "prod-02", "prod-03")


@pytest.fixture
def shipped_rbac(control_plane: KubeCluster, install_namespace: str) -> Iterator[None]:
    """rbac.yaml applied as shipped; removed afterwards."""
    kubectl(control_plane, "apply", "-f", str(RBAC))
    yield
    kubectl(control_plane, "delete", "--ignore-not-found", "-f", str(RBAC))


def token_kubeconfig(cluster: KubeCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig authenticating with a real token of the ServiceAccount (TokenRequest)."""
    token = kubectl(cluster, "create", "token", account, "-n", namespace, "--duration", "1h")
    config = json.loads(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token.strip()}
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


_OPEN: list[k8s.ApiClient] = []


def _client(kubeconfig: Path) -> k8s.ApiClient:
    """An ApiClient for the kubeconfig, closed when the test ends (an unclosed one leaves its
    pooled TLS sockets to the garbage collector, whose ResourceWarning fails a later test)."""
    client = new_client_from_config(config_file=str(kubeconfig))
    _OPEN.append(client)
    return client


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def as_user(kubeconfig: Path) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(_client(kubeconfig))


def forbidden(call: Any, *args: Any) -> bool:
    try:
        call(*args)
    except ApiException as err:
        return int(err.status) == 403
    return False


def fleet_file(tmp: Path) -> Path:
    step = {k: 0.2 for k in ("serviceOut", "serviceIn", "controlPlane", "nodePool")}
    fleet = {
        "defaults": {"stepSeconds": step, "jitter": 0},
        "clusters": [
            {
                "id": cid,
                "controlPlaneVersion": OLD,
                "nodePools": [{"name": "default-pool", "version": OLD}],
            }
            for cid in IDS
        ],
    }
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    return path


def cluster_version(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "requiredAvailableCount": 2,
            "clusters": [{"id": cid, "version": NEW} for cid in IDS],
            **spec,
        },
    }


def declared(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


class _Canary(http.server.BaseHTTPRequestHandler):
    hits: list[str]

    def do_GET(self) -> None:
        self.hits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status":"success","data":{"resultType":"scalar","result":[0,"0"]}}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def canary() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that records every request: the URL a spec must not reach."""
    hits: list[str] = []
    handler = type("Canary", (_Canary,), {"hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def editor(control_plane: KubeCluster, namespace: str, tmp_path: Path) -> Path:
    """A ServiceAccount of the namespace bound to the built-in edit role; its kubeconfig."""
    kubectl(control_plane, "-n", namespace, "create", "serviceaccount", "editor")
    kubectl(
        control_plane,
        *("-n", namespace, "create", "rolebinding", "editor-edit", "--clusterrole=edit"),
        f"--serviceaccount={namespace}:editor",
    )
    return token_kubeconfig(control_plane, namespace, "editor", tmp_path / "editor.kubeconfig")


def grant_cluster_version_editor(cluster: KubeCluster, namespace: str, editor: Path) -> None:
    """What a team gets when someone binds the shipped editor role in its namespace (waits
    until the authorizer sees the binding)."""
    kubectl(
        cluster,
        *("-n", namespace, "create", "rolebinding", "editor-fleet"),
        "--clusterrole=fleet-clusterversion-editor",
        f"--serviceaccount={namespace}:editor",
    )
    review = k8s.V1SelfSubjectAccessReview(
        spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(
                group=api.GROUP, resource=api.PLURAL, verb="create", namespace=namespace
            )
        )
    )
    with new_client_from_config(config_file=str(editor)) as client:
        auth = k8s.AuthorizationV1Api(client)
        wait_for(
            "the editor may create ClusterVersions",
            lambda: auth.create_self_subject_access_review(review).status.allowed,
            timeout=30,
            interval=0.2,
        )


def orchestrator_as_installed(
    cluster: KubeCluster, namespace: str, tmp: Path, *extra: str
) -> OrchestratorProcess:
    """fleet-orchestrator run with the install ServiceAccount's token, watching namespace."""
    kubeconfig = token_kubeconfig(cluster, HOME, ORCHESTRATOR_SA, tmp / "orchestrator.kubeconfig")
    return OrchestratorProcess(
        kubeconfig,
        namespace,
        tmp / "orchestrator.log",
        *("--orchestrator-namespace", HOME),
        *extra,
        identity=f"access-{namespace}",
    )


Declare = Callable[[str, str, dict[str, Any]], None]


@pytest.fixture
def declare(control_plane: KubeCluster) -> Iterator[Declare]:
    """The platform admin declares a FleetProvider or MetricSource; deleted afterwards."""
    with control_plane.api_client() as client:
        objects = k8s.CustomObjectsApi(client)
        created: list[tuple[str, str]] = []

        def create(kind: str, name: str, spec: dict[str, Any]) -> None:
            plural = {
                api.FLEET_PROVIDER_KIND: api.FLEET_PROVIDER_PLURAL,
                api.METRIC_SOURCE_KIND: api.METRIC_SOURCE_PLURAL,
            }[kind]
            objects.create_cluster_custom_object(
                api.GROUP, api.VERSION, plural, declared(kind, name, spec)
            )
            created.append((plural, name))

        yield create
        for plural, name in created:
            objects.delete_cluster_custom_object(api.GROUP, api.VERSION, plural, name)


def test_a_namespace_editor_cannot_make_the_orchestrator_act_on_a_provider_it_is_not_allowed(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    editor: Path,
    declare: Declare,
    canary: tuple[str, list[str]],
    tmp_path: Path,
) -> None:
    user = as_user(editor)
    provider = declared(
        api.FLEET_PROVIDER_KIND,
        f"team-{namespace}",
        {"endpoint": "localhost:1", "insecure": True, "allowedNamespaces": {"names": [namespace]}},
    )
    source = declared(
        api.METRIC_SOURCE_KIND,
        f"team-{namespace}",
        {"address": canary[0], "allowedNamespaces": {"names": [namespace]}},
    )
    # The built-in edit role gives nothing of ours: no providers, no sources, and (nothing is
    # aggregated by default) not even ClusterVersions.
    create = user.create_cluster_custom_object
    assert forbidden(create, api.GROUP, api.VERSION, api.FLEET_PROVIDER_PLURAL, provider)
    assert forbidden(create, api.GROUP, api.VERSION, api.METRIC_SOURCE_PLURAL, source)
    cv_create = user.create_namespaced_custom_object
    body = cluster_version("probe", opsEndpoint={"endpoint": "localhost:1", "insecure": True})
    assert forbidden(cv_create, api.GROUP, api.VERSION, namespace, api.PLURAL, body)

    sim = Simulator(
        SimOptions(fleet_file=str(fleet_file(tmp_path)), listen="127.0.0.1:0", reload_interval=0)
    )
    orchestrator = orchestrator_as_installed(control_plane, namespace, tmp_path)
    try:
        sim_endpoint = f"127.0.0.1:{sim.address.rsplit(':', 1)[1]}"
        # Providers the admin declared: one for another team, one for this team (same sim).
        elsewhere = f"elsewhere-{namespace}"
        declare(
            api.FLEET_PROVIDER_KIND,
            elsewhere,
            {
                "endpoint": sim_endpoint,
                "insecure": True,
                "allowedNamespaces": {"names": ["someone-else"]},
            },
        )
        mine = f"mine-{namespace}"
        declare(
            api.FLEET_PROVIDER_KIND,
            mine,
            {
                "endpoint": "localhost:9",
                "insecure": True,
                "allowedNamespaces": {"names": [namespace]},
            },
        )
        # The editor cannot widen a declared provider either.
        patch = {"spec": {"endpoint": sim_endpoint}}
        assert forbidden(
            user.patch_cluster_custom_object,
            api.GROUP,
            api.VERSION,
            api.FLEET_PROVIDER_PLURAL,
            mine,
            patch,
        )
        grant_cluster_version_editor(control_plane, namespace, editor)
        orchestrator.start()
        inline = {"endpoint": sim_endpoint, "insecure": True}
        attempts = {
            "inline": cluster_version("inline", opsEndpoint=inline),
            "not-allowed": cluster_version("not-allowed", providerRef={"name": elsewhere}),
            "ssrf": cluster_version(
                "ssrf",
                providerRef={"name": mine},
                healthChecks={
                    "checks": [
                        {
                            "name": "metadata",
                            "metric": {
                                "provider": {"type": "prometheus", "address": canary[0]},
                                "query": "up",
                                "thresholdRange": {"min": 1},
                            },
                        }
                    ]
                },
            ),
        }
        for body in attempts.values():
            user.create_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, body
            )
        run = {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "metadata": {"name": "direct"},
            "spec": {
                "opsEndpoint": inline,
                "requiredAvailableCount": 2,
                "clusters": [{"id": cid, "version": NEW} for cid in IDS],
            },
        }
        user.create_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.UPDATE_RUN_PLURAL, run
        )
        cvs = CV(control_plane, namespace)
        messages = {
            name: wait_for(
                f"ClusterVersion {name} is Invalid",
                lambda n=name: (cvs.phase_is(n, "Invalid") or {}).get("message"),
                timeout=60,
            )
            for name in attempts
        }
        assert messages["inline"].startswith(
            f"spec.opsEndpoint: inline plugin endpoints are not allowed in namespace {namespace}"
        )
        assert f"--allow-inline-endpoints-in={namespace}" in messages["inline"]
        assert "FleetProvider" in messages["inline"]
        assert messages["not-allowed"] == (
            f"spec.providerRef.name: FleetProvider {elsewhere} does not allow namespace "
            f"{namespace}; a platform admin adds it to spec.allowedNamespaces of "
            f"FleetProvider {elsewhere}"
        )
        assert messages["ssrf"].startswith(
            "spec.healthChecks.checks[0].metric.provider.address: inline Prometheus "
            f"addresses are not allowed in namespace {namespace}"
        )
        direct = wait_for(
            "UpdateRun direct is Invalid",
            lambda: _status(user, namespace, "direct", "Invalid"),
            timeout=60,
        )
        assert direct["message"].startswith("spec.opsEndpoint: inline plugin endpoints")
        # Nothing happened anywhere: no run but the one the editor made, no ClusterUpgrade,
        # no mutation of the fleet, no request to the URL.
        runs = user.list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.UPDATE_RUN_PLURAL
        )["items"]
        assert [r["metadata"]["name"] for r in runs] == ["direct"]
        upgrades = user.list_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.CLUSTER_UPGRADE_PLURAL
        )["items"]
        assert upgrades == []
        m = monitor(sim)
        assert m["mutations_total"] == 0
        assert m["clusters_by_version"] == {OLD: 3}
        assert canary[1] == []
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()
    assert "forbidden" not in orchestrator.log.read_text().lower()


def _status(
    user: k8s.CustomObjectsApi, namespace: str, run: str, phase: str
) -> dict[str, Any] | None:
    """The UpdateRun's status once it reaches phase."""
    obj = user.get_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.UPDATE_RUN_PLURAL, run
    )
    status = dict(obj.get("status") or {})
    return status if status.get("phase") == phase else None


def test_an_allowed_namespace_converges_through_a_fleet_provider_with_home_secrets(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    editor: Path,
    declare: Declare,
    tmp_path: Path,
) -> None:
    """The team names a FleetProvider that selects its namespace by label; the plugin's mTLS
    material lives in the orchestrator's namespace, the only place the shipped RBAC lets the
    orchestrator read Secrets."""
    pki = generate_pki(tmp_path / "pki")
    ca_secret, client_secret = f"ca-{namespace}", f"client-{namespace}"
    create_tls_secrets(
        control_plane,
        HOME,
        pki.ca_file,
        pki.client.cert_file,
        pki.client.key_file,
        ca_secret,
        client_secret,
    )
    kubectl(control_plane, "label", "namespace", namespace, f"fleet.example/team={namespace}")
    grant_cluster_version_editor(control_plane, namespace, editor)
    sim = Simulator(
        SimOptions(
            fleet_file=str(fleet_file(tmp_path)),
            listen="localhost:0",
            tls=ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file),
            reload_interval=0,
            target_version=NEW,
        )
    )
    orchestrator = orchestrator_as_installed(control_plane, namespace, tmp_path)
    name = f"tls-{namespace}"
    endpoint = f"localhost:{sim.address.rsplit(':', 1)[1]}"
    try:
        declare(
            api.FLEET_PROVIDER_KIND,
            name,
            {
                "endpoint": endpoint,
                "tls": {
                    "caSecretRef": {"name": ca_secret, "key": "ca.crt"},
                    "clientSecretName": client_secret,
                },
                "allowedNamespaces": {
                    "selector": {"matchLabels": {"fleet.example/team": namespace}}
                },
            },
        )
        orchestrator.start()
        as_user(editor).create_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            namespace,
            api.PLURAL,
            cluster_version("team-rollout", providerRef={"name": name}),
        )
        cvs = CV(control_plane, namespace)
        done = wait_for(
            "the rollout completes",
            lambda: cvs.phase_is("team-rollout", "Completed", "Invalid", "Halted"),
            timeout=90,
        )
        assert done["phase"] == "Completed", done
        assert done["summary"]["upToDate"] == 3
        upgrades = cvs.upgrades("team-rollout")
        assert sorted(upgrades) == list(IDS)
        assert {u["spec"]["provider"] for u in upgrades.values()} == {endpoint}  # pinned
        m = monitor(sim)
        assert m["clusters_by_version"] == {NEW: 3}
        assert m["duplicate_mutations"] == 0
        assert m["min_available_in_service"] >= 2
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()
        for secret in (ca_secret, client_secret):
            kubectl(control_plane, "-n", HOME, "delete", "secret", secret, "--ignore-not-found")
    text = orchestrator.log.read_text()
    assert "forbidden" not in text.lower(), text[-3000:]
    assert "TLSConfigError" not in text


def test_the_orchestrators_service_account_reads_secrets_only_in_its_namespace(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    tmp_path: Path,
) -> None:
    for ns in (namespace, HOME):
        kubectl(
            control_plane,
            *("-n", ns, "create", "secret", "generic", f"probe-{namespace}"),
            "--from-literal=token=s3cr3t",
        )
    try:
        kubeconfig = token_kubeconfig(control_plane, HOME, ORCHESTRATOR_SA, tmp_path / "sa.kcfg")
        kube = KubeClient(str(kubeconfig))  # the orchestrator's own adapter, as the SA
        try:
            assert kube.read_secret(HOME, f"probe-{namespace}") == {"token": b"s3cr3t"}
            with pytest.raises(KubeError) as err:
                kube.read_secret(namespace, f"probe-{namespace}")
            assert err.value.status == 403
            core = k8s.CoreV1Api(_client(kubeconfig))
            assert forbidden(core.list_secret_for_all_namespaces)
            assert forbidden(core.list_namespaced_secret, HOME)  # get by name only
            # Opting a namespace in (manifests/overlays/inline-tls-secrets) grants exactly it.
            (binding,) = yaml.safe_load_all(INLINE_TLS_BINDING.read_text())
            binding["metadata"]["namespace"] = namespace
            kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(binding))
            got = wait_for(
                "the RoleBinding takes effect",
                lambda: _try_read(kube, namespace, f"probe-{namespace}"),
                timeout=30,
            )
            assert got == {"token": b"s3cr3t"}
        finally:
            kube.close()
    finally:
        for ns in (namespace, HOME):
            kubectl(control_plane, "-n", ns, "delete", "secret", f"probe-{namespace}")


def _try_read(kube: KubeClient, namespace: str, name: str) -> dict[str, bytes] | None:
    try:
        return kube.read_secret(namespace, name)
    except KubeError as err:
        if err.status == 403:
            return None
        raise


@pytest.mark.skipif(
    prometheus_binary() is None and os.environ.get("CI") != "true",
    reason="prometheus not installed (apt-get install prometheus); CI installs it",
)
def test_a_metric_source_gates_the_rollout_with_its_token_from_the_orchestrators_namespace(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    editor: Path,
    declare: Declare,
    tmp_path: Path,
) -> None:
    """The team's check names a MetricSource (a real Prometheus scraping a real app); its
    token Secret is read in the orchestrator's namespace; every cluster is gated on it."""
    app = SampleApp()
    for cid in IDS:
        app.set(cid, 0.99)
    app.start()
    token = f"prom-token-{namespace}"
    kubectl(
        control_plane,
        *("-n", HOME, "create", "secret", "generic", token),
        "--from-literal=token=not-checked-by-this-prometheus",
    )
    grant_cluster_version_editor(control_plane, namespace, editor)
    sim = Simulator(
        SimOptions(fleet_file=str(fleet_file(tmp_path)), listen="127.0.0.1:0", reload_interval=0)
    )
    orchestrator = orchestrator_as_installed(control_plane, namespace, tmp_path)
    try:
        with running_prometheus(tmp_path, [f"127.0.0.1:{app.port}"]) as url:
            provider, source = f"sim-{namespace}", f"prom-{namespace}"
            allowed = {"names": [namespace]}
            endpoint = f"127.0.0.1:{sim.address.rsplit(':', 1)[1]}"
            declare(
                api.FLEET_PROVIDER_KIND,
                provider,
                {"endpoint": endpoint, "insecure": True, "allowedNamespaces": allowed},
            )
            declare(
                api.METRIC_SOURCE_KIND,
                source,
                {
                    "address": url,
                    "bearerTokenSecretRef": {"name": token, "key": "token"},
                    "allowedNamespaces": allowed,
                },
            )
            orchestrator.start()
            check = {
                "name": "success",
                "metric": {
                    "provider": {"type": "prometheus", "sourceRef": {"name": source}},
                    "query": 'request_success_ratio{cluster="{{ cluster }}"}',
                    "thresholdRange": {"min": 0.95},
                },
            }
            body = cluster_version(
                "gated",
                providerRef={"name": provider},
                healthChecks={
                    "interval": "1s",
                    "successThreshold": 1,
                    "timeout": "2m",
                    "checks": [check],
                },
            )
            as_user(editor).create_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, api.PLURAL, body
            )
            cvs = CV(control_plane, namespace)
            done = wait_for(
                "the gated rollout completes",
                lambda: cvs.phase_is("gated", "Completed", "Invalid", "Halted"),
                timeout=120,
            )
            assert done["phase"] == "Completed", done
            for cid, upgrade in cvs.upgrades("gated").items():
                results = upgrade["status"]["health"]["results"]
                assert [(r["name"], r["passed"], r["value"]) for r in results] == [
                    ("success", True, 0.99)
                ], cid
            assert monitor(sim)["clusters_by_version"] == {NEW: 3}
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()
        app.stop()
        kubectl(control_plane, "-n", HOME, "delete", "secret", token, "--ignore-not-found")
    text = orchestrator.log.read_text()
    assert "forbidden" not in text.lower(), text[-3000:]
    assert "SecretError" not in text


def test_inline_tls_in_an_allowed_namespace_needs_the_opt_in_secret_binding(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    tmp_path: Path,
) -> None:
    """A namespace allowed inline endpoints (--allow-inline-endpoints-in) whose manifest names
    its own TLS Secrets: with the shipped RBAC the orchestrator may not read them, says how to
    allow it, and calls nothing; the inline-tls-secrets overlay's RoleBinding allows it."""
    pki = generate_pki(tmp_path / "pki")
    create_tls_secrets(
        control_plane, namespace, pki.ca_file, pki.client.cert_file, pki.client.key_file
    )
    sim = Simulator(
        SimOptions(
            fleet_file=str(fleet_file(tmp_path)),
            listen="localhost:0",
            tls=ServerTLS(pki.server.cert_file, pki.server.key_file, client_ca_file=pki.ca_file),
            reload_interval=0,
        )
    )
    orchestrator = orchestrator_as_installed(
        control_plane, namespace, tmp_path, f"--allow-inline-endpoints-in={namespace}"
    )
    try:
        orchestrator.start()
        ops = {
            "endpoint": f"localhost:{sim.address.rsplit(':', 1)[1]}",
            "tls": {
                "caSecretRef": {"name": "plugin-ca", "key": "ca.crt"},
                "clientSecretName": "orchestrator-client",
            },
        }
        cvs = CV(control_plane, namespace)
        cvs.create(cluster_version("own-tls", opsEndpoint=ops))

        def degraded() -> str | None:
            for cond in cvs.status("own-tls").get("conditions") or []:
                if cond["type"] == "Degraded" and cond["reason"] == "TLSConfigError":
                    return str(cond["message"])
            return None

        message = wait_for("the run is Degraded: TLSConfigError", degraded, timeout=60)
        assert f"may not read Secrets in namespace {namespace}" in message
        assert "manifests/overlays/inline-tls-secrets" in message
        assert monitor(sim)["mutations_total"] == 0
        (binding,) = yaml.safe_load_all(INLINE_TLS_BINDING.read_text())
        binding["metadata"]["namespace"] = namespace
        kubectl(control_plane, "apply", "-f", "-", stdin=yaml.safe_dump(binding))
        done = wait_for(
            "the rollout completes once the namespace is opted in",
            lambda: cvs.phase_is("own-tls", "Completed"),
            timeout=90,
        )
        assert done["summary"]["upToDate"] == 3
        assert monitor(sim)["clusters_by_version"] == {NEW: 3}
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()


def test_access_revoked_mid_run_calls_nothing_says_who_waits_and_resumes_when_restored(
    control_plane: KubeCluster,
    namespace: str,
    shipped_rbac: None,
    declare: Declare,
    tmp_path: Path,
) -> None:
    """The admin removes the namespace from a FleetProvider while clusters are out of service:
    the orchestrator calls the provider no more for that run (no new mutation), the run says
    how many clusters wait and where to see them, and restoring access finishes the rollout
    with every cluster back in service and the floor kept."""
    path = fleet_file(tmp_path)
    fleet = yaml.safe_load(path.read_text())
    fleet["defaults"]["stepSeconds"]["controlPlane"] = 4.0  # time to revoke mid-step
    path.write_text(yaml.safe_dump(fleet))
    sim = Simulator(
        SimOptions(
            fleet_file=str(path), listen="localhost:0", reload_interval=0, target_version=NEW
        )
    )
    orchestrator = orchestrator_as_installed(control_plane, namespace, tmp_path)
    name = f"revoke-{namespace}"
    endpoint = f"localhost:{sim.address.rsplit(':', 1)[1]}"
    allowed = {"names": [namespace]}
    try:
        declare(
            api.FLEET_PROVIDER_KIND,
            name,
            {"endpoint": endpoint, "insecure": True, "allowedNamespaces": allowed},
        )
        orchestrator.start()
        cvs = CV(control_plane, namespace)
        cvs.create(cluster_version("revoked", providerRef={"name": name}))
        wait_for(
            "a cluster is out of service",
            lambda: monitor(sim)["available_in_service"] < len(IDS),
            timeout=60,
        )
        with control_plane.api_client() as client:
            objects = k8s.CustomObjectsApi(client)
            objects.patch_cluster_custom_object(
                api.GROUP,
                api.VERSION,
                api.FLEET_PROVIDER_PLURAL,
                name,
                {"spec": {"allowedNamespaces": {"names": ["somewhere-else"]}}},
            )
            current = wait_for("the run starts", lambda: cvs.current_run("revoked"), 30)
            run = str(current["metadata"]["name"])
            invalid = wait_for(
                "the run says access is gone and who waits",
                lambda: _status(
                    k8s.CustomObjectsApi(client), namespace, run, api.RunPhase.INVALID.value
                ),
                timeout=30,
            )
            assert "in flight wait where they are" in invalid["message"], invalid
            assert f"{api.LABEL_RUN}={run}" in invalid["message"], invalid
            # Nothing is called for this run while access is revoked: once the operations
            # started before end, no new one starts (watched for a few seconds, polling).
            wait_for(
                "in-flight operations end",
                lambda: monitor(sim)["operations_in_flight"] == 0,
                timeout=30,
            )
            started = monitor(sim)["mutations_total"]
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                assert monitor(sim)["mutations_total"] == started, "a call made without access"
                time.sleep(0.2)
            objects.patch_cluster_custom_object(
                api.GROUP,
                api.VERSION,
                api.FLEET_PROVIDER_PLURAL,
                name,
                {"spec": {"allowedNamespaces": allowed}},
            )
        try:
            done = wait_for(
                "the rollout completes once access is restored",
                lambda: cvs.phase_is("revoked", "Completed", "Halted"),
                timeout=120,
            )
        except TimeoutError as err:
            run_now = cvs.current_run("revoked") or {}
            raise AssertionError(
                f"{err}: run status {run_now.get('status')}; log tail "
                f"{orchestrator.log.read_text()[-2000:]}"
            ) from err
        assert done["phase"] == "Completed", done
        m = monitor(sim)
        assert m["clusters_by_version"] == {NEW: len(IDS)}
        assert m["available_in_service"] == len(IDS)
        assert m["min_available_in_service"] >= 2
        assert m["duplicate_mutations"] == 0
    finally:
        if orchestrator.proc is not None:
            orchestrator.stop()
        sim.stop()
