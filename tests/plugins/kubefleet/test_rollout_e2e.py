"""End to end: KubeFleet staged update runs approved stage by stage by the real orchestrator.

A hub and three member apiservers, the KubeFleet emulator, per member a sample app scraped by
its own real Prometheus and the real fleet-metric-collector process, the plugin running with
exactly its RBAC, and `fleet-orchestrator run --plugin kubefleet=...` as a subprocess.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugins.kubefleet import collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import APPROVAL_REQUESTS, CLUSTER_APPROVAL_REQUESTS
from plugins.sdk.client import ClientTLS
from plugins.sdk.server import ServerTLS
from tests.plugins.kubefleet.conftest import Fleet, RunningPlugin, StartPlugin
from tests.plugins.kubefleet.support import (
    approval,
    approved,
    conditions,
    create_tracker,
    health_condition,
    hub_report,
    member_object,
    run_succeeded,
    start_cluster_run,
    start_namespaced_run,
)
from tests.support.certs import generate_pki
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubectl import kubectl
from tests.support.kubefleet_emulator import KubeFleetEmulator
from tests.support.orchestrator import OrchestratorProcess

STEP = 60.0  # seconds any one step may take on a loaded machine
FOLLOWING = "following the gates of plugin kubefleet"
"""What the orchestrator logs once its gate loop runs. Starting the process is a step of its own:
about 1 s of CPU (imports), 9-15 s of wall time on 2 cores at load 11 (2.4 s and 30-48 s at
load 13-16 while orchestrator/adapters/kube.py still imported every API group up front)."""


def _log(proc: OrchestratorProcess) -> str:
    return proc.log.read_text(errors="replace")


@dataclass
class _Scene:
    """What a test follows, to say where things stood when a step times out."""

    emulator: KubeFleetEmulator
    run: str
    stages: tuple[str, ...]
    namespace: str = ""
    fleet: Fleet | None = None
    proc: OrchestratorProcess | None = None
    started: float = field(default_factory=time.monotonic)
    steps: list[str] = field(default_factory=list)

    def step(self, what: str, check: Callable[..., Any]) -> Any:
        """wait_for(what, check, STEP); on a timeout the error says where everything stood."""
        begun = time.monotonic()
        try:
            result = wait_for(what, check, STEP)
        except TimeoutError as err:
            raise TimeoutError(f"{err}\n{self.describe()}") from None
        self.steps.append(f"{what}: {time.monotonic() - begun:.1f}s")
        return result

    def describe(self) -> str:
        lines = [f"steps done ({time.monotonic() - self.started:.0f}s in): {self.steps}"]
        kind = "StagedUpdateRun" if self.namespace else "ClusterStagedUpdateRun"
        run = self.emulator.get(kind, self.run, self.namespace) or {}
        for stage in (run.get("status") or {}).get("stagesStatus") or []:
            clusters = {
                c["clusterName"]: next(
                    (x["status"] for x in c.get("conditions") or [] if x["type"] == "Succeeded"),
                    None,
                )
                for c in stage.get("clusters") or []
            }
            lines.append(f"stage {stage['stageName']}: clusters Succeeded {clusters}")
        for stage in self.stages:
            conds = conditions(approval(self.emulator, self.run, stage, self.namespace))
            lines.append(
                f"request after-{stage}: "
                + "; ".join(f"{t}={c['status']} ({c.get('message')})" for t, c in conds.items())
            )
        if self.emulator.errors:
            lines.append(f"emulator errors: {self.emulator.errors[-5:]}")
        if self.proc is not None:
            tail = _log(self.proc).splitlines()[-20:]
            lines.append(f"orchestrator log ({self.proc.log}), last {len(tail)} lines:")
            lines.extend(f"  {line[:400]}" for line in tail)
        for name, agent in (self.fleet.agents if self.fleet else {}).items():
            lines.append(f"agent {name}, last lines: {agent.output().splitlines()[-3:]}")
        return "\n".join(lines)


def _held(proc: OrchestratorProcess, gate_id: str, *words: str) -> bool:
    return any(
        f"gate {gate_id} " in line and " held: " in line and all(w in line for w in words)
        for line in _log(proc).splitlines()
    )


def _request_says(
    emulator: KubeFleetEmulator, run: str, stage: str, *words: str, namespace: str = ""
) -> dict[str, object] | None:
    cond = health_condition(approval(emulator, run, stage, namespace))
    if cond and cond["status"] == "False" and all(w in str(cond["message"]) for w in words):
        return cond
    return None


def test_cluster_staged_run_stages_are_approved_only_when_their_workloads_are_healthy(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[[RunningPlugin], OrchestratorProcess],
    names: Callable[[str], str],
) -> None:
    fleet.unhealthy("member-1")
    fleet.healthy("member-2")
    fleet.unhealthy("member-3")
    run = names("csur")
    create_tracker(hub, run)
    plugin = start_plugin(plugin_kubeconfig)
    proc = orchestrator(plugin)
    scene = _Scene(emulator, run, ("staging", "prod"), fleet=fleet, proc=proc)
    start_cluster_run(emulator, run, "staging", "prod")
    staging = f"ClusterApprovalRequest/{run}-after-staging"

    # Staging is held while the sample app on member-1 is unhealthy; the request says why.
    cond = scene.step(
        "the staging request names member-1 unhealthy",
        lambda: _request_says(emulator, run, "staging", "member-1", "UNHEALTHY"),
    )
    assert cond["reason"] == "WorkloadsNotHealthy"
    scene.step("the orchestrator follows the plugin's gates", lambda: FOLLOWING in _log(proc))
    scene.step("the orchestrator holds staging", lambda: _held(proc, staging, "UNHEALTHY"))
    assert not approved(approval(emulator, run, "staging"))
    mc = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
    )[0]
    report = hub_report(hub, "member-1", mc)
    assert report is not None and report["status"]["workloadsMonitored"] == 1
    listing = kubectl(hub, "get", "metriccollectorreports.autoapprove.kubernetes-fleet.io", "-A")
    assert "WORKLOADS" in listing and "LAST-COLLECTION" in listing and mc in listing

    # Healthy: approved by the orchestrator, with observedGeneration and a reason.
    fleet.healthy("member-1")
    scene.step("staging approved", lambda: approved(approval(emulator, run, "staging")))
    cond = conditions(approval(emulator, run, "staging"))["Approved"]
    assert cond["reason"] == "ApprovedByFleetOrchestrator"
    assert "fleet-orchestrator" in cond["message"] and "healthy" in cond["message"]

    # Prod: member-2 is healthy, member-3 is not: held, and the request names member-3 only.
    # Right after the stage's update a member's last report may predate it (lastTransitionTime
    # has whole seconds: a report of the same second counts as older), and the request then
    # rightly says member-2 is UNKNOWN until its next collection; so wait for the request to
    # name member-3 and not member-2, rather than take its first mention of member-3.
    prod = f"ClusterApprovalRequest/{run}-after-prod"
    cond = scene.step(
        "the prod request names member-3 unhealthy and not member-2",
        lambda: (
            (c := _request_says(emulator, run, "prod", "member-3", "UNHEALTHY"))
            and "member-2" not in str(c["message"])
            and c
        ),
    )
    assert "member-2" not in str(cond["message"])
    scene.step("the orchestrator holds prod", lambda: _held(proc, prod, "member-3"))
    assert not approved(approval(emulator, run, "prod"))

    fleet.healthy("member-3")
    scene.step("prod approved", lambda: approved(approval(emulator, run, "prod")))
    scene.step("the run succeeds", lambda: run_succeeded(emulator, run))

    # Nothing of the run's collection is left: collectors, placements, member copies, reports.
    prod_mc = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-prod", run, "prod")
    )[0]
    for name, collector in (("member-1", mc), ("member-3", prod_mc)):
        scene.step(
            f"{collector} removed from {name}",
            lambda n=name, c=collector: (
                member_object(member_clusters[n], "metriccollectors", c) is None
            ),
        )
        scene.step(
            f"the report of {collector} on {name} removed",
            lambda n=name, c=collector: hub_report(hub, n, c) is None,
        )
    assert "Traceback" not in _log(proc)


def test_staged_run_needs_the_required_healthy_pods_and_the_extra_checks(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[..., OrchestratorProcess],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    fleet.apps["member-1"].set([1.0, 0.0])
    for name in ("member-2", "member-3"):
        fleet.apps[name].set([1.0, 1.0])
    namespace, run = names("team"), names("sur")
    extra = {
        "healthChecks": {
            "interval": "1s",
            "successThreshold": 2,
            "failureThreshold": 100,
            "timeout": "10m",
            "checks": [
                {
                    "name": "staging-min-health",
                    "metric": {
                        "provider": {"type": "prometheus", "address": fleet.prometheus["member-1"]},
                        "query": 'min(workload_health{app="sample-metric-app"})',
                        "thresholdRange": {"min": 1},
                    },
                }
            ],
        }
    }
    start_namespaced_run(emulator, namespace, run, "staging", "prod")
    create_tracker(hub, run, namespace, healthy_replicas=2, **extra)
    pki = generate_pki(tmp_path / "pki")  # orchestrator ⇄ plugin over mTLS this time
    plugin = start_plugin(
        plugin_kubeconfig,
        tls=ServerTLS(pki.server.cert_file, pki.server.key_file, pki.ca_file),
        client_tls=ClientTLS(pki.ca_file, pki.client.cert_file, pki.client.key_file),
    )
    proc = orchestrator(
        plugin,
        "--plugin-tls-ca",
        pki.ca_file,
        "--plugin-tls-cert",
        pki.client.cert_file,
        "--plugin-tls-key",
        pki.client.key_file,
    )
    staging = f"ApprovalRequest/{namespace}/{run}-after-staging"
    scene = _Scene(emulator, run, ("staging", "prod"), namespace, fleet, proc)

    scene.step(
        "the staging request: 1 of 2 pods healthy",
        lambda: _request_says(
            emulator, run, "staging", "member-1", "1 of 2 pod(s) healthy", namespace=namespace
        ),
    )
    scene.step("the orchestrator follows the plugin's gates", lambda: FOLLOWING in _log(proc))
    scene.step("the orchestrator holds staging", lambda: _held(proc, staging))
    assert not approved(approval(emulator, run, "staging", namespace))

    fleet.apps["member-1"].set([1.0, 1.0])
    scene.step("staging approved", lambda: approved(approval(emulator, run, "staging", namespace)))
    message = conditions(approval(emulator, run, "staging", namespace))["Approved"]["message"]
    assert "staging-min-health" in message and "passed 2 time(s)" in message, message
    scene.step("prod approved", lambda: approved(approval(emulator, run, "prod", namespace)))
    scene.step("the run succeeds", lambda: run_succeeded(emulator, run, namespace))
    mc = collector_names(GateRef(APPROVAL_REQUESTS, namespace, f"{run}-after-prod", run, "prod"))[0]
    for name in ("member-2", "member-3"):
        scene.step(
            f"the prod report on {name} removed from the hub",
            lambda name=name: hub_report(hub, name, mc) is None,
        )


def test_an_untracked_run_is_never_approved_by_the_orchestrator(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    plugin_kubeconfig: Path,
    orchestrator: Callable[[RunningPlugin], OrchestratorProcess],
    names: Callable[[str], str],
) -> None:
    fleet.healthy()
    run = names("untracked")
    plugin = start_plugin(plugin_kubeconfig)
    proc = orchestrator(plugin)
    scene = _Scene(emulator, run, ("staging", "prod"), fleet=fleet, proc=proc)
    start_cluster_run(emulator, run, "staging", "prod")
    gate = f"ClusterApprovalRequest/{run}-after-staging"
    cond = scene.step(
        "the request says there is no tracker",
        lambda: _request_says(emulator, run, "staging", "never approved automatically"),
    )
    assert cond["reason"] == "NoWorkloadTracker"
    scene.step("the orchestrator follows the plugin's gates", lambda: FOLLOWING in _log(proc))
    scene.step("the orchestrator holds it: not tracked", lambda: _held(proc, gate, "not tracked"))
    # Every workload is healthy and the orchestrator has evaluated the gate: still not approved.
    assert not approved(approval(emulator, run, "staging"))
    assert approval(emulator, run, "prod") is None
