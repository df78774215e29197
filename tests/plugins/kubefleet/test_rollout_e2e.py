"""End to end: KubeFleet staged update runs approved stage by stage by the real orchestrator.

A hub and three member apiservers, the KubeFleet emulator, per member a sample app scraped by
its own real Prometheus and the real fleet-metric-collector process, the plugin running with
exactly its RBAC, and `fleet-orchestrator run --plugin kubefleet=...` as a subprocess.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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


def _log(proc: OrchestratorProcess) -> str:
    return proc.log.read_text(errors="replace")


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
    start_cluster_run(emulator, run, "staging", "prod")
    staging = f"ClusterApprovalRequest/{run}-after-staging"

    # Staging is held while the sample app on member-1 is unhealthy; the request says why.
    cond = wait_for(
        "the staging request names member-1 unhealthy",
        lambda: _request_says(emulator, run, "staging", "member-1", "UNHEALTHY"),
        timeout=STEP,
    )
    assert cond["reason"] == "WorkloadsNotHealthy"
    wait_for("the orchestrator holds staging", lambda: _held(proc, staging, "UNHEALTHY"), STEP)
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
    wait_for("staging approved", lambda: approved(approval(emulator, run, "staging")), STEP)
    cond = conditions(approval(emulator, run, "staging"))["Approved"]
    assert cond["reason"] == "ApprovedByFleetOrchestrator"
    assert "fleet-orchestrator" in cond["message"] and "healthy" in cond["message"]

    # Prod: member-2 is healthy, member-3 is not: held, and the request names member-3 only.
    prod = f"ClusterApprovalRequest/{run}-after-prod"
    cond = wait_for(
        "the prod request names member-3 unhealthy",
        lambda: _request_says(emulator, run, "prod", "member-3", "UNHEALTHY"),
        timeout=STEP,
    )
    assert "member-2" not in str(cond["message"])
    wait_for("the orchestrator holds prod", lambda: _held(proc, prod, "member-3"), STEP)
    assert not approved(approval(emulator, run, "prod"))

    fleet.healthy("member-3")
    wait_for("prod approved", lambda: approved(approval(emulator, run, "prod")), STEP)
    wait_for("the run succeeds", lambda: run_succeeded(emulator, run), STEP)

    # Nothing of the run's collection is left: collectors, placements, member copies, reports.
    prod_mc = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-prod", run, "prod")
    )[0]
    for name, collector in (("member-1", mc), ("member-3", prod_mc)):
        wait_for(
            f"{collector} removed from {name}",
            lambda n=name, c=collector: (
                member_object(member_clusters[n], "metriccollectors", c) is None
            ),
            STEP,
        )
        wait_for(
            f"the report of {collector} on {name} removed",
            lambda n=name, c=collector: hub_report(hub, n, c) is None,
            STEP,
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

    wait_for(
        "the staging request: 1 of 2 pods healthy",
        lambda: _request_says(
            emulator, run, "staging", "member-1", "1 of 2 pod(s) healthy", namespace=namespace
        ),
        timeout=STEP,
    )
    wait_for("the orchestrator holds staging", lambda: _held(proc, staging), STEP)
    assert not approved(approval(emulator, run, "staging", namespace))

    fleet.apps["member-1"].set([1.0, 1.0])
    wait_for(
        "staging approved", lambda: approved(approval(emulator, run, "staging", namespace)), STEP
    )
    message = conditions(approval(emulator, run, "staging", namespace))["Approved"]["message"]
    assert "staging-min-health" in message and "passed 2 time(s)" in message, message
    wait_for("prod approved", lambda: approved(approval(emulator, run, "prod", namespace)), STEP)
    wait_for("the run succeeds", lambda: run_succeeded(emulator, run, namespace), STEP)
    mc = collector_names(GateRef(APPROVAL_REQUESTS, namespace, f"{run}-after-prod", run, "prod"))[0]
    for name in ("member-2", "member-3"):
        wait_for(
            f"the prod report on {name} removed from the hub",
            lambda name=name: hub_report(hub, name, mc) is None,
            STEP,
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
    start_cluster_run(emulator, run, "staging", "prod")
    gate = f"ClusterApprovalRequest/{run}-after-staging"
    cond = wait_for(
        "the request says there is no tracker",
        lambda: _request_says(emulator, run, "staging", "never approved automatically"),
        timeout=STEP,
    )
    assert cond["reason"] == "NoWorkloadTracker"
    wait_for(
        "the orchestrator holds it: not tracked", lambda: _held(proc, gate, "not tracked"), STEP
    )
    # Every workload is healthy and the orchestrator has evaluated the gate: still not approved.
    assert not approved(approval(emulator, run, "staging"))
    assert approval(emulator, run, "prod") is None
