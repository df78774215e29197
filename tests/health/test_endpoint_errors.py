"""Issue 19 item 5 on the real stack (apiserver, sim plugin, `fleet-orchestrator run`): a
MetricSource's Prometheus that answers 400 echoing every request header (the bearer token the
orchestrator sent among them) and a secret of its own. Nothing it said is readable in the
tenant's namespace (every ClusterVersion, UpdateRun, ClusterUpgrade and Event, as JSON); the
status names the MetricSource, the code and a fixed reason; the answer is in the log, redacted.
The same for an HTTP hook whose receiver echoes the token read from the tenant's Secret."""

from __future__ import annotations

import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from orchestrator import api
from orchestrator.engine.access import INLINE_FLAG
from tests.controllers.test_rollout import NEW, cluster_version, fleet
from tests.install.conftest import install_namespace
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl
from tests.support.loopback import serving
from tests.support.orchestrator import CV, OrchestratorProcess, monitor, simulated_fleet

__all__ = ["install_namespace"]

pytestmark = pytest.mark.kube


class _Echo(http.server.BaseHTTPRequestHandler):
    """Prometheus gone wrong: 400, the request's headers echoed, and a secret of its own."""

    secret: str
    seen: list[dict[str, str]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def do_GET(self) -> None:
        self.seen.append(dict(self.headers))
        body = json.dumps(
            {
                "status": "error",
                "errorType": "bad_data",
                "error": f"rejected; request headers were {dict(self.headers)!r}; "
                f"backend password={self.secret}",
            }
        ).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echoing_prometheus(namespace: str) -> Iterator[tuple[str, str, list[dict[str, str]]]]:
    """(url, the endpoint's own secret, the headers of every request it got)."""
    secret = f"endpoint-secret-{namespace}"
    seen: list[dict[str, str]] = []
    handler = type("Echo", (_Echo,), {"secret": secret, "seen": seen})
    with serving(handler) as url:
        yield url, secret, seen


@pytest.fixture
def metric_source(
    control_plane: KubeCluster,
    namespace: str,
    install_namespace: str,
    echoing_prometheus: tuple[str, str, list[dict[str, str]]],
) -> Iterator[tuple[str, str]]:
    """The platform admin's MetricSource on the echoing endpoint, its token Secret in the
    orchestrator's namespace: (MetricSource name, token)."""
    url = echoing_prometheus[0]
    name, token = f"prom-{namespace}", f"token-marker-{namespace}-5d1e"
    kubectl(
        control_plane,
        *("-n", install_namespace, "create", "secret", "generic", name),
        f"--from-literal=token={token}",
    )
    with control_plane.api_client() as client:
        objects = k8s.CustomObjectsApi(client)
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.METRIC_SOURCE_KIND,
            "metadata": {"name": name},
            "spec": {
                "address": url,
                "bearerTokenSecretRef": {"name": name, "key": "token"},
                "allowedNamespaces": {"names": [namespace]},
            },
        }
        objects.create_cluster_custom_object(api.GROUP, api.VERSION, api.METRIC_SOURCE_PLURAL, body)
        try:
            yield name, token
        finally:
            objects.delete_cluster_custom_object(
                api.GROUP, api.VERSION, api.METRIC_SOURCE_PLURAL, name
            )
            kubectl(
                control_plane,
                *("-n", install_namespace, "delete", "secret", name, "--ignore-not-found"),
            )


def readable(cluster: KubeCluster, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """Everything of the project a tenant reads in its namespace, and every Event there."""
    with cluster.api_client() as client:
        objects = k8s.CustomObjectsApi(client)
        out = {
            plural: objects.list_namespaced_custom_object(
                api.GROUP, api.VERSION, namespace, plural
            )["items"]
            for plural in (api.PLURAL, api.UPDATE_RUN_PLURAL, api.CLUSTER_UPGRADE_PLURAL)
        }
        events = k8s.CoreV1Api(client).list_namespaced_event(namespace)
        out["events"] = [client.sanitize_for_serialization(e) for e in events.items]
    return out


def test_an_echoing_metric_source_leaks_nothing_into_the_tenants_namespace(
    control_plane: KubeCluster,
    namespace: str,
    install_namespace: str,
    tmp_path: Path,
    echoing_prometheus: tuple[str, str, list[dict[str, str]]],
    metric_source: tuple[str, str],
) -> None:
    _, endpoint_secret, seen = echoing_prometheus
    source, token = metric_source
    orchestrator = OrchestratorProcess(
        control_plane.kubeconfig,
        namespace,
        tmp_path / "orchestrator.log",
        *("--orchestrator-namespace", install_namespace),
        *(INLINE_FLAG, namespace),
    )
    check = {
        "name": "error-budget",
        "metric": {
            "provider": {"type": "prometheus", "sourceRef": {"name": source}},
            "query": 'sum(rate(http_errors_total{cluster="{{ cluster }}"}[5m]))',
            "thresholdRange": {"max": 0.05},
        },
    }
    health = {
        "interval": "1s",
        "successThreshold": 2,
        "failureThreshold": 3,
        "timeout": "2m",
        "checks": [check],
    }
    ids = ["edge-00", "edge-01", "edge-02"]
    spec = fleet(3)
    for i, cid in enumerate(ids):
        spec["clusters"][i]["id"] = cid
    try:
        with simulated_fleet(tmp_path, spec, NEW) as sim:
            orchestrator.start()
            cvs = CV(control_plane, namespace)
            cvs.create(cluster_version("edge", sim.address, ids, 2, healthChecks=health))
            wait_for("the run halts", lambda: cvs.phase_is("edge", "Halted"), timeout=120)
            failed = cvs.failed("edge")
            assert len(failed) == 1, failed
            assert monitor(sim)["available_in_service"] == 2  # the check really gated it
            world = readable(control_plane, namespace)
    finally:
        orchestrator.stop()
    # The endpoint really got the token, and answered with it and a secret of its own.
    assert seen and all(h.get("Authorization") == f"Bearer {token}" for h in seen), seen[:1]
    # The status says which endpoint failed, with the code and the fixed reason.
    expected = f"MetricSource {source}: query rejected (HTTP 400)"
    (entry,) = failed.values()
    assert entry["reason"] == "HealthCheckFailed", entry
    assert expected in entry["message"], entry
    assert all(expected in (r.get("message") or "") for r in entry["health"]["results"]), entry
    warnings = [e for e in world["events"] if e.get("type") == "Warning"]
    assert any(expected in (e.get("message") or "") for e in warnings), warnings
    # Nothing the endpoint said, nor the token, nor the admin's address, is readable here.
    text = json.dumps(world)
    for secret in (token, endpoint_secret, "bad_data", "request headers were"):
        assert secret not in text, secret
    assert echoing_prometheus[0] not in text
    # The answer is in the controller's log, redacted.
    log = orchestrator.log.read_text()
    assert endpoint_secret not in log  # password=... is masked
    assert token not in log
    assert "request headers were" in log and "Authorization" in log


def test_an_echoing_hook_receiver_leaks_nothing_into_the_tenants_namespace(
    control_plane: KubeCluster,
    namespace: str,
    tmp_path: Path,
    echoing_prometheus: tuple[str, str, list[dict[str, str]]],
) -> None:
    """The same echoing endpoint as a preUpgrade hook, its URL (with a signature in the query)
    and bearer token read from a Secret of the namespace."""
    url, endpoint_secret, seen = echoing_prometheus
    token, signature = f"hook-token-{namespace}-93ab", f"sig-{namespace}-0e7d"
    hook_url = f"{url}/hook?signature={signature}"
    kubectl(
        control_plane,
        *("-n", namespace, "create", "secret", "generic", "hook"),
        f"--from-literal=url={hook_url}",
        f"--from-literal=token={token}",
    )
    orchestrator = OrchestratorProcess(
        control_plane.kubeconfig, namespace, tmp_path / "orchestrator.log"
    )
    hook = {
        "http": {
            "urlSecretRef": {"name": "hook", "key": "url"},
            "bearerTokenSecretRef": {"name": "hook", "key": "token"},
            "retries": 0,
        },
        "timeout": "1m",
    }
    ids = [f"cluster-{i:02d}" for i in range(3)]
    try:
        with simulated_fleet(tmp_path, fleet(3), NEW) as sim:
            orchestrator.start()
            cvs = CV(control_plane, namespace)
            strategy = {"maxConcurrency": 1, "hooks": {"preUpgrade": hook}}
            cvs.create(cluster_version("hooked", sim.address, ids, 2, strategy=strategy))
            wait_for(
                "the run stops on the failing hook",
                lambda: cvs.phase_is("hooked", "Halted", "Failed"),
                timeout=120,
            )
            failed = cvs.failed("hooked")
            assert len(failed) == 1, failed
            assert monitor(sim)["mutations_total"] == 0  # the pre-hook failed before any
            world = readable(control_plane, namespace)
    finally:
        orchestrator.stop()
    assert seen and all(h.get("Authorization") == f"Bearer {token}" for h in seen), seen[:1]
    (entry,) = failed.values()
    assert entry["reason"] == "PreUpgradeHookFailed", entry
    assert "request rejected (HTTP 400)" in entry["message"], entry
    warnings = [e for e in world["events"] if e.get("type") == "Warning"]
    assert any("request rejected (HTTP 400)" in (e.get("message") or "") for e in warnings)
    text = json.dumps(world)
    for secret in (token, signature, endpoint_secret, "bad_data", "request headers were", url):
        assert secret not in text, secret
    log = orchestrator.log.read_text()
    assert "request headers were" in log  # the answer is the operator's, in the log ...
    for secret in (token, signature, endpoint_secret):  # ... without the credentials
        assert secret not in log, secret
