"""The fleet-metric-collector agent: reports, outages with conditions saying what is wrong,
recovery, token rotation, the reportNamespace guard, cleanup; and stale data read as UNKNOWN."""

from __future__ import annotations

import base64
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from devtools.controlplane import REPO_ROOT
from fleetupgrade.plugin.v1 import health_pb2
from plugins.kubefleet import CollectorOptions, MetricCollectorAgent
from tests.plugins.kubefleet.conftest import (
    KF,
    MemberApp,
    StartPlugin,
    apply,
    service_account_token,
)
from tests.plugins.kubefleet.support import (
    APP,
    APP_NS,
    AUTOAPPROVE,
    METRIC,
    conditions,
    hub_report,
    member_object,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import free_port
from tests.support.prometheus import prometheus_binary, running_prometheus

MEMBER = "member-2"
WEB = health_pb2.Workload(namespace=APP_NS, name=APP, kind="Deployment")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[MemberApp, str]]:
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    app = MemberApp()
    app.set([1.0, 1.0])
    app.start()
    try:
        with running_prometheus(tmp_path, [app.target], "1s") as url:
            yield app, url
    finally:
        app.stop()


@pytest.fixture
def agents() -> Iterator[Callable[..., MetricCollectorAgent]]:
    started: list[MetricCollectorAgent] = []

    def start(**options: Any) -> MetricCollectorAgent:
        agent = MetricCollectorAgent(
            CollectorOptions(
                cluster_name=MEMBER,
                max_backoff=1.0,
                registry=CollectorRegistry(),
                **{"cookbook": "seed", **options},
            )
        ).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


def _collector(member: KubeCluster, name: str, namespace: str = f"fleet-member-{MEMBER}") -> None:
    body = {
        "apiVersion": "metric.kubernetes-fleet.io/v1alpha1",
        "kind": "MetricCollector",
        "metadata": {"name": name, "annotations": {"fleetupgrade.io/collect-interval": "1s"}},
        "spec": {
            "prometheusUrl": "http://prometheus.prometheus.svc.cluster.local:9090",
            "reportNamespace": namespace,
        },
    }
    with member.api_client() as api:
        k8s.CustomObjectsApi(api).create_cluster_custom_object(*METRIC, "metriccollectors", body)


def _delete_collector(member: KubeCluster, name: str) -> None:
    with member.api_client() as api:
        k8s.CustomObjectsApi(api).delete_cluster_custom_object(*METRIC, "metriccollectors", name)


def _member_condition(member: KubeCluster, name: str, kind: str) -> dict[str, Any] | None:
    return conditions(member_object(member, "metriccollectors", name)).get(kind)


def test_prometheus_outage_is_reported_then_recovered_and_stale_data_is_unknown(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    prometheus: tuple[MemberApp, str],
    agents: Callable[..., MetricCollectorAgent],
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    member = member_clusters[MEMBER]
    _, url = prometheus
    name = names("mc-outage")
    plugin = start_plugin(report_max_age=4.0, cookbook="seed")
    agent = agents(
        member_kubeconfig=str(member.kubeconfig),
        hub_kubeconfig=str(hub.kubeconfig),
        prometheus_url=f"http://127.0.0.1:{free_port()}",  # nothing listens: an outage
    )
    _collector(member, name)

    report = wait_for(
        "a report saying the collection failed",
        lambda: conditions(hub_report(hub, MEMBER, name, "seed")).get("MetricsCollected"),
        timeout=30,
    )
    assert (report["status"], report["reason"]) == ("False", "CollectionFailed")
    assert "unreachable" in report["message"]
    collected = wait_for(
        "the member's MetricCollector says so too",
        lambda: _member_condition(member, name, "MetricsCollected"),
        timeout=30,
    )
    assert collected["status"] == "False"
    wait_for(
        "MetricsReported=True (the hub is fine)",
        lambda: (_member_condition(member, name, "MetricsReported") or {}).get("status") == "True",
        timeout=30,
    )
    [result] = plugin.client.check_workloads([MEMBER], [WEB])
    assert result.health == health_pb2.WORKLOAD_HEALTH_UNKNOWN
    assert "MetricsCollected=False" in result.message

    agent.options.prometheus_url = url  # Prometheus is back
    wait_for(
        "the report recovers",
        lambda: (
            (conditions(hub_report(hub, MEMBER, name, "seed")).get("MetricsCollected") or {}).get(
                "status"
            )
            == "True"
        ),
        timeout=30,
    )
    report_obj = hub_report(hub, MEMBER, name, "seed")
    assert report_obj is not None
    # What the seed schema keeps of each pod's reading: namespace, workloadName, health.
    assert report_obj["status"]["collectedMetrics"] == [
        {"namespace": APP_NS, "workloadName": APP, "health": True},
        {"namespace": APP_NS, "workloadName": APP, "health": True},
    ]
    assert report_obj["status"]["workloadsMonitored"] == 1
    assert report_obj["metadata"]["labels"]["metric.kubernetes-fleet.io/cluster"] == MEMBER
    results = wait_for(
        "HEALTHY from the report",
        lambda: [
            r
            for r in plugin.client.check_workloads([MEMBER], [WEB])
            if r.health == health_pb2.WORKLOAD_HEALTH_HEALTHY
        ],
        timeout=30,
    )
    assert results[0].healthy_replicas == 2

    agent.stop()  # the agent goes away: its last report ages out, and is never read as healthy
    [stale] = wait_for(
        "UNKNOWN once the report is stale",
        lambda: [
            r
            for r in plugin.client.check_workloads([MEMBER], [WEB])
            if r.health == health_pb2.WORKLOAD_HEALTH_UNKNOWN
        ],
        timeout=30,
    )
    assert "stale" in stale.message
    with hub.api_client() as api:
        k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
            *METRIC, f"fleet-member-{MEMBER}", "metriccollectorreports", name
        )
    _delete_collector(member, name)


def test_hub_token_from_a_file_rotation_and_the_report_namespace_guard(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    prometheus: tuple[MemberApp, str],
    agents: Callable[..., MetricCollectorAgent],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    member = member_clusters[MEMBER]
    _, url = prometheus
    apply(hub, KF / "rbac-agent-hub.yaml")
    kubectl_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "fleet-metric-collector", "namespace": f"fleet-member-{MEMBER}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "fleet-metric-collector-report-writer",
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": "fleet-metric-collector",
                "namespace": "fleet-system",
            }
        ],
    }
    with hub.api_client() as api:
        rbac = k8s.RbacAuthorizationV1Api(api)
        try:
            rbac.create_namespaced_role_binding(f"fleet-member-{MEMBER}", kubectl_binding)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    token = tmp_path / "token"
    token.write_text("not-a-token")
    ca = tmp_path / "ca.crt"
    ca.write_bytes(_hub_ca(hub))
    agents(
        member_kubeconfig=str(member.kubeconfig),
        hub_url=hub.url,
        hub_token_file=str(token),
        hub_ca_file=str(ca),
        prometheus_url=url,
    )
    name = names("mc-token")
    _collector(member, name)
    reported = wait_for(
        "MetricsReported=False while the token is refused",
        lambda: _member_condition(member, name, "MetricsReported"),
        timeout=30,
    )
    assert (reported["status"], reported["reason"]) == ("False", "HubUnavailable")
    assert "401" in reported["message"]
    assert hub_report(hub, MEMBER, name, "seed") is None

    token.write_text(service_account_token(hub, "fleet-system", "fleet-metric-collector"))
    wait_for(
        "the report once the token is valid",
        lambda: hub_report(hub, MEMBER, name, "seed"),
        timeout=30,
    )
    wait_for(
        "MetricsReported=True",
        lambda: (_member_condition(member, name, "MetricsReported") or {}).get("status") == "True",
        timeout=30,
    )

    # A collector that would write into another member's namespace is refused, not obeyed.
    other = names("mc-elsewhere")
    _collector(member, other, "fleet-member-member-1")
    refused = wait_for(
        "ReportNamespaceInvalid",
        lambda: _member_condition(member, other, "MetricsCollected"),
        timeout=30,
    )
    assert refused["reason"] == "ReportNamespaceInvalid"
    assert hub_report(hub, "member-1", other, "seed") is None

    # The collector goes away: so does its report.
    _delete_collector(member, name)
    _delete_collector(member, other)
    wait_for(
        "the report deleted", lambda: hub_report(hub, MEMBER, name, "seed") is None, timeout=30
    )


def _hub_ca(hub: KubeCluster) -> bytes:
    entry = yaml.safe_load(hub.kubeconfig.read_text())["clusters"][0]["cluster"]
    if "certificate-authority-data" in entry:
        return base64.b64decode(entry["certificate-authority-data"])
    return Path(entry["certificate-authority"]).read_bytes()


@pytest.mark.parametrize(
    ("module", "args", "words"),
    [
        ("plugins.kubefleet.collector", ["--hub-url", "https://h:1"], "--cluster-name"),
        ("plugins.kubefleet.collector", ["--cluster-name", "m1"], "--hub-url"),
        ("plugins.kubefleet.server", ["--health-source", "prometheus"], "--central-prometheus-url"),
    ],
)
def test_commands_refuse_incomplete_settings_naming_the_flag(
    module: str, args: list[str], words: str
) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert words in done.stderr


def test_current_cookbook_the_agent_fills_the_hub_created_report_as_the_cookbooks_collector(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,  # joins the members: their fleet-member-<name> namespaces
    prometheus: tuple[MemberApp, str],
    agents: Callable[..., MetricCollectorAgent],
    names: Callable[[str], str],
) -> None:
    """The hub side creates the report (spec.prometheusUrl); the agent only fills its status
    with the current schema's fields, says when Prometheus fails, and never deletes it."""
    _, url = prometheus
    name = names("mc-current")
    body = {
        "apiVersion": "autoapprove.kubernetes-fleet.io/v1alpha1",
        "kind": "MetricCollectorReport",
        "metadata": {
            "name": name,
            "namespace": f"fleet-member-{MEMBER}",
            "annotations": {"fleetupgrade.io/collect-interval": "1s"},
        },
        "spec": {"prometheusUrl": f"http://127.0.0.1:{free_port()}"},  # nothing listens
    }
    with hub.api_client() as api:
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(
            *AUTOAPPROVE, f"fleet-member-{MEMBER}", "metriccollectorreports", body
        )
    agents(
        member_kubeconfig=str(member_clusters[MEMBER].kubeconfig),
        hub_kubeconfig=str(hub.kubeconfig),
        cookbook="current",
    )
    failed = wait_for(
        "MetricsCollected=False on the hub's report",
        lambda: conditions(hub_report(hub, MEMBER, name)).get("MetricsCollected"),
        timeout=30,
    )
    assert (failed["status"], failed["reason"]) == ("False", "CollectionFailed")
    with hub.api_client() as api:  # the hub side points the report at the real Prometheus
        k8s.CustomObjectsApi(api).patch_namespaced_custom_object(
            *AUTOAPPROVE,
            f"fleet-member-{MEMBER}",
            "metriccollectorreports",
            name,
            {"spec": {"prometheusUrl": url}},
        )
    report = wait_for(
        "the report filled",
        lambda: (
            (r := hub_report(hub, MEMBER, name))
            and (conditions(r).get("MetricsCollected") or {}).get("status") == "True"
            and r
        ),
        timeout=30,
    )
    assert sorted(report["status"]["collectedMetrics"], key=lambda m: m["podName"]) == [
        {
            "namespace": APP_NS,
            "workloadName": APP,
            "workloadKind": "Deployment",
            "podName": f"{APP}-{i}",
            "health": True,
        }
        for i in range(2)
    ]
    assert report["status"]["workloadsMonitored"] == 1
    assert report["spec"] == {"prometheusUrl": url}  # the agent never writes the spec
    with hub.api_client() as api:
        k8s.CustomObjectsApi(api).delete_namespaced_custom_object(
            *AUTOAPPROVE, f"fleet-member-{MEMBER}", "metriccollectorreports", name
        )
