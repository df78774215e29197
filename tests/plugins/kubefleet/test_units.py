"""Pure parts of the KubeFleet plugin: verdicts, report freshness, gate ids and states, task types
and stage readiness, taints, operation records, configuration, names, the sharing of overrides,
and the emulator's override arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, gate_pb2, health_pb2
from orchestrator.controllers.approvals import parse_plugin_flag
from plugins.kubefleet import KubeFleetConfig, collection, collector_names, health, inventory, oplog
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet.collector import parse_interval
from plugins.kubefleet.objects import (
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CURRENT,
    name_with_limit,
    set_condition,
)
from plugins.kubefleet.prometheus import Sample
from tests.support.kubefleet_emulator import apply_json_patch, override_for
from tests.support.upstream import cel_rules

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
HEALTHY = health_pb2.WORKLOAD_HEALTH_HEALTHY
UNHEALTHY = health_pb2.WORKLOAD_HEALTH_UNHEALTHY
MISSING = health_pb2.WORKLOAD_HEALTH_MISSING
UNKNOWN = health_pb2.WORKLOAD_HEALTH_UNKNOWN


def _pods(*values: float, app: str = "web", kind: str = "Deployment") -> list[health.PodHealth]:
    return [health.PodHealth("ns", app, kind, f"{app}-{i}", v) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("values", "minimum", "verdict", "healthy"),
    [
        ((1.0,), 0, HEALTHY, 1),
        ((0.0,), 0, HEALTHY, 0),  # healthyReplicas 0: any pod present is enough (cookbook)
        ((0.0,), 1, UNHEALTHY, 0),
        ((), 0, MISSING, 0),
        ((1.0, 0.0, 1.0), 2, HEALTHY, 2),
        ((1.0, 0.0, 0.5), 2, UNHEALTHY, 1),
        ((), 1, MISSING, 0),
    ],
)
def test_a_workload_needs_its_minimum_of_healthy_pods(
    values: tuple[float, ...], minimum: int, verdict: int, healthy: int
) -> None:
    workload = health_pb2.Workload(
        namespace="ns", name="web", kind="Deployment", min_healthy_replicas=minimum
    )
    result = health.judge(_pods(*values), workload, NOW)
    assert (result.health, result.healthy_pods) == (verdict, healthy)
    assert result.observed_time == NOW


def test_kind_matches_exactly_as_the_cookbooks_approval_controller_does() -> None:
    """Issue 20: countHealthyPodsForWorkload (kubefleet-cookbook,
    approval-request-metric-collector/pkg/controllers/approvalrequest/controller.go) compares
    `workload.Kind == metric.WorkloadKind`: case counts, and a tracker without a kind matches
    no reading that has one. Only a reading without a kind (the seed report schema) matches
    any."""
    pods = _pods(1.0, kind="StatefulSet")
    sts = health_pb2.Workload(namespace="ns", name="web", kind="StatefulSet")
    assert health.judge(pods, sts, None).health == HEALTHY
    for kind in ("statefulset", "", "Deployment"):
        other = health_pb2.Workload(namespace="ns", name="web", kind=kind)
        verdict = health.judge(pods, other, None)
        assert verdict.health == MISSING, kind
        assert "its pods report kind StatefulSet" in verdict.message
        assert "kinds match exactly" in verdict.message
    seed = _pods(1.0, kind="")  # the seed schema keeps no kind
    for kind in ("StatefulSet", ""):
        workload = health_pb2.Workload(namespace="ns", name="web", kind=kind)
        assert health.judge(seed, workload, None).health == HEALTHY, kind


def test_samples_become_pods_and_a_pod_seen_twice_keeps_its_lowest_value() -> None:
    labels = {"app": "web", "namespace": "ns", "pod": "web-0", "workload_kind": "Deployment"}
    samples = [
        Sample(dict(labels), 1.0, 0.0),
        Sample(dict(labels), 0.0, 0.0),
        Sample({"namespace": "ns", "pod": "x"}, 1.0, 0.0),  # no app label: skipped
    ]
    assert health.pods_from_samples(samples) == [
        health.PodHealth("ns", "web", "Deployment", "web-0", 0.0)
    ]


def _report(**status: object) -> dict[str, object]:
    return {"metadata": {"namespace": "fleet-member-a", "name": "mc-x"}, "status": status}


def test_only_a_fresh_successful_report_is_used() -> None:
    fresh = _report(lastCollectionTime="2026-01-01T11:59:58Z")
    assert health.report_problem(fresh, NOW, 10)[0] == ""
    stale = _report(lastCollectionTime="2026-01-01T11:59:00Z")
    problem, when = health.report_problem(stale, NOW, 10)
    assert "stale" in problem and "2026-01-01T11:59:00Z" in problem and when is not None
    assert health.report_problem(_report(), NOW, 10)[0].endswith("has no collection yet")
    failed = _report(
        lastCollectionTime="2026-01-01T11:59:59Z",
        conditions=[
            {
                "type": "MetricsCollected",
                "status": "False",
                "reason": "CollectionFailed",
                "message": "Prometheus is unreachable",
            }
        ],
    )
    assert (
        "MetricsCollected=False: Prometheus is unreachable"
        in health.report_problem(failed, NOW, 10)[0]
    )


def test_the_stale_message_does_not_change_while_the_report_stays_stale() -> None:
    stale = _report(lastCollectionTime="2026-01-01T11:00:00Z")
    first = health.report_problem(stale, NOW, 10)[0]
    assert health.report_problem(stale, NOW + timedelta(seconds=7), 10)[0] == first


def test_report_pods_come_from_collected_metrics() -> None:
    report = _report(
        collectedMetrics=[
            {"namespace": "ns", "workloadName": "web", "podName": "web-0", "health": True},
            {"namespace": "ns", "workloadName": "web", "podName": "web-1", "health": False},
        ]
    )
    pods = health.pods_from_report(report)
    assert [(p.pod, p.healthy, p.kind) for p in pods] == [("web-0", True, ""), ("web-1", False, "")]


def test_summaries_name_what_is_not_healthy() -> None:
    def result(cluster: str, state: int) -> health_pb2.WorkloadResult:
        return health_pb2.WorkloadResult(
            cluster_id=cluster,
            workload=health_pb2.Workload(namespace="ns", name="web"),
            health=state,  # type: ignore[arg-type]
            message="0 of 1 pod(s) healthy, 1 required",
        )

    ok, text = health.summarize([result("a", HEALTHY), result("b", HEALTHY)])
    assert ok and text == "1 tracked workload(s) healthy on 2 cluster(s)"
    ok, text = health.summarize([result("a", HEALTHY), result("b", UNHEALTHY)])
    assert not ok and "b ns/web: UNHEALTHY (0 of 1 pod(s) healthy, 1 required)" in text
    assert health.summarize([]) == (False, "no workload results")


def test_gate_ids_round_trip_and_foreign_ids_are_rejected() -> None:
    assert gatelib.gate_id(CLUSTER_APPROVAL_REQUESTS, "", "r-after-s") == (
        "ClusterApprovalRequest/r-after-s"
    )
    assert gatelib.parse_gate_id("ClusterApprovalRequest/r-after-s") == (
        CLUSTER_APPROVAL_REQUESTS,
        "",
        "r-after-s",
    )
    assert gatelib.parse_gate_id("ApprovalRequest/ns/r") == (APPROVAL_REQUESTS, "ns", "r")
    for bad in ("", "ApprovalRequest/r", "ClusterApprovalRequest/", "Other/x", "conformance-x"):
        assert gatelib.parse_gate_id(bad) is None


def _request(*conds: dict[str, object], generation: int = 1) -> dict[str, object]:
    return {"metadata": {"generation": generation}, "status": {"conditions": list(conds)}}


def test_approved_means_approved_for_the_current_generation() -> None:
    approved = {"type": "Approved", "status": "True", "observedGeneration": 1, "reason": "x"}
    assert gatelib.approval_state(_request(approved)) == gate_pb2.GATE_STATE_APPROVED
    assert gatelib.approval_state(_request(approved, generation=2)) == gate_pb2.GATE_STATE_PENDING
    ours = {
        "type": "Approved",
        "status": "False",
        "observedGeneration": 1,
        "reason": gatelib.REJECTED_REASON,
    }
    assert gatelib.approval_state(_request(ours)) == gate_pb2.GATE_STATE_REJECTED
    accepted = {"type": "ApprovalAccepted", "status": "True", "observedGeneration": 1}
    assert gatelib.approval_state(_request(accepted)) == gate_pb2.GATE_STATE_APPROVED
    assert gatelib.approval_state(_request()) == gate_pb2.GATE_STATE_PENDING


def test_stage_clusters_and_tracked_workloads_are_read_from_the_documented_fields() -> None:
    run = {
        "status": {
            "stagesStatus": [
                {"stageName": "prod", "clusters": [{"clusterName": "b"}, {"clusterName": "c"}]}
            ]
        }
    }
    assert gatelib.stage_clusters(run, "prod") == ["b", "c"]
    assert gatelib.stage_clusters(run, "staging") is None
    tracker = {
        "workloads": [
            {"name": "web", "namespace": "ns", "healthyReplicas": 3},
            {"name": "no-namespace"},
        ]
    }
    assert [(w.name, w.min_healthy_replicas) for w in gatelib.tracked_workloads(tracker)] == [
        ("web", 3)
    ]
    assert gatelib.extra_checks(tracker) is None
    assert not gatelib.is_latest(
        {"metadata": {"labels": {"kubernetes-fleet.io/isLatestUpdateRunApproval": "false"}}}
    )


def test_only_our_taint_is_added_and_removed() -> None:
    spec = inventory.TaintSpec("fleetupgrade.io/out-of-service", "fleet-orchestrator")
    foreign = {
        "key": "fleetupgrade.io/out-of-service",
        "value": "someone-else",
        "effect": "NoSchedule",
    }
    other = {"key": "team", "value": "x", "effect": "NoSchedule"}
    added = inventory.with_our_taint([other, foreign], spec)
    assert added == [other, foreign, {"key": spec.key, "value": spec.value, "effect": "NoSchedule"}]
    assert inventory.with_our_taint(added, spec) is None
    assert inventory.without_our_taint(added, spec) == [other, foreign]
    assert inventory.without_our_taint([other, foreign], spec) is None


def test_version_and_availability_of_a_member_cluster() -> None:
    member = {
        "metadata": {"name": "a", "labels": {"environment": "prod", "v": "v1.30.1"}},
        "status": {
            "conditions": [{"type": "Joined", "status": "True"}],
            "agentStatus": [
                {
                    "type": "MemberAgent",
                    "conditions": [
                        {"type": "Joined", "status": "True"},
                        {"type": "Healthy", "status": "False", "reason": "HeartbeatLost"},
                    ],
                    "lastReceivedHeartbeat": "2026-01-01T11:59:30Z",
                }
            ],
            "properties": {"k8s.io/k8s-version": {"value": "v1.29.4"}},
        },
    }
    assert inventory.cluster_version(member, "property:k8s.io/k8s-version") == "1.29.4"
    assert inventory.cluster_version(member, "label:v") == "1.30.1"
    # auto: the Azure property first, then the annotation, then the label anyone can set.
    assert inventory.cluster_version(member, "auto") == "1.29.4"
    bare = {"metadata": {"annotations": {"fleetupgrade.io/kubernetes-version": "v1.31.0"}}}
    assert inventory.cluster_version(bare, "auto") == "1.31.0"
    labelled = {"metadata": {"labels": {"fleetupgrade.io/kubernetes-version": "1.28.9"}}}
    assert inventory.cluster_version(labelled, "auto") == "1.28.9"
    assert (
        inventory.cluster_version(labelled, "label:v,label:fleetupgrade.io/kubernetes-version")
        == "1.28.9"
    )
    assert inventory.cluster_version({}, "auto") == ""
    assert inventory.availability(member, 300.0, NOW) == (
        False,
        "MemberAgent condition Healthy is False (HeartbeatLost)",
    )


def _member_heard_from(last: str | None) -> dict[str, object]:
    """A joined member, its agent Joined and Healthy, its last heartbeat at `last`."""
    agent: dict[str, object] = {
        "type": "MemberAgent",
        "conditions": [
            {"type": "Joined", "status": "True"},
            {"type": "Healthy", "status": "True"},
        ],
    }
    if last is not None:
        agent["lastReceivedHeartbeat"] = last
    return {
        "metadata": {"name": "a"},
        "status": {"conditions": [{"type": "Joined", "status": "True"}], "agentStatus": [agent]},
    }


def test_a_member_whose_agent_is_silent_is_not_available_as_kubefleet_judges_it() -> None:
    """KubeFleet's scheduler counts a member whose agent last heartbeat more than 5 minutes ago
    as not connected, whatever its conditions say (nothing on the hub changes them)."""
    assert inventory.DEFAULT_HEARTBEAT_TIMEOUT == 300.0
    assert KubeFleetConfig().heartbeat_timeout == 300.0
    fresh = _member_heard_from("2026-01-01T11:55:00Z")  # exactly 5 minutes: still connected
    assert inventory.availability(fresh, 300.0, NOW) == (True, "")
    stale = _member_heard_from("2026-01-01T09:00:00Z")
    available, why = inventory.availability(stale, 300.0, NOW)
    assert not available
    assert why == (
        "MemberAgent is silent: last heartbeat 3h0m ago (2026-01-01T09:00:00Z), more than the "
        "300s KubeFleet allows before it counts the member as not connected"
    )
    # The threshold is ours to set: 301 s is silent at 300 s, connected at 600 s.
    just_over = _member_heard_from("2026-01-01T11:54:59Z")
    assert not inventory.availability(just_over, 300.0, NOW)[0]
    assert inventory.availability(just_over, 600.0, NOW) == (True, "")
    # Never heard from (or unreadable): as old as can be, as in KubeFleet (a zero time).
    for last in (None, "", "yesterday"):
        assert inventory.availability(_member_heard_from(last), 300.0, NOW) == (
            False,
            "MemberAgent has reported no heartbeat (lastReceivedHeartbeat is not set)",
        )
    cluster = inventory.to_cluster(stale, inventory.TaintSpec(), "auto", 300.0, None)
    assert not cluster.available
    assert cluster.unavailable_reason.startswith("MemberAgent is silent: last heartbeat ")


def test_configuration_problems_name_the_flag() -> None:
    assert KubeFleetConfig().problems() == []
    problems = KubeFleetConfig(
        health_source="prometheus", collect_interval="soon", version_source="nowhere"
    ).problems()
    assert any(p.startswith("--central-prometheus-url") for p in problems)
    assert any(p.startswith("--collect-interval") for p in problems)
    assert any(p.startswith("--version-source") for p in problems)
    assert KubeFleetConfig(heartbeat_timeout=0).problems() == [
        "--heartbeat-timeout: must be a positive number of seconds (KubeFleet's own is 300)"
    ]


def test_names_stay_within_63_characters_and_are_stable() -> None:
    ref = gatelib.GateRef(APPROVAL_REQUESTS, "team-" * 8, "run-" * 10 + "x", "x", "prod")
    names = collector_names(ref)
    assert all(len(n) <= 63 for n in names)
    assert names == collector_names(ref)
    assert name_with_limit("short") == "short"


def test_conditions_keep_their_transition_time_unless_the_status_flips() -> None:
    first = set_condition(None, "X", "True", "A", "m", 1, NOW)
    later = NOW + timedelta(minutes=1)
    same = set_condition(first, "X", "True", "B", "n", 2, later)
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert same[0]["reason"] == "B"
    flipped = set_condition(same, "X", "False", "C", "", 2, later)
    assert flipped[0]["lastTransitionTime"] != first[0]["lastTransitionTime"]
    assert flipped[0]["message"] == "C"  # never an empty message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("nope", 30.0), (None, 30.0)],
)
def test_collector_intervals(text: object, seconds: float) -> None:
    assert parse_interval(text) == seconds


def test_the_emulated_override_gives_each_member_its_report_namespace() -> None:
    mc = {"metadata": {"name": "mc-r-s"}, "spec": {"reportNamespace": "set-by-override", "x": 1}}
    cro = {
        "metadata": {"name": "ro-mc-r-s"},
        "spec": {
            "clusterResourceSelectors": [{"kind": "MetricCollector", "name": "mc-r-s"}],
            "policy": {
                "overrideRules": [
                    {
                        "clusterSelector": {"clusterSelectorTerms": []},
                        "jsonPatchOverrides": [
                            {
                                "op": "replace",
                                "path": "/spec/reportNamespace",
                                "value": "fleet-member-${MEMBER-CLUSTER-NAME}",
                            }
                        ],
                    }
                ]
            },
        },
    }
    placed = override_for(mc, "MetricCollector", [cro], "member-2", {})
    assert placed is not None and placed["spec"] == {
        "reportNamespace": "fleet-member-member-2",
        "x": 1,
    }
    assert mc["spec"]["reportNamespace"] == "set-by-override"  # the hub copy is untouched
    nil = {**cro, "spec": {**cro["spec"], "policy": {"overrideRules": [{"clusterSelector": None}]}}}
    assert override_for(mc, "MetricCollector", [nil], "member-2", {}) == mc
    with pytest.raises(KeyError):
        apply_json_patch(mc, [{"op": "replace", "path": "/spec/absent", "value": 1}])


def test_a_stage_of_more_than_100_clusters_gets_several_placements() -> None:
    ref = gatelib.GateRef(CLUSTER_APPROVAL_REQUESTS, "", "r-after-prod", "r", "prod")
    request = {"metadata": {"name": "r-after-prod", "uid": "u-1"}}
    clusters = [f"m-{i:03d}" for i in range(250)]
    collector, placements = collection.seed_bodies(ref, request, clusters, "http://p:9090", "5s")
    names = [p["metadata"]["name"] for p in placements]
    assert names == ["crp-mc-r-prod", "crp-mc-r-prod-2", "crp-mc-r-prod-3"]
    picked = [p["spec"]["policy"]["clusterNames"] for p in placements]
    assert [len(p) for p in picked] == [100, 100, 50]
    assert [c for names in picked for c in names] == clusters
    assert all(
        b["metadata"]["ownerReferences"][0]["uid"] == "u-1" for b in [collector, *placements]
    )
    # Only the fields of the seed schema (cbpr_metriccollectors: prometheusUrl, reportNamespace).
    assert collector["spec"] == {
        "prometheusUrl": "http://p:9090",
        "reportNamespace": "set-by-override",
    }
    assert collector["metadata"]["annotations"]["fleetupgrade.io/collect-interval"] == "5s"


def _check_plan(plan: dict[str, list[str]], wanted: set[str], limit: int) -> None:
    selected = [c for names in plan.values() for c in names]
    assert len(selected) == len(set(selected)), "a collector in two overrides"
    assert set(selected) <= wanted
    assert all(0 < len(v) <= collection.SELECTORS_PER_OVERRIDE for v in plan.values())
    assert len(plan) <= limit


def test_overrides_are_shared_under_the_hub_limit_and_never_move_a_collector() -> None:
    # 250 pending gates: 13 shared overrides, not 250 (KubeFleet admits 100 per hub).
    wanted = {f"mc-run-{i:03d}-prod" for i in range(250)}
    plan, waiting = collection.plan_overrides({}, sorted(wanted), max_overrides=100)
    _check_plan(plan, wanted, 100)
    assert waiting == [] and len(plan) == 13
    # Gates come and go: a collector still pending keeps its override; new ones fill the gaps.
    done = {c for i, c in enumerate(sorted(wanted)) if i % 3 == 0}
    new = {f"mc-next-{i:03d}-prod" for i in range(40)}
    wanted2 = (wanted - done) | new
    plan2, waiting2 = collection.plan_overrides(plan, sorted(wanted2), max_overrides=100)
    _check_plan(plan2, wanted2, 100)
    assert waiting2 == []
    where = {c: name for name, names in plan.items() for c in names}
    where2 = {c: name for name, names in plan2.items() for c in names}
    assert all(where2[c] == where[c] for c in wanted - done)
    assert len(plan2) == len(plan)  # the gaps were filled, nothing new was needed
    # Over this plugin's share: the rest waits, the limit holds.
    plan3, waiting3 = collection.plan_overrides({}, sorted(wanted), max_overrides=10)
    _check_plan(plan3, wanted, 10)
    assert len(waiting3) == 250 - 200
    # Everything resolved: no override is left.
    assert collection.plan_overrides(plan2, [], max_overrides=100) == ({}, [])


def test_hub_created_reports_are_the_current_cookbooks() -> None:
    ref = gatelib.GateRef(APPROVAL_REQUESTS, "team", "r-after-prod", "r", "prod")
    bodies = collection.report_bodies(
        ref, {"metadata": {}}, ["b", "a"], CURRENT, "http://prom:9090", "30s"
    )
    assert [(res.group, ns, b["metadata"]["name"]) for res, ns, b in bodies] == [
        ("autoapprove.kubernetes-fleet.io", "fleet-member-a", "mc-team-r-prod"),
        ("autoapprove.kubernetes-fleet.io", "fleet-member-b", "mc-team-r-prod"),
    ]
    body = bodies[0][2]
    assert body["spec"] == {"prometheusUrl": "http://prom:9090"}
    assert body["metadata"]["labels"]["kubernetes-fleet.io/parent-approval-request"] == (
        "team.r-after-prod"
    )
    assert "ownerReferences" not in body["metadata"]  # a namespaced request owns nothing


def _run(*stages: tuple[str, dict[str, str], str], state: str = "Run") -> dict[str, object]:
    """A run status: stages of (name, {cluster: Succeeded status or ""}, stage Succeeded)."""

    def conds(status: str) -> list[dict[str, str]]:
        return [{"type": "Succeeded", "status": status}] if status else []

    return {
        "spec": {"state": state},
        "status": {
            "stagesStatus": [
                {
                    "stageName": name,
                    "clusters": [
                        {"clusterName": c, "conditions": conds(s)} for c, s in clusters.items()
                    ],
                    "conditions": conds(done),
                }
                for name, clusters, done in stages
            ]
        },
    }


def _ref(task: str, stage: str) -> gatelib.GateRef:
    return gatelib.GateRef(CLUSTER_APPROVAL_REQUESTS, "", f"r-x-{stage}", "r", stage, task)


def test_after_stage_gates_wait_for_the_stage_to_be_updated_then_check_its_clusters() -> None:
    after = gatelib.AFTER_STAGE
    updating = _run(("staging", {"a": "True"}, "True"), ("prod", {"b": "True", "c": ""}, ""))
    ready = gatelib.readiness(updating, _ref(after, "prod"))
    assert ready.blocked_reason == "ClustersNotUpdated" and "c not updated" in ready.blocked_message
    done = _run(("staging", {"a": "True"}, "True"), ("prod", {"b": "True", "c": "True"}, ""))
    assert gatelib.readiness(done, _ref(after, "prod")) == gatelib.Readiness(["b", "c"])
    failed = _run(("staging", {"a": "True"}, "True"), ("prod", {"b": "False", "c": "True"}, ""))
    assert gatelib.readiness(failed, _ref(after, "prod")).blocked_reason == "ClusterUpdateFailed"


def test_before_stage_gates_are_a_go_no_go_on_what_the_run_already_updated() -> None:
    before = gatelib.BEFORE_STAGE
    fresh = _run(("staging", {"a": ""}, ""), ("prod", {"b": "", "c": ""}, ""))
    first = gatelib.readiness(fresh, _ref(before, "staging"))
    # nothing updated: a baseline
    assert first == gatelib.Readiness(["a"], baseline=True, stage_clusters=["a"])
    early = gatelib.readiness(fresh, _ref(before, "prod"))
    assert early.blocked_reason == "EarlierStageNotDone"
    staged = _run(("staging", {"a": "True"}, "True"), ("prod", {"b": "", "c": ""}, ""))
    # prod's go/no-go is decided on staging's clusters, which run the new version; never on
    # prod's own clusters (still on the old version).
    assert gatelib.readiness(staged, _ref(before, "prod")) == gatelib.Readiness(
        ["a"], stage_clusters=["b", "c"]
    )
    stopped = _run(("staging", {"a": "True"}, "True"), ("prod", {"b": ""}, ""), state="Stop")
    assert gatelib.readiness(stopped, _ref(before, "prod")).blocked_reason == "RunStopped"
    failed = _run(("staging", {"a": "False"}, ""), ("prod", {"b": ""}, ""))
    assert gatelib.readiness(failed, _ref(before, "prod")).blocked_reason == "ClusterUpdateFailed"
    assert gatelib.readiness(fresh, _ref(before, "qa")).blocked_reason == "StageNotFound"


def test_task_types_come_from_the_label_then_the_name() -> None:
    def request(name: str, label: str = "") -> dict[str, object]:
        labels = {"kubernetes-fleet.io/taskType": label} if label else {}
        return {"metadata": {"name": name, "labels": labels}}

    assert gatelib.task_type(request("r-before-s", "beforeStage"), "r", "s") == "beforeStage"
    assert gatelib.task_type(request("x", "afterStage"), "r", "s") == "afterStage"
    assert gatelib.task_type(request("r-before-s"), "r", "s") == "beforeStage"
    assert gatelib.task_type(request("r-after-s"), "r", "s") == "afterStage"


def test_health_data_from_before_a_clusters_update_is_not_used() -> None:
    run = _run(("prod", {"b": "True"}, ""))
    run["status"]["stagesStatus"][0]["clusters"][0]["conditions"][0]["lastTransitionTime"] = (  # type: ignore[index]
        "2026-01-01T11:59:50Z"
    )
    updated = gatelib.stage_updated_times([run])
    assert updated == {"b": datetime(2026, 1, 1, 11, 59, 50, tzinfo=UTC)}
    before = _report(lastCollectionTime="2026-01-01T11:59:45Z")
    problem, _ = health.report_problem(before, NOW, 60, updated["b"])
    assert "before the cluster's update finished" in problem
    after = _report(lastCollectionTime="2026-01-01T11:59:55Z")
    assert health.report_problem(after, NOW, 60, updated["b"])[0] == ""


def test_operation_records_round_trip_and_keep_the_last_ten() -> None:
    op = cluster_pb2.Operation(
        id="kubefleet-1",
        request_id="req-1",
        kind=cluster_pb2.OPERATION_KIND_SERVICE_OUT,
        state=cluster_pb2.OPERATION_STATE_RUNNING,
    )
    record = oplog.OpRecord.of(op)
    obj = {"metadata": {"annotations": {"fleetupgrade.io/operations": oplog.encode([record])}}}
    assert oplog.read(obj) == [record]
    assert (record.kind_value, record.state_value) == (op.kind, op.state)
    ended = oplog.OpRecord("kubefleet-1", "req-1", "ServiceOut", "Succeeded")
    assert oplog.with_record([record], ended) == [ended]
    many: list[oplog.OpRecord] = []
    for i in range(15):
        many = oplog.with_record(many, oplog.OpRecord(f"id-{i}", f"r-{i}", "ServiceIn", "Failed"))
    kept = oplog.read(
        {"metadata": {"annotations": {"fleetupgrade.io/operations": oplog.encode(many)}}}
    )
    assert [r.id for r in kept] == [f"id-{i}" for i in range(5, 15)]
    assert oplog.read({"metadata": {"annotations": {"fleetupgrade.io/operations": "{"}}}) == []


def test_plugin_flags_are_name_equals_host_port() -> None:
    assert parse_plugin_flag("kubefleet=127.0.0.1:50061") == ("kubefleet", "127.0.0.1:50061")
    assert parse_plugin_flag("kf-2=plugin.svc:443") == ("kf-2", "plugin.svc:443")
    for bad in ("kubefleet", "=127.0.0.1:1", "KubeFleet=h:1", "kf=host", "kf=h:port"):
        with pytest.raises(ValueError, match="NAME=HOST:PORT"):
            parse_plugin_flag(bad)


def test_what_the_plugin_writes_meets_the_upstream_cel_rules() -> None:
    """The test server (1.20) does not run CEL: the rules that apply to the plugin's writes are
    checked here by hand, against the rules as the upstream CRDs state them."""
    crp_rules = {r.message for r in cel_rules(_CRP_CRD, "v1beta1")}
    cro_rules = {r.message for r in cel_rules(_CRO_CRD, "v1beta1")}
    request_rules = {r.message for r in cel_rules(_CAR_CRD, "v1beta1")}
    ref = gatelib.GateRef(CLUSTER_APPROVAL_REQUESTS, "", "r-after-prod", "r", "prod")
    request = {"metadata": {"name": "r-after-prod", "uid": "u-1"}}
    bodies = [
        collection.seed_bodies(ref, request, [f"m-{i}" for i in range(n)], "http://p:9", "1s")[1]
        for n in (1, 150)
    ]
    pick_fixed = (
        "affinity, numberOfClusters, topologySpreadConstraints, and tolerations cannot be set "
        "when placementType is PickFixed"
    )
    assert pick_fixed in crp_rules
    assert "name and labelSelector are mutually exclusive in a resource selector" in crp_rules
    assert "placement type is immutable" in crp_rules
    assert "policy cannot be removed once set" in crp_rules
    assert "cannot change rollout strategy type from 'External' to other types" in crp_rules
    for placements in bodies:
        for body in placements:
            spec = body["spec"]
            assert set(spec["policy"]) == {"placementType", "clusterNames"}  # PickFixed rule
            assert spec["policy"]["placementType"] == "PickFixed"  # never another type
            assert all(s["name"] and "labelSelector" not in s for s in spec["resourceSelectors"])
            assert spec["strategy"]["type"] == "RollingUpdate"  # never External, so no change
            assert len(body["metadata"]["name"]) <= 63
    # Overrides: spec.placement is immutable and may not be Namespaced: ours never set it.
    assert "The placement field is immutable" in cro_rules
    override = collection.override_body("ro-fleet-metric-collectors-1", ["mc-a", "mc-b"])
    assert "placement" not in override["spec"]
    assert all("labelSelector" not in s for s in override["spec"]["clusterResourceSelectors"])
    # Approval requests: spec is immutable; the plugin writes their status subresource only.
    assert "The spec field is immutable" in request_rules


_CRP_CRD = "kf_placement.kubernetes-fleet.io_clusterresourceplacements.yaml"
_CRO_CRD = "kf_placement.kubernetes-fleet.io_clusterresourceoverrides.yaml"
_CAR_CRD = "kf_placement.kubernetes-fleet.io_clusterapprovalrequests.yaml"
