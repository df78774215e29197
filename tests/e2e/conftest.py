"""The real stack for the end-to-end tests of issue 11: apiserver, orchestrator process, sim.

Each test here starts the real `fleet-orchestrator run` as a child process against the local
kube-apiserver (tests/conftest.py) and the simulated fleet plugin (plugins/sim) over real gRPC,
and asserts the world: the sim's clusters and invariant monitor, and the ClusterUpgrade,
UpdateRun and ClusterVersion objects on the apiserver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from orchestrator import api
from plugins.sim.server import SimOptions, Simulator
from tests.support.kube import KubeCluster, wait_for
from tests.support.orchestrator import OrchestratorProcess, seed_cluster_version

OLD, NEW = "1.28.5", "1.29.1"


def fleet_file(
    n: int,
    step: float = 0.2,
    *,
    faults: dict[str, Any] | None = None,
    metrics: dict[str, float] | None = None,
    per_cluster: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A sim fleet file: clusters cluster-00.. at OLD with two node pools, short steps."""
    clusters = []
    for i in range(n):
        cid = f"cluster-{i:02d}"
        entry: dict[str, Any] = {
            "id": cid,
            "labels": {"index": str(i)},
            "controlPlaneVersion": OLD,
            "nodePools": [
                {"name": "default-pool", "version": OLD},
                {"name": "workers", "version": OLD},
            ],
        }
        entry.update((per_cluster or {}).get(cid, {}))
        clusters.append(entry)
    body: dict[str, Any] = {
        "defaults": {
            "stepSeconds": {
                "serviceOut": step,
                "serviceIn": step,
                "controlPlane": step,
                "nodePool": step,
            },
            "jitter": 0.1,
            "metrics": metrics or {},
        },
        "clusters": clusters,
    }
    if faults:
        body["faults"] = faults
    return body


def ids(n: int) -> list[str]:
    """cluster-00 .. cluster-(n-1)."""
    return [f"cluster-{i:02d}" for i in range(n)]


def cluster_version(
    name: str, endpoint: str, clusters: list[str], required: int, **spec: Any
) -> dict[str, Any]:
    """A ClusterVersion targeting NEW on the given clusters (original manifest shape + extras)."""
    return seed_cluster_version(name, endpoint, clusters, NEW, required, **spec)


def metric_checks(
    query: str,
    max_value: float,
    *,
    interval: str = "300ms",
    success: int = 2,
    failure: int = 2,
    timeout: str = "30s",
    endpoint: str | None = None,
) -> dict[str, Any]:
    """A healthChecks block with one plugin QueryMetric check (the sim's HealthService)."""
    provider: dict[str, Any] = {"type": "plugin"}
    if endpoint:
        provider.update(endpoint=endpoint, insecure=True)
    return {
        "interval": interval,
        "successThreshold": success,
        "failureThreshold": failure,
        "timeout": timeout,
        "checks": [
            {
                "name": "error-ratio",
                "metric": {
                    "provider": provider,
                    "query": query,
                    "thresholdRange": {"max": max_value},
                },
            }
        ],
    }


class Sim:
    """The sim plugin in-process (real gRPC server) with its fleet file, for one test."""

    def __init__(self, tmp: Path, fleet: dict[str, Any], window: float = 5.0) -> None:
        self.path = tmp / "fleet.yaml"
        self.path.write_text(yaml.safe_dump(fleet))
        self.sim = Simulator(
            SimOptions(
                fleet_file=str(self.path),
                monitor_file=str(tmp / "monitor.json"),
                target_version=NEW,
                seed=11,
                reload_interval=0,
                mutator_window_seconds=window,
            )
        )
        self.fleet = self.sim.fleet
        # Who mutated, and when: an observation of the sim's own caller accounting (the
        # monitor sees the x-fleetupgrade-caller metadata of every mutating RPC).
        self.calls: list[tuple[str, float]] = []
        self._lock = threading.Lock()
        record = self.sim.monitor.mutating_call

        def observed(caller: str) -> bool:
            with self._lock:
                self.calls.append((caller, time.monotonic()))
            return record(caller)

        self.sim.monitor.mutating_call = observed  # type: ignore[method-assign]

    @property
    def address(self) -> str:
        return self.sim.address

    def monitor(self) -> dict[str, Any]:
        return dict(self.sim.monitor.snapshot())

    def cluster(self, cid: str) -> dict[str, Any]:
        return dict(self.fleet.health_of(cid))

    def rewrite(self, fleet: dict[str, Any]) -> None:
        """Replace the fleet file and reload it (clusters keep their state)."""
        self.path.write_text(yaml.safe_dump(fleet))
        self.sim.reload()

    def stop(self) -> None:
        self.sim.stop()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """Factory: sim(fleet_dict) starts a sim plugin; stopped after the test."""
    started: list[Sim] = []

    def start(fleet: dict[str, Any], window: float = 5.0) -> Sim:
        s = Sim(tmp_path, fleet, window)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


class Objects:
    """Read and write our kinds on the apiserver in one namespace."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.client = cluster.api_client()
        self.api = k8s.CustomObjectsApi(self.client)
        self.core = k8s.CoreV1Api(self.client)
        self.ns = namespace

    def create_cv(self, body: dict[str, Any]) -> None:
        self.api.create_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, api.PLURAL, body)

    def patch_cv(self, name: str, patch: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, self.ns, api.PLURAL, name, patch
        )

    def cv(self, name: str) -> dict[str, Any]:
        return dict(
            self.api.get_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, api.PLURAL, name)
        )

    def cv_status(self, name: str) -> dict[str, Any]:
        return dict(self.cv(name).get("status") or {})

    def cv_phase_is(self, name: str, *phases: str) -> dict[str, Any] | None:
        status = self.cv_status(name)
        return status if status.get("phase") in phases else None

    def runs(self) -> list[dict[str, Any]]:
        items = self.api.list_namespaced_custom_object(
            api.GROUP, api.VERSION, self.ns, api.UPDATE_RUN_PLURAL
        )["items"]
        return sorted(items, key=lambda o: o["metadata"]["creationTimestamp"])

    def run(self, name: str) -> dict[str, Any]:
        return dict(
            self.api.get_namespaced_custom_object(
                api.GROUP, api.VERSION, self.ns, api.UPDATE_RUN_PLURAL, name
            )
        )

    def run_phase_is(self, name: str, *phases: str) -> dict[str, Any] | None:
        """The UpdateRun's status once its phase is one of `phases`, else None."""
        status = dict(self.run(name).get("status") or {})
        return status if status.get("phase") in phases else None

    def current_run(self, cv: str) -> str:
        return str(
            wait_for("a current run", lambda: self.cv_status(cv).get("currentRun"), timeout=60)
        )

    def upgrades(self, run: str) -> dict[str, dict[str, Any]]:
        """The run's ClusterUpgrades by cluster id."""
        items = self.api.list_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            self.ns,
            api.CLUSTER_UPGRADE_PLURAL,
            label_selector=f"{api.LABEL_RUN}={run}",
        )["items"]
        return {o["spec"]["clusterId"]: o for o in items}

    def upgrade_status(self, run: str, cid: str) -> dict[str, Any]:
        return dict(self.upgrades(run).get(cid, {}).get("status") or {})

    def events(self) -> list[Any]:
        return list(self.core.list_namespaced_event(self.ns).items)


@pytest.fixture
def objects(control_plane: KubeCluster, namespace: str) -> Iterator[Objects]:
    o = Objects(control_plane, namespace)
    yield o
    o.client.close()


class Orchestrators:
    """Starts `fleet-orchestrator run` processes for a test and stops them after it."""

    def __init__(self, cluster: KubeCluster, namespace: str, tmp: Path) -> None:
        self.cluster, self.namespace, self.tmp = cluster, namespace, tmp
        self.procs: list[OrchestratorProcess] = []

    def start(
        self, *extra: str, identity: str = "orchestrator-e2e", all_namespaces: bool = False
    ) -> OrchestratorProcess:
        log = self.tmp / f"{identity}-{len(self.procs)}.log"
        proc = OrchestratorProcess(
            self.cluster.kubeconfig, self.namespace, log, *extra, identity=identity
        )
        if all_namespaces:  # --namespace omitted: the orchestrator watches every namespace
            at = proc.args.index("--namespace")
            del proc.args[at : at + 2]
        self.procs.append(proc)
        return proc.start()

    def logs(self) -> str:
        return "\n".join(p.log.read_text() for p in self.procs if p.log.exists())

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.proc is not None:
                proc.stop()


@contextmanager
def running_orchestrators(
    cluster: KubeCluster, namespace: str, tmp: Path
) -> Iterator[Orchestrators]:
    """Orchestrators for one test on cluster, all stopped afterwards."""
    o = Orchestrators(cluster, namespace, tmp)
    try:
        yield o
    finally:
        o.stop_all()
        text = o.logs()
        # On failure pytest shows this: the tail of every orchestrator's log.
        print("\n".join(text.splitlines()[-80:]))


@pytest.fixture
def orchestrators(
    control_plane: KubeCluster, namespace: str, tmp_path: Path
) -> Iterator[Orchestrators]:
    with running_orchestrators(control_plane, namespace, tmp_path) as o:
        yield o


def reconcile_errors(logs: str) -> list[str]:
    """Lines where a reconcile raised (the controller logs each with its traceback text)."""
    return [line for line in logs.splitlines() if "reconcile" in line and "failed" in line]
