"""GateService over approval requests: gates, per-gate MetricCollector propagation, ResolveGate,
cleanup, and the no-tracker rule (plugin and emulator on a real hub; no agents, no orchestrator)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from fleetupgrade.plugin.v1 import gate_pb2, health_pb2
from plugins.kubefleet import collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import CLUSTER_APPROVAL_REQUESTS
from plugins.sdk.client import PluginCallError
from tests.plugins.kubefleet.conftest import StartPlugin
from tests.plugins.kubefleet.support import (
    APP,
    APP_NS,
    approval,
    approved,
    conditions,
    create_tracker,
    events_about,
    health_condition,
    hub_report,
    member_object,
    run_succeeded,
    start_cluster_run,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator

APPROVE = gate_pb2.GATE_DECISION_APPROVE


def _gate(client: object, gate_id: str) -> gate_pb2.Gate | None:
    return next((g for g in client.list_gates() if g.id == gate_id), None)  # type: ignore[attr-defined]


def test_a_pending_approval_request_is_a_gate_with_its_stage_clusters_and_workloads(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    """Current cookbook: the tracker's kind and healthyReplicas are carried, and the plugin
    creates the stage clusters' MetricCollectorReports as the cookbook's hub controller does."""
    run = names("csur")
    create_tracker(hub, run, healthy_replicas=2)
    plugin = start_plugin()
    start_cluster_run(emulator, run, "staging", "prod")
    gate_id = f"ClusterApprovalRequest/{run}-after-staging"
    gate = wait_for("the staging gate", lambda: _gate(plugin.client, gate_id), timeout=30)
    assert gate.state == gate_pb2.GATE_STATE_PENDING
    # KubeFleet creates the request in the pass that finishes the stage, and writes the run's
    # status after it: until the cache has that status, the gate says the stage is updating.
    gate = wait_for(
        "the staging gate with its updated clusters",
        lambda: (g := _gate(plugin.client, gate_id)) is not None and g.cluster_ids and g,
        timeout=30,
    )
    assert (gate.run, gate.stage, list(gate.cluster_ids)) == (run, "staging", ["member-1"])
    assert gate.tracked
    assert [(w.namespace, w.name, w.kind, w.min_healthy_replicas) for w in gate.workloads] == [
        (APP_NS, APP, "Deployment", 2)
    ]
    assert gate.create_time.seconds > 0

    mc, _ = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
    )
    assert mc == f"mc-{run}-staging"  # the cookbook's name
    report = wait_for(
        "the hub-created report in fleet-member-member-1",
        lambda: hub_report(hub, "member-1", mc),
        timeout=30,
    )
    assert report["spec"] == {
        "prometheusUrl": "http://prometheus.prometheus.svc.cluster.local:9090"
    }
    labels = report["metadata"]["labels"]
    assert labels["kubernetes-fleet.io/parent-approval-request"] == f"{run}-after-staging"
    assert report["metadata"]["ownerReferences"][0]["name"] == f"{run}-after-staging"
    assert hub_report(hub, "member-2", mc) is None  # not a cluster of this stage

    # A plugin started with other settings updates the report (a merge patch the real schema
    # takes whole: nothing of it is pruned).
    plugin.plugin.stop(grace=0)
    plugin = start_plugin(collect_interval="2s", member_prometheus_url="http://prom.other:9090")
    report = wait_for(
        "the report updated",
        lambda: (
            (r := hub_report(hub, "member-1", mc))
            and r["metadata"]["annotations"]["fleetupgrade.io/collect-interval"] == "2s"
            and r
        ),
        timeout=30,
    )
    assert report["spec"] == {"prometheusUrl": "http://prom.other:9090"}

    # No collector runs here: the report stays empty, so the plugin says UNKNOWN.
    cond = wait_for(
        "the plugin's condition",
        lambda: (
            (c := health_condition(approval(emulator, run, "staging")))
            and c["reason"] != "ClustersNotUpdated"
            and c
        ),
    )
    assert cond["status"] == "False" and cond["reason"] == "WorkloadsNotHealthy", cond
    assert "member-1" in cond["message"] and "UNKNOWN" in cond["message"]
    results = plugin.client.check_workloads(
        ["member-1"], [health_pb2.Workload(namespace=APP_NS, name=APP, kind="Deployment")]
    )
    assert results[0].health == health_pb2.WORKLOAD_HEALTH_UNKNOWN
    assert "has no collection yet" in results[0].message


def test_seed_gates_place_a_metric_collector_on_exactly_the_stage_clusters(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    """Seed tutorial: a MetricCollector per gate, a PickFixed placement, a shared override."""
    run = names("csur")
    tracker = create_tracker(hub, run, cookbook="seed")
    assert tracker["workloads"] == [{"name": APP, "namespace": APP_NS}]
    plugin = start_plugin(cookbook="seed")
    start_cluster_run(emulator, run, "staging", "prod")
    gate_id = f"ClusterApprovalRequest/{run}-after-staging"
    gate = wait_for("the staging gate", lambda: _gate(plugin.client, gate_id), timeout=30)
    # The seed tracker has neither kind nor healthyReplicas: any kind, any pod present.
    assert [(w.namespace, w.name, w.kind, w.min_healthy_replicas) for w in gate.workloads] == [
        (APP_NS, APP, "", 0)
    ]
    # The MetricCollector goes to exactly the stage's clusters, with each its reportNamespace.
    mc, crp = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
    )
    placement = wait_for(
        "the PickFixed placement", lambda: emulator.get("ClusterResourcePlacement", crp), timeout=30
    )
    assert placement["spec"]["policy"] == {
        "placementType": "PickFixed",
        "clusterNames": ["member-1"],
    }
    assert placement["metadata"]["ownerReferences"][0]["name"] == f"{run}-after-staging"
    # The report namespace comes from a shared override that selects this collector by name.
    [override] = [
        o
        for o in emulator.list("ClusterResourceOverride")
        if any(s.get("name") == mc for s in o["spec"]["clusterResourceSelectors"])
    ]
    [rule] = override["spec"]["policy"]["overrideRules"]
    assert rule["jsonPatchOverrides"] == [
        {
            "op": "replace",
            "path": "/spec/reportNamespace",
            "value": "fleet-member-${MEMBER-CLUSTER-NAME}",
        }
    ]
    assert "placement" not in override["spec"]
    assert emulator.violations == []
    placed = wait_for(
        "the MetricCollector on member-1",
        lambda: member_object(member_clusters["member-1"], "metriccollectors", mc),
        timeout=30,
    )
    assert placed["spec"]["reportNamespace"] == "fleet-member-member-1"
    assert placed["metadata"]["annotations"]["fleetupgrade.io/collect-interval"] == "1s"
    assert member_object(member_clusters["member-2"], "metriccollectors", mc) is None

    # Other settings: the MetricCollector is updated in place (and placed again as it is).
    plugin.plugin.stop(grace=0)
    plugin = start_plugin(cookbook="seed", member_prometheus_url="http://prom.other:9090")
    wait_for(
        "the MetricCollector updated on member-1",
        lambda: (
            (m := member_object(member_clusters["member-1"], "metriccollectors", mc))
            and m["spec"]["prometheusUrl"] == "http://prom.other:9090"
        ),
        timeout=30,
    )
    assert emulator.violations == []

    # No agent runs here: no report, so the plugin says UNKNOWN on the approval request.
    cond = wait_for(
        "the plugin's condition",
        lambda: (
            (c := health_condition(approval(emulator, run, "staging")))
            and c["reason"] != "ClustersNotUpdated"
            and c
        ),
    )
    assert cond["status"] == "False" and cond["reason"] == "WorkloadsNotHealthy", cond
    assert "member-1" in cond["message"] and "UNKNOWN" in cond["message"]
    results = plugin.client.check_workloads(
        ["member-1"], [health_pb2.Workload(namespace=APP_NS, name=APP, kind="Deployment")]
    )
    assert results[0].health == health_pb2.WORKLOAD_HEALTH_UNKNOWN
    assert "no MetricCollectorReport" in results[0].message


def test_resolve_gate_approves_the_stage_and_cleans_up_its_collector(
    hub: KubeCluster,
    member_clusters: dict[str, KubeCluster],
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    run = names("csur")
    create_tracker(hub, run, cookbook="seed")
    plugin = start_plugin(cookbook="seed")
    start_cluster_run(emulator, run, "staging", "prod")
    staging = f"ClusterApprovalRequest/{run}-after-staging"
    wait_for("the staging gate", lambda: _gate(plugin.client, staging), timeout=30)
    mc, crp = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
    )
    wait_for(
        "the MetricCollector on member-1",
        lambda: member_object(member_clusters["member-1"], "metriccollectors", mc),
        timeout=30,
    )

    gate = plugin.client.resolve_gate(staging, APPROVE, "checked by hand")
    assert gate.state == gate_pb2.GATE_STATE_APPROVED
    request = approval(emulator, run, "staging")
    assert approved(request)
    cond = conditions(request)["Approved"]
    assert (cond["reason"], cond["message"]) == ("ApprovedByFleetOrchestrator", "checked by hand")
    # Idempotent; the other way is refused.
    assert (
        plugin.client.resolve_gate(staging, APPROVE, "again").state == gate_pb2.GATE_STATE_APPROVED
    )
    with pytest.raises(PluginCallError) as refused:
        plugin.client.resolve_gate(staging, gate_pb2.GATE_DECISION_REJECT, "too late")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION

    # KubeFleet accepts and moves on; the staging collector, override and placement go away,
    # and so does the MetricCollector on the member.
    wait_for(
        "ApprovalAccepted",
        lambda: conditions(approval(emulator, run, "staging")).get("ApprovalAccepted"),
        timeout=30,
    )
    wait_for(
        "the prod gate",
        lambda: _gate(plugin.client, f"ClusterApprovalRequest/{run}-after-prod"),
        timeout=30,
    )
    wait_for(
        "the staging placement removed",
        lambda: emulator.get("ClusterResourcePlacement", crp) is None,
        timeout=30,
    )
    wait_for(
        "the MetricCollector removed from member-1",
        lambda: member_object(member_clusters["member-1"], "metriccollectors", mc) is None,
        timeout=30,
    )
    prod_mc = collector_names(
        GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-prod", run, "prod")
    )[0]
    for name in ("member-2", "member-3"):
        wait_for(
            f"the prod MetricCollector on {name}",
            lambda name=name: member_object(member_clusters[name], "metriccollectors", prod_mc),
            timeout=30,
        )

    # Deleting the run (KubeFleet deletes its approval requests) removes the prod objects too.
    plugin.client.resolve_gate(f"ClusterApprovalRequest/{run}-after-prod", APPROVE, "ok")
    wait_for("the run succeeds", lambda: run_succeeded(emulator, run), timeout=30)
    emulator.delete("ClusterStagedUpdateRun", run)
    wait_for(
        "the prod MetricCollector removed from the hub",
        lambda: all(
            m["metadata"]["name"] != prod_mc
            for m in emulator.api.list_cluster_custom_object(
                "metric.kubernetes-fleet.io", "v1alpha1", "metriccollectors"
            )["items"]
        ),
        timeout=30,
    )


def test_without_a_tracker_the_gate_is_never_approved_and_the_request_says_why(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    run = names("untracked")
    plugin = start_plugin()
    start_cluster_run(emulator, run, "staging", "prod")
    gate_id = f"ClusterApprovalRequest/{run}-after-staging"
    gate = wait_for("the gate", lambda: _gate(plugin.client, gate_id), timeout=30)
    assert not gate.tracked and not gate.workloads
    assert "never approved automatically" in gate.message
    cond = wait_for("the condition", lambda: health_condition(approval(emulator, run, "staging")))
    assert (cond["status"], cond["reason"]) == ("False", "NoWorkloadTracker")
    assert f"ClusterStagedWorkloadTracker {run}" in cond["message"]
    events = wait_for("the Event", lambda: events_about(hub, f"{run}-after-staging"))
    assert any(e.reason == "NoWorkloadTracker" and e.type == "Warning" for e in events)
    with pytest.raises(PluginCallError) as refused:
        plugin.client.resolve_gate(gate_id, APPROVE, "try anyway")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert not approved(approval(emulator, run, "staging"))
