"""Run the real fleet-orchestrator as a subprocess and a simulated fleet in-process, for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from orchestrator import api
from plugins.sim.server import SimOptions, Simulator
from tests.support.kube import KubeCluster

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OrchestratorProcess:
    """fleet-orchestrator run, as a child process with its log in a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log: Path,
        *extra: str,
        identity: str = "orchestrator-test",
    ) -> None:
        self.metrics_port = free_port()
        self.log = log
        self.args = [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            namespace,
            "--sync-period-seconds",
            "5",
            "--metrics-addr",
            f"127.0.0.1:{self.metrics_port}",
            "--identity",
            identity,
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OrchestratorProcess:
        handle = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.args,
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        handle.close()
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            return str(r.read().decode())


@contextmanager
def simulated_fleet(
    tmp: Path, fleet: dict[str, Any], target: str, listen: str = "127.0.0.1:0"
) -> Iterator[Simulator]:
    """A sim plugin serving the fleet (the fleet-file dict) on loopback, monitor file in tmp."""
    path = tmp / "fleet.yaml"
    path.write_text(yaml.safe_dump(fleet))
    sim = Simulator(
        SimOptions(
            listen=listen,
            fleet_file=str(path),
            monitor_file=str(tmp / "monitor.json"),
            target_version=target,
            seed=7,
            reload_interval=0,
        )
    )
    try:
        yield sim
    finally:
        sim.stop()


def monitor(sim: Simulator) -> dict[str, Any]:
    """The sim's invariant monitor now."""
    return dict(sim.monitor.snapshot())


def read_monitor_file(tmp: Path) -> dict[str, Any]:
    return dict(json.loads((tmp / "monitor.json").read_text()))


def seed_cluster_version(
    name: str, endpoint: str, cluster_ids: list[str], version: str, required: int, **spec: Any
) -> dict[str, Any]:
    """A ClusterVersion in the original operator's shape (floor, plaintext endpoint, clusters
    at one version), with any further spec fields given."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": name},
        "spec": {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": endpoint, "insecure": True},
            "clusters": [{"id": cid, "version": version} for cid in cluster_ids],
            **spec,
        },
    }


class CV:
    """Create and read one ClusterVersion."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self.api = k8s.CustomObjectsApi(cluster.api_client())
        self.ns = namespace

    def create(self, body: dict[str, Any]) -> None:
        self.api.create_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, api.PLURAL, body)

    def get(self, name: str) -> dict[str, Any]:
        return dict(
            self.api.get_namespaced_custom_object(api.GROUP, api.VERSION, self.ns, api.PLURAL, name)
        )

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def phase_is(self, name: str, *phases: str) -> dict[str, Any] | None:
        status = self.status(name)
        return status if status.get("phase") in phases else None

    def current_run(self, name: str) -> dict[str, Any] | None:
        """The UpdateRun the ClusterVersion's status names as current (None before it has one)."""
        run = self.status(name).get("currentRun")
        if not run:
            return None
        return dict(
            self.api.get_namespaced_custom_object(
                api.GROUP, api.VERSION, self.ns, api.UPDATE_RUN_PLURAL, run
            )
        )

    def run_upgrades(self, run: str) -> dict[str, dict[str, Any]]:
        """The ClusterUpgrades of an UpdateRun, by cluster id."""
        items = self.api.list_namespaced_custom_object(
            api.GROUP,
            api.VERSION,
            self.ns,
            api.CLUSTER_UPGRADE_PLURAL,
            label_selector=f"{api.LABEL_RUN}={run}",
        )["items"]
        return {o["spec"]["clusterId"]: dict(o) for o in items}

    def upgrades(self, name: str) -> dict[str, dict[str, Any]]:
        """The ClusterUpgrades of the ClusterVersion's current run, by cluster id ({} before)."""
        run = self.status(name).get("currentRun")
        return self.run_upgrades(run) if run else {}

    def upgrade(self, name: str, cluster_id: str) -> dict[str, Any]:
        """One cluster's ClusterUpgrade in the ClusterVersion's current run."""
        return self.upgrades(name)[cluster_id]

    def failed(self, name: str) -> dict[str, dict[str, Any]]:
        """Cluster id → status of each Failed ClusterUpgrade of the current run."""
        return {
            cid: o.get("status") or {}
            for cid, o in self.upgrades(name).items()
            if (o.get("status") or {}).get("phase") == api.UpgradePhase.FAILED.value
        }
