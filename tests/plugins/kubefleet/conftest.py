"""Fixtures of the KubeFleet plugin tests: a hub and three member apiservers, the emulator,
per-member sample apps with a real Prometheus each, the real metric-collector agents, plugins.

The hub serves the real upstream CRDs, loaded from ../shared/upstream at run time (CEL rules
stripped for the 1.20 server; tests assert the ones our writes meet): KubeFleet's (kf_*), the
current cookbook's (cbmain_*, autoapprove.kubernetes-fleet.io) and the seed tutorial's
(cbpr_*, metric.kubernetes-fleet.io) side by side, so one hub serves both generations and a
plugin is started for one of them (start_plugin(cookbook=...); current by default) and the
agents serve both (--cookbook both).

Members: member-1 (environment=staging), member-2 and member-3 (environment=prod), as in the
cookbook tutorial. Each member runs its own sample app (workload_health per pod) and its own
Prometheus scraping it; the agent of each member (a real `python -m plugins.kubefleet.collector`
process) authenticates to the hub with a ServiceAccount token bound to the agent RBAC of
manifests/kubefleet/rbac-agent-hub.yaml.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from devtools.controlplane import REPO_ROOT
from plugins.kubefleet import KubeFleetConfig, KubeFleetOptions, KubeFleetPlugin
from plugins.sdk.client import ClientTLS, PluginClient
from plugins.sdk.server import ServerTLS
from tests.support.kube import KubeCluster
from tests.support.kubectl import kubectl
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import OrchestratorProcess, free_port
from tests.support.prometheus import prometheus_binary, running_prometheus
from tests.support.upstream import load_upstream_crds

KF = REPO_ROOT / "manifests" / "kubefleet"
HUB_CRDS = ("kf_*.yaml", "cbmain_*.yaml", "cbpr_*.yaml")
MEMBER_CRDS = ("cbpr_metriccollectors.yaml",)
MEMBERS = {
    "member-1": {"environment": "staging"},
    "member-2": {"environment": "prod"},
    "member-3": {"environment": "prod"},
}
APP, APP_NS = "sample-metric-app", "test-ns"


EMPTY_STRING_FIELDS = frozenset({"group", "apiGroup"})
"""String fields where "" is meaningful (the core API group) in what the tests apply."""


def _tolerate_test_server_nulls(node: Any) -> Any:
    """The CRDs as the 1.20 test server needs them: it stores "" as null in some string fields
    (a quirk of that build, not of upstream; ../shared/upstream/SOURCES.md), so the fields of
    EMPTY_STRING_FIELDS are marked nullable. Nothing else changes."""
    if isinstance(node, dict):
        out = {k: _tolerate_test_server_nulls(v) for k, v in node.items()}
        for name, prop in (out.get("properties") or {}).items():
            if name in EMPTY_STRING_FIELDS and prop.get("type") == "string":
                prop["nullable"] = True
        return out
    if isinstance(node, list):
        return [_tolerate_test_server_nulls(v) for v in node]
    return node


@pytest.fixture(scope="session")
def hub(extra_apiserver: Callable[[str], KubeCluster]) -> KubeCluster:
    """The KubeFleet hub: its own apiserver with the upstream KubeFleet and cookbook CRDs."""
    cluster = extra_apiserver("kf-hub")
    cluster.install_crds(*(_tolerate_test_server_nulls(c) for c in load_upstream_crds(*HUB_CRDS)))
    return cluster


@pytest.fixture(scope="session")
def member_clusters(extra_apiserver: Callable[[str], KubeCluster]) -> dict[str, KubeCluster]:
    """member name → its apiserver (with the seed tutorial's MetricCollector CRD)."""
    out = {}
    for index, name in enumerate(MEMBERS, start=1):
        cluster = extra_apiserver(f"kf-member-{index}")
        cluster.install_crds(*load_upstream_crds(*MEMBER_CRDS))
        out[name] = cluster
    return out


@pytest.fixture
def emulator(
    hub: KubeCluster, member_clusters: dict[str, KubeCluster]
) -> Iterator[KubeFleetEmulator]:
    """The KubeFleet emulator with the three tutorial members joined."""
    emu = KubeFleetEmulator(hub, member_clusters, update_seconds=0.2, poll_seconds=0.25)
    for name, labels in MEMBERS.items():
        emu.join(name, labels, "1.29.4")
    emu.start()
    yield emu
    emu.stop_loop()
    emu.clear()
    emu.stop()


class MemberApp:
    """A member's sample app: workload_health{app, namespace, pod, workload_kind} per pod."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.gauge = Gauge(
            "workload_health",
            "1 when the pod's workload is healthy",
            ["app", "namespace", "pod", "workload_kind"],
            registry=self.registry,
        )
        self.port = free_port()
        self._server: Any = None
        self._pods: dict[tuple[str, str], list[tuple[str, str]]] = {}

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(
        self, values: list[float], app: str = APP, namespace: str = APP_NS, kind: str = "Deployment"
    ) -> None:
        """The pods of app now: one workload_health value each (old series removed)."""
        for pod, old_kind in self._pods.pop((app, namespace), []):
            self.gauge.remove(app, namespace, pod, old_kind)
        pods = []
        for index, value in enumerate(values):
            pod = f"{app}-{index}"
            self.gauge.labels(app, namespace, pod, kind).set(value)
            pods.append((pod, kind))
        self._pods[(app, namespace)] = pods

    def start(self) -> None:
        self._server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def service_account_token(cluster: KubeCluster, namespace: str, name: str) -> str:
    """A TokenRequest token of the ServiceAccount (1 h)."""
    return kubectl(cluster, "create", "token", name, "-n", namespace, "--duration", "1h").strip()


def apply(cluster: KubeCluster, path: Path) -> None:
    kubectl(cluster, "apply", "-f", str(path))


def service_account_kubeconfig(cluster: KubeCluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig of the cluster that authenticates as the ServiceAccount (TokenRequest)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": service_account_token(cluster, namespace, name)}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@pytest.fixture(scope="session")
def plugin_kubeconfig(hub: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hub as the plugin's ServiceAccount, with exactly manifests/kubefleet/rbac-plugin.yaml."""
    apply(hub, KF / "rbac-plugin.yaml")
    path = tmp_path_factory.mktemp("kubefleet-plugin") / "plugin.kubeconfig"
    return service_account_kubeconfig(hub, "fleet-system", "fleet-plugin-kubefleet", path)


@dataclass
class AgentProcess:
    """One fleet-metric-collector process."""

    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=REPO_ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        handle.close()
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Fleet:
    """Everything member-side: apps, Prometheus URLs, agents."""

    apps: dict[str, MemberApp]
    prometheus: dict[str, str]
    agents: dict[str, AgentProcess] = field(default_factory=dict)

    def healthy(self, *names: str, pods: int = 1) -> None:
        for name in names or tuple(self.apps):
            self.apps[name].set([1.0] * pods)

    def unhealthy(self, name: str, pods: int = 1) -> None:
        self.apps[name].set([0.0] * pods)


def agent_args(
    name: str,
    member: KubeCluster,
    hub: KubeCluster,
    token_file: Path,
    prometheus: str,
    cookbook: str = "both",
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "plugins.kubefleet.collector",
        "--cluster-name",
        name,
        "--kubeconfig",
        str(member.kubeconfig),
        "--hub-url",
        hub.url,
        "--hub-token-file",
        str(token_file),
        "--hub-ca-file",
        str(_ca_file(hub)),
        "--prometheus-url",
        prometheus,
        "--max-backoff",
        "2",
        "--cookbook",
        cookbook,
    ]


def _ca_file(cluster: KubeCluster) -> Path:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    entry = config["clusters"][0]["cluster"]
    if "certificate-authority" in entry:
        return Path(entry["certificate-authority"])
    path = cluster.kubeconfig.parent / "hub-ca.crt"
    path.write_bytes(base64.b64decode(entry["certificate-authority-data"]))
    return path


@pytest.fixture(scope="module")
def fleet(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """Per member: sample app, a real Prometheus scraping it, and the real agent process."""
    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("kubefleet-fleet")
    for name in MEMBERS:
        _bind_agent(hub, name)
    apply(hub, KF / "rbac-agent-hub.yaml")
    with ExitStack() as stack:
        apps: dict[str, MemberApp] = {}
        urls: dict[str, str] = {}
        for name in MEMBERS:
            app = MemberApp()
            app.set([1.0])
            app.start()
            stack.callback(app.stop)
            apps[name] = app
            workdir = tmp / name
            workdir.mkdir()
            urls[name] = stack.enter_context(running_prometheus(workdir, [app.target], "1s"))
        result = Fleet(apps, urls)
        for name, member in member_clusters.items():
            apply(member, KF / "rbac-agent-member.yaml")
            token = tmp / f"{name}.token"
            token.write_text(service_account_token(hub, "fleet-system", "fleet-metric-collector"))
            agent = AgentProcess(
                name, agent_args(name, member, hub, token, urls[name]), tmp / f"{name}-agent.log"
            )
            result.agents[name] = agent.start()
            stack.callback(agent.stop)
        yield result


def _bind_agent(hub: KubeCluster, member: str) -> None:
    """The per-member RoleBinding of the agent's hub identity in fleet-member-<member>."""
    namespace = f"fleet-member-{member}"
    with hub.api_client() as api:
        try:
            k8s.CoreV1Api(api).create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace))
            )
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "fleet-metric-collector", "namespace": namespace},
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
    kubectl(hub, "apply", "-f", "-", stdin=json.dumps(binding))


@dataclass
class RunningPlugin:
    """A plugin on loopback and a client for it."""

    plugin: KubeFleetPlugin
    client: PluginClient

    @property
    def address(self) -> str:
        return self.plugin.address


StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture
def start_plugin(hub: KubeCluster) -> Iterator[StartPlugin]:
    """start_plugin(kubeconfig=None, tls=None, client_tls=None, listen=..., **config): an
    in-process plugin on the hub (tls: serve TLS/mTLS; client_tls: the test client's side)."""
    running: list[RunningPlugin] = []

    def start(
        kubeconfig: Path | None = None,
        tls: ServerTLS | None = None,
        client_tls: ClientTLS | None = None,
        listen: str = "127.0.0.1:0",
        **config: Any,
    ) -> RunningPlugin:
        settings = {
            "cookbook": "current",
            "collect_interval": "1s",
            "report_max_age": 6.0,
            "evaluate_interval": 0.5,
            **config,
        }
        options = KubeFleetOptions(
            config=KubeFleetConfig(**settings),
            kubeconfig=str(kubeconfig or hub.kubeconfig),
            registry=CollectorRegistry(),
            tls=tls,
            listen=listen,
        )
        plugin = KubeFleetPlugin(options)
        client = PluginClient(plugin.address, tls=client_tls, caller="kubefleet-tests")
        handle = RunningPlugin(plugin, client)
        running.append(handle)
        return handle

    yield start
    for handle in reversed(running):
        handle.client.close()
        handle.plugin.stop(grace=0)


@pytest.fixture
def names() -> Callable[[str], str]:
    """names(prefix): a fresh DNS name for this test."""
    token = uuid.uuid4().hex[:6]
    return lambda prefix: f"{prefix}-{token}"


@contextmanager
def central_prometheus(tmp: Path, targets: dict[str, str], label: str = "cluster") -> Iterator[str]:
    """One Prometheus scraping every member app, each job labelled with its cluster."""
    jobs = [
        {
            "job_name": f"member-{cluster}",
            "static_configs": [{"targets": [target], "labels": {label: cluster}}],
        }
        for cluster, target in sorted(targets.items())
    ]
    with running_prometheus(tmp, scrape_configs=jobs, name="central") as url:
        yield url


@pytest.fixture
def orchestrator(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., OrchestratorProcess]]:
    """orchestrator(plugin, *extra): the real fleet-orchestrator process, its gate loop pointed
    at the plugin (--plugin kubefleet=ADDRESS)."""
    started: list[OrchestratorProcess] = []

    def start(plugin: RunningPlugin, *extra: str) -> OrchestratorProcess:
        proc = OrchestratorProcess(
            control_plane.kubeconfig,
            namespace,
            tmp_path / "orchestrator.log",
            "--plugin",
            f"kubefleet={plugin.address}",
            *extra,
        ).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
