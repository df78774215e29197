"""Before-stage and after-stage approvals decide on different clusters; approvals count only for
the request's generation; nothing is re-patched when nothing changed (plugin, emulator, real
agents on a real hub; no orchestrator: the test resolves gates as the orchestrator would)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from fleetupgrade.plugin.v1 import gate_pb2
from plugins.kubefleet import collection, collector_names
from plugins.kubefleet.gates import GateRef
from plugins.kubefleet.objects import CLUSTER_APPROVAL_REQUESTS
from plugins.sdk.client import PluginCallError
from tests.plugins.kubefleet.conftest import Fleet, StartPlugin
from tests.plugins.kubefleet.support import (
    approval,
    approved,
    conditions,
    create_tracker,
    events_about,
    health_condition,
    hub_report,
    start_cluster_run,
)
from tests.support.kube import KubeCluster, wait_for
from tests.support.kubefleet_emulator import KubeFleetEmulator

APPROVE = gate_pb2.GATE_DECISION_APPROVE
STEP = 60.0


def _gate(client: object, gate_id: str) -> gate_pb2.Gate | None:
    return next((g for g in client.list_gates() if g.id == gate_id), None)  # type: ignore[attr-defined]


def _says(
    emulator: KubeFleetEmulator, run: str, stage: str, task: str, reason: str
) -> dict[str, Any] | None:
    cond = health_condition(approval(emulator, run, stage, task=task))
    return cond if cond and cond["reason"] == reason else None


def test_before_and_after_stage_gates_each_check_what_they_are_meant_to(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    fleet.healthy()
    run = names("gated")
    create_tracker(hub, run)
    plugin = start_plugin()
    start_cluster_run(emulator, run, "staging", "prod", before=True)

    # Before staging: nothing updated yet, so staging's own clusters are a baseline, said so.
    before_staging = f"ClusterApprovalRequest/{run}-before-staging"
    gate = wait_for("the before-staging gate", lambda: _gate(plugin.client, before_staging), STEP)
    assert list(gate.cluster_ids) == ["member-1"]
    cond = wait_for(
        "before-staging healthy",
        lambda: _says(emulator, run, "staging", "before", "AllWorkloadsHealthy"),
        STEP,
    )
    assert "baseline" in cond["message"] and "after-stage gate" in cond["message"]
    plugin.client.resolve_gate(before_staging, APPROVE, "go")
    assert conditions(approval(emulator, run, "staging", task="before"))["Approved"][
        "message"
    ].startswith("before-stage go: ")

    # After staging: decided on staging's cluster, on data collected after its update.
    after_staging = f"ClusterApprovalRequest/{run}-after-staging"
    wait_for(
        "after-staging healthy",
        lambda: _says(emulator, run, "staging", "after", "AllWorkloadsHealthy"),
        STEP,
    )
    gate = _gate(plugin.client, after_staging)
    assert gate is not None and list(gate.cluster_ids) == ["member-1"]
    plugin.client.resolve_gate(after_staging, APPROVE, "verified")

    # Before prod: a go/no-go on what the run updated (staging: member-1), never on prod's own
    # clusters (still on the old version): member-1 unhealthy holds it though member-2/3 are fine.
    fleet.unhealthy("member-1")
    before_prod = f"ClusterApprovalRequest/{run}-before-prod"
    gate = wait_for(
        "the before-prod gate",
        lambda: (g := _gate(plugin.client, before_prod)) and g.cluster_ids and g,
        STEP,
    )
    assert list(gate.cluster_ids) == ["member-1"]
    cond = wait_for(
        "before-prod held on member-1",
        lambda: _says(emulator, run, "prod", "before", "WorkloadsNotHealthy"),
        STEP,
    )
    assert "member-1" in cond["message"] and "member-2" not in cond["message"]
    assert "already updated" in cond["message"]

    # A stopped run is a no-go, whatever the health: the plugin refuses to approve it.
    fleet.healthy("member-1")
    emulator.patch("ClusterStagedUpdateRun", run, {"spec": {"state": "Stop"}})
    wait_for(
        "before-prod blocked", lambda: _says(emulator, run, "prod", "before", "RunStopped"), STEP
    )
    wait_for(
        "the gate has no deciding clusters",
        lambda: (g := _gate(plugin.client, before_prod)) is not None and not g.cluster_ids,
        STEP,
    )
    with pytest.raises(PluginCallError) as refused:
        plugin.client.resolve_gate(before_prod, APPROVE, "go")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "stopped" in refused.value.message
    assert not approved(approval(emulator, run, "prod", task="before"))

    # Running again, but a prod cluster's member agent is not healthy: still a no-go.
    member = emulator.get("MemberCluster", "member-3")
    assert member is not None
    status = member["status"]
    for cond in status["agentStatus"][0]["conditions"]:
        if cond["type"] == "Healthy":
            cond.update(status="False", reason="HeartbeatLost")
    emulator.api.patch_cluster_custom_object_status(
        "cluster.kubernetes-fleet.io", "v1beta1", "memberclusters", "member-3", {"status": status}
    )
    emulator.patch("ClusterStagedUpdateRun", run, {"spec": {"state": "Run"}})
    cond = wait_for(
        "before-prod blocked on member-3",
        lambda: _says(emulator, run, "prod", "before", "ClusterUnavailable"),
        STEP,
    )
    assert "member-3" in cond["message"] and "HeartbeatLost" in cond["message"]
    emulator.heartbeat("member-3", "1.29.4")

    # Its agent then goes silent: its conditions stay True (nothing on a hub changes them),
    # but its last heartbeat is an hour old, so KubeFleet counts it as not connected: no-go.
    emulator.go_silent("member-3", seconds_ago=3600)
    cond = wait_for(
        "before-prod blocked on the silent member-3",
        lambda: (
            (c := _says(emulator, run, "prod", "before", "ClusterUnavailable"))
            and "MemberAgent is silent" in c["message"]
            and c
        ),
        STEP,
    )
    assert "member-3 is not available" in cond["message"]
    with pytest.raises(PluginCallError) as refused:
        plugin.client.resolve_gate(before_prod, APPROVE, "go")
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION, refused.value.message
    assert not approved(approval(emulator, run, "prod", task="before"))
    emulator.heartbeat("member-3", "1.29.4")

    # The go/no-go passes on member-1, and prod starts.
    wait_for(
        "before-prod healthy",
        lambda: _says(emulator, run, "prod", "before", "AllWorkloadsHealthy"),
        STEP,
    )
    plugin.client.resolve_gate(before_prod, APPROVE, "go")
    after_prod = f"ClusterApprovalRequest/{run}-after-prod"
    gate = wait_for(
        "the after-prod gate on prod's clusters",
        lambda: (g := _gate(plugin.client, after_prod)) and g.cluster_ids and g,
        STEP,
    )
    assert list(gate.cluster_ids) == ["member-2", "member-3"]


def test_an_approval_for_a_stale_generation_is_ignored_as_kubefleet_does(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    run = names("stale")
    create_tracker(hub, run)
    plugin = start_plugin()
    start_cluster_run(emulator, run, "staging", "prod")
    request = wait_for("the request", lambda: approval(emulator, run, "staging"), STEP)
    generation = request["metadata"]["generation"]
    stale = {
        "type": "Approved",
        "status": "True",
        "reason": "ByHand",
        "message": "approved for an older generation",
        "observedGeneration": generation - 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    emulator.api.patch_cluster_custom_object_status(
        "placement.kubernetes-fleet.io",
        "v1beta1",
        "clusterapprovalrequests",
        request["metadata"]["name"],
        {"status": {"conditions": [stale]}},
    )
    gate_id = f"ClusterApprovalRequest/{run}-after-staging"
    wait_for(
        "the plugin still sees a pending gate",
        lambda: (g := _gate(plugin.client, gate_id)) and g.state == gate_pb2.GATE_STATE_PENDING,
        STEP,
    )
    for _ in range(3):  # the emulated update-run controller passes over it, several times
        emulator.tick()
    assert "ApprovalAccepted" not in conditions(approval(emulator, run, "staging"))
    # An approval for the current generation is accepted.
    plugin.client.resolve_gate(gate_id, APPROVE, "checked")
    cond = conditions(approval(emulator, run, "staging"))["Approved"]
    assert cond["observedGeneration"] == generation
    wait_for(
        "ApprovalAccepted",
        lambda: conditions(approval(emulator, run, "staging")).get("ApprovalAccepted"),
        STEP,
    )


def test_nothing_is_re_patched_and_nothing_written_is_pruned(
    hub: KubeCluster,
    emulator: KubeFleetEmulator,
    fleet: Fleet,
    start_plugin: StartPlugin,
    names: Callable[[str], str],
) -> None:
    """Against the seed tutorial's CRDs (which prune what they do not define): the plugin
    writes only fields the schema keeps, and once written leaves its objects alone while the
    agent keeps reporting (a report every second)."""
    fleet.healthy()
    run = names("quiet")
    create_tracker(hub, run, cookbook="seed")
    plugin = start_plugin(cookbook="seed")
    start_cluster_run(emulator, run, "staging", "prod")
    ref = GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"{run}-after-staging", run, "staging")
    mc, crp = collector_names(ref)
    wait_for("the placement", lambda: emulator.get("ClusterResourcePlacement", crp), STEP)
    group, version = "metric.kubernetes-fleet.io", "v1alpha1"
    stored = emulator.api.get_cluster_custom_object(group, version, "metriccollectors", mc)
    request = approval(emulator, run, "staging")
    assert request is not None
    written, _ = collection.seed_bodies(
        ref,
        request,
        ["member-1"],
        plugin.plugin.options.config.member_prometheus_url,
        plugin.plugin.options.config.collect_interval,
    )
    assert stored["spec"] == written["spec"]  # nothing the plugin wrote was pruned
    wait_for(
        "the agent's report of this gate's collector",
        lambda: ((hub_report(hub, "member-1", mc, "seed") or {}).get("status") or {}).get(
            "lastCollectionTime"
        ),
        STEP,
    )

    def healthy() -> bool:
        cond = health_condition(approval(emulator, run, "staging"))
        return bool(cond and cond["reason"] == "AllWorkloadsHealthy")

    wait_for("the plugin's condition: healthy, from the agent's reports", healthy, STEP)
    settled = plugin.plugin.hub.passes
    wait_for("three passes to settle", lambda: plugin.plugin.hub.passes >= settled + 3, STEP)
    assert healthy()
    before = plugin.plugin.hub.kube.requests()
    versions = {
        "collector": stored["metadata"]["resourceVersion"],
        "placement": emulator.get("ClusterResourcePlacement", crp)["metadata"]["resourceVersion"],  # type: ignore[index]
    }
    passes = plugin.plugin.hub.passes
    wait_for("five more reconcile passes", lambda: plugin.plugin.hub.passes >= passes + 5, STEP)
    after = plugin.plugin.hub.kube.requests()
    assert after.get("patch", 0) == before.get("patch", 0), (
        before,
        after,
        [(e.reason, e.message) for e in events_about(hub, f"{run}-after-staging")],
    )
    assert after.get("create", 0) == before.get("create", 0), (before, after)
    now = emulator.api.get_cluster_custom_object(group, version, "metriccollectors", mc)
    assert now["metadata"]["resourceVersion"] == versions["collector"]
    placement = emulator.get("ClusterResourcePlacement", crp)
    assert placement is not None
    assert placement["metadata"]["resourceVersion"] == versions["placement"]
