"""Benchmark of the KubeFleet plugin: hub API requests per gate evaluation cycle, by fleet size.

A private control plane (etcd + kube-apiserver, devtools.controlplane) is the hub, with the
minimal KubeFleet CRDs and ours. For each fleet size N (default 10, 100, 1000) it registers N
MemberClusters, writes N MetricCollectorReports (emulated agents: every report fresh and
healthy), a ClusterStagedUpdateRun whose one stage holds all N clusters, its pending
ClusterApprovalRequest and a tracker. The plugin runs in-process on that hub. Once it is in
steady state (gate published, collection objects and its condition written), one "gate
evaluation cycle" is what the orchestrator's gate loop does for the gate: ListGates, then
CheckWorkloads for every cluster of the stage. Counted: the requests the plugin's adapter sends
to the hub (by verb) during the cycles, and, as a cross-check, the hub's own
apiserver_request_total (GET and LIST, all clients). Half-way through the cycles every report is
refreshed once (as the agents would), so watch traffic flows while the cycles run.

With --scale-mode and Prometheus installed, the same is measured with the plugin reading one
central Prometheus (a sample app exposing workload_health of N clusters) instead of reports.

    python -m benchmarks.bench_kubefleet [--sizes 10,100,1000] [--cycles 20] [--scale-mode]
        [--json PATH]

Prints numbers; it is not a test. Target (issue 6): requests per cycle do not grow with N.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from fleetupgrade.plugin.v1 import health_pb2
from plugins.kubefleet import KubeFleetConfig, KubeFleetOptions, KubeFleetPlugin, collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import CLUSTER_APPROVAL_REQUESTS
from plugins.sdk.client import PluginClient

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
KF = REPO / "manifests" / "kubefleet"
PLACEMENT = ("placement.kubernetes-fleet.io", "v1beta1")
METRIC = ("metric.kubernetes-fleet.io", "v1alpha1")
APP, APP_NS = "sample-metric-app", "test-ns"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def _hub(workdir: Path) -> Iterator[tuple[Any, str, str]]:
    """A private control plane with the KubeFleet CRDs; yields (KubeCluster, url, token)."""
    from devtools.controlplane import ControlPlane, ensure_binaries  # noqa: PLC0415
    from tests.support.kube import KubeCluster  # noqa: PLC0415
    from tests.support.upstream import load_upstream_crds  # noqa: PLC0415

    apiserver, etcd = ensure_binaries()
    plane = ControlPlane(workdir, kube_apiserver=apiserver, etcd=etcd)
    try:
        server = plane.start()
        cluster = KubeCluster(server)
        # The real upstream CRDs (../shared/upstream), both cookbook generations.
        cluster.install_crds(*load_upstream_crds("kf_*.yaml", "cbmain_*.yaml", "cbpr_*.yaml"))
        yield cluster, server.url, plane.token
        cluster.close()
    finally:
        plane.stop(purge=True)


class _Fleet:
    """Writes what KubeFleet and the agents would: members, namespaces, reports, run, request."""

    def __init__(self, cluster: Any) -> None:
        self.api_client = cluster.api_client()
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)
        self.members: list[str] = []

    def grow(self, size: int) -> None:
        for index in range(len(self.members), size):
            name = f"member-{index:04d}"
            self.core.create_namespace(
                k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=f"fleet-member-{name}"))
            )
            body = {
                "apiVersion": "cluster.kubernetes-fleet.io/v1beta1",
                "kind": "MemberCluster",
                "metadata": {"name": name, "labels": {"environment": "prod"}},
                "spec": {"identity": {"kind": "ServiceAccount", "name": "agent"}},
            }
            self.custom.create_cluster_custom_object(
                "cluster.kubernetes-fleet.io", "v1beta1", "memberclusters", body
            )
            status = {
                "status": {
                    "conditions": [_cond("Joined")],
                    "agentStatus": [
                        {
                            "type": "MemberAgent",
                            "conditions": [_cond("Joined"), _cond("Healthy")],
                            "lastReceivedHeartbeat": _now(),
                        }
                    ],
                    "properties": {
                        "k8s.io/k8s-version": {"value": "v1.29.4", "observationTime": _now()}
                    },
                }
            }
            self.custom.patch_cluster_custom_object_status(
                "cluster.kubernetes-fleet.io", "v1beta1", "memberclusters", name, status
            )
            self.members.append(name)

    def gate(self, run: str, size: int) -> str:
        """A run with one stage of the first `size` members, its tracker and approval request."""
        members = self.members[:size]
        self.custom.create_cluster_custom_object(
            *METRIC,
            "clusterstagedworkloadtrackers",
            {
                "apiVersion": "metric.kubernetes-fleet.io/v1alpha1",
                "kind": "ClusterStagedWorkloadTracker",
                "metadata": {"name": run},
                "workloads": [{"name": APP, "namespace": APP_NS, "healthyReplicas": 1}],
            },
        )
        self.custom.create_cluster_custom_object(
            *PLACEMENT,
            "clusterstagedupdateruns",
            {
                "apiVersion": "placement.kubernetes-fleet.io/v1beta1",
                "kind": "ClusterStagedUpdateRun",
                "metadata": {"name": run},
                "spec": {
                    "placementName": run,
                    "stagedRolloutStrategyName": run,
                    "resourceSnapshotIndex": "0",
                    "state": "Run",
                },
            },
        )
        status = {
            "status": {
                "stagesStatus": [
                    {
                        "stageName": "prod",
                        "clusters": [{"clusterName": c} for c in members],
                        "afterStageTaskStatus": [
                            {"type": "Approval", "approvalRequestName": f"{run}-after-prod"}
                        ],
                    }
                ],
                "conditions": [_cond("Initialized"), _cond("Progressing")],
            }
        }
        self.custom.patch_cluster_custom_object_status(
            *PLACEMENT, "clusterstagedupdateruns", run, status
        )
        request = f"{run}-after-prod"
        self.custom.create_cluster_custom_object(
            *PLACEMENT,
            "clusterapprovalrequests",
            {
                "apiVersion": "placement.kubernetes-fleet.io/v1beta1",
                "kind": "ClusterApprovalRequest",
                "metadata": {
                    "name": request,
                    "labels": {
                        "kubernetes-fleet.io/targetUpdateRun": run,
                        "kubernetes-fleet.io/targetUpdatingStage": "prod",
                        "kubernetes-fleet.io/taskType": "afterStage",
                        "kubernetes-fleet.io/isLatestUpdateRunApproval": "true",
                    },
                },
                "spec": {"parentStageRollout": run, "targetStage": "prod"},
            },
        )
        return request

    def reports(self, collector: str, size: int, *, create: bool = True) -> None:
        """Every member's report for the collector: created (unless only refreshing), then its
        status written, as the agents do every collection."""
        for name in self.members[:size]:
            namespace = f"fleet-member-{name}"
            body = {
                "apiVersion": "metric.kubernetes-fleet.io/v1alpha1",
                "kind": "MetricCollectorReport",
                "metadata": {
                    "name": collector,
                    "namespace": namespace,
                    "labels": {"metric.kubernetes-fleet.io/metric-collector": collector},
                },
                "spec": {"metricCollector": collector, "clusterName": name},
            }
            try:
                if create:
                    self.custom.create_namespaced_custom_object(
                        *METRIC, namespace, "metriccollectorreports", body
                    )
            except ApiException as exc:
                if exc.status != 409:
                    raise
            status = {
                "status": {
                    "conditions": [_cond("MetricsCollected")],
                    "workloadsMonitored": 1,
                    "lastCollectionTime": _now(),
                    "collectedMetrics": [
                        {
                            "namespace": APP_NS,
                            "workloadName": APP,
                            "podName": f"{APP}-0",
                            "health": True,
                        }
                    ],
                }
            }
            self.custom.patch_namespaced_custom_object_status(
                *METRIC, namespace, "metriccollectorreports", collector, status
            )


def _cond(kind: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": "Emulated",
        "message": "written by the benchmark",
        "lastTransitionTime": _now(),
    }


def _apiserver_reads(url: str, token: str, ca: Path | None) -> float:
    """GET + LIST requests the hub has served so far (apiserver_request_total)."""
    import ssl  # noqa: PLC0415

    context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    request = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        text = answer.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and re.search(r'verb="(GET|LIST)"', line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(what: str, check: Any, timeout: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise SystemExit(f"{what}: not reached within {timeout:.0f}s")


def _measure(
    plugin: KubeFleetPlugin,
    client: PluginClient,
    gate_id: str,
    cycles: int,
    refresh: Any,
    reads: Any,
) -> dict[str, Any]:
    gate = next(g for g in client.list_gates() if g.id == gate_id)
    workloads = [health_pb2.Workload(namespace=APP_NS, name=APP)]
    before, hub_before = plugin.hub.kube.requests(), reads()
    latencies = []
    healthy = 0
    for cycle in range(cycles):
        if cycle == cycles // 2:
            refresh()
        started = time.perf_counter()
        listed = client.list_gates()
        results = client.check_workloads(list(gate.cluster_ids), workloads)
        latencies.append(time.perf_counter() - started)
        assert any(g.id == gate_id for g in listed)
        healthy = sum(r.health == health_pb2.WORKLOAD_HEALTH_HEALTHY for r in results)
    after, hub_after = plugin.hub.kube.requests(), reads()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}
    delta = {k: v for k, v in delta.items() if v}
    return {
        "cycles": cycles,
        "plugin_requests": delta,
        "plugin_requests_per_cycle": sum(delta.values()) / cycles,
        "hub_get_list_per_cycle": (hub_after - hub_before) / cycles,
        "cycle_ms_p50": statistics.median(latencies) * 1e3,
        "healthy_results": healthy,
    }


def _bench_reports(cluster: Any, url: str, token: str, sizes: list[int], cycles: int) -> list[Any]:
    fleet = _Fleet(cluster)
    out = []
    ca = _ca_of(cluster)
    for size in sizes:
        started = time.monotonic()
        fleet.grow(size)
        run = f"bench-{size}"
        request = fleet.gate(run, size)
        collector = collector_names(GateRef(CLUSTER_APPROVAL_REQUESTS, "", request, run, "prod"))[0]
        fleet.reports(collector, size)
        setup = time.monotonic() - started
        plugin = KubeFleetPlugin(
            KubeFleetOptions(
                config=KubeFleetConfig(
                    collect_interval="30s", report_max_age=3600.0, cookbook="seed"
                ),
                kubeconfig=str(cluster.kubeconfig),
                registry=CollectorRegistry(),
                sync_wait=120.0,
            )
        )
        client = PluginClient(plugin.address, caller="bench-kubefleet")
        try:
            gate_id = f"ClusterApprovalRequest/{request}"
            _wait(
                "steady state (condition written)",
                lambda r=request: _condition_written(fleet, r),
            )
            time.sleep(1.0)  # let the writes of the first pass come back through the watches
            result = _measure(
                plugin,
                client,
                gate_id,
                cycles,
                lambda c=collector, n=size: fleet.reports(c, n, create=False),
                lambda: _apiserver_reads(url, token, ca),
            )
        finally:
            client.close()
            plugin.stop(grace=0)
        result.update(clusters=size, mode="reports", setup_seconds=round(setup, 1))
        out.append(result)
        _print(result)
    return out


def _condition_written(fleet: _Fleet, request: str) -> bool:
    obj = fleet.custom.get_cluster_custom_object(*PLACEMENT, "clusterapprovalrequests", request)
    return any(
        c["type"] == "fleetupgrade.io/WorkloadsHealthy" and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _ca_of(cluster: Any) -> Path | None:
    import base64  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    entry = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]
    if "certificate-authority" in entry:
        return Path(entry["certificate-authority"])
    if "certificate-authority-data" in entry:
        path = Path(cluster.kubeconfig).parent / "bench-ca.crt"
        path.write_bytes(base64.b64decode(entry["certificate-authority-data"]))
        return path
    return None


@contextmanager
def _central_prometheus(workdir: Path, members: list[str]) -> Iterator[str]:
    """A sample app exposing workload_health of every member, scraped by one Prometheus."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "workload_health", "health", ["cluster", "app", "namespace", "pod"], registry=registry
    )
    for name in members:
        gauge.labels(name, APP, APP_NS, f"{APP}-0").set(1.0)
    import socket  # noqa: PLC0415

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    app_port, prom_port = port(), port()
    server, _ = start_http_server(app_port, addr="127.0.0.1", registry=registry)
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: fleet\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{app_port}']}}]\n"
    )
    binary = shutil.which("prometheus")
    assert binary
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{prom_port}"
    try:
        _wait("Prometheus scrapes the fleet app", lambda: _has_series(url), timeout=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        server.shutdown()


def _has_series(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?query=up%3D%3D1", timeout=2) as answer:
            return bool(json.loads(answer.read())["data"]["result"])
    except OSError:
        return False


def _bench_scale_mode(
    cluster: Any, url: str, token: str, sizes: list[int], cycles: int, workdir: Path
) -> list[Any]:
    fleet = _Fleet(cluster)
    fleet.members = [f"member-{i:04d}" for i in range(max(sizes))]  # registered by the first part
    out = []
    ca = _ca_of(cluster)
    with _central_prometheus(workdir, fleet.members) as prometheus:
        for size in sizes:
            run = f"scale-{size}"
            request = fleet.gate(run, size)
            plugin = KubeFleetPlugin(
                KubeFleetOptions(
                    config=KubeFleetConfig(
                        cookbook="seed",
                        health_source="prometheus",
                        central_prometheus_url=prometheus,
                        report_max_age=3600.0,
                    ),
                    kubeconfig=str(cluster.kubeconfig),
                    registry=CollectorRegistry(),
                    sync_wait=120.0,
                )
            )
            client = PluginClient(plugin.address, caller="bench-kubefleet")
            try:
                _wait(
                    "steady state (condition written)",
                    lambda r=request: _condition_written(fleet, r),
                )
                time.sleep(1.0)
                result = _measure(
                    plugin,
                    client,
                    f"ClusterApprovalRequest/{request}",
                    cycles,
                    lambda: None,
                    lambda: _apiserver_reads(url, token, ca),
                )
            finally:
                client.close()
                plugin.stop(grace=0)
            result.update(clusters=size, mode="central-prometheus")
            out.append(result)
            _print(result)
    return out


def _print(result: dict[str, Any]) -> None:
    print(
        f"{result['mode']:>18} N={result['clusters']:>5}: plugin→hub requests/cycle "
        f"{result['plugin_requests_per_cycle']:.2f} {result['plugin_requests'] or '{}'}, "
        f"hub GET+LIST/cycle (all clients) {result['hub_get_list_per_cycle']:.2f}, "
        f"cycle p50 {result['cycle_ms_p50']:.1f} ms, healthy {result['healthy_results']}/"
        f"{result['clusters']}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints one line per fleet size (and mode)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000", help="fleet sizes (comma-separated)")
    parser.add_argument("--cycles", type=int, default=20, help="gate evaluation cycles per size")
    parser.add_argument(
        "--scale-mode", action="store_true", help="also measure the central-Prometheus mode"
    )
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with (
        tempfile.TemporaryDirectory(prefix="bench-kubefleet-") as tmp,
        _hub(Path(tmp) / "plane") as (cluster, url, token),
    ):
        results = _bench_reports(cluster, url, token, sizes, args.cycles)
        if args.scale_mode and shutil.which("prometheus") is None:
            print("prometheus is not installed: skipping --scale-mode", file=sys.stderr)
        elif args.scale_mode:
            results += _bench_scale_mode(cluster, url, token, sizes, args.cycles, Path(tmp))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
