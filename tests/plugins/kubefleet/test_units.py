"""Pure parts of the KubeFleet plugin: verdicts, report freshness, gate ids and states, taints,
configuration, names, the emulator's override arithmetic, and the generated CRDs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import yaml

from fleetupgrade.plugin.v1 import gate_pb2, health_pb2
from orchestrator import api
from orchestrator.crd import structural_schema
from orchestrator.gates import parse_plugin_flag
from plugins.kubefleet import KubeFleetConfig, collector_names, health, inventory
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet.collector import parse_interval
from plugins.kubefleet.fleet import collection_objects
from plugins.kubefleet.objects import (
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    name_with_limit,
    set_condition,
)
from plugins.kubefleet.prometheus import Sample
from tests.plugins.kubefleet import crdgen
from tests.support.kubefleet_emulator import apply_json_patch, override_for

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
        ((0.0,), 0, UNHEALTHY, 0),
        ((1.0, 0.0, 1.0), 2, HEALTHY, 2),
        ((1.0, 0.0, 0.5), 2, UNHEALTHY, 1),
        ((), 1, MISSING, 0),
    ],
)
def test_a_workload_needs_its_minimum_of_healthy_pods(
    values: tuple[float, ...], minimum: int, verdict: int, healthy: int
) -> None:
    workload = health_pb2.Workload(namespace="ns", name="web", min_healthy_replicas=minimum)
    result = health.judge(_pods(*values), workload, NOW)
    assert (result.health, result.healthy_pods) == (verdict, healthy)
    assert result.observed_time == NOW


def test_kind_matches_case_insensitively_and_only_when_given() -> None:
    pods = _pods(1.0, kind="StatefulSet")
    assert (
        health.judge(pods, health_pb2.Workload(namespace="ns", name="web"), None).health == HEALTHY
    )
    sts = health_pb2.Workload(namespace="ns", name="web", kind="statefulset")
    assert health.judge(pods, sts, None).health == HEALTHY
    deploy = health_pb2.Workload(namespace="ns", name="web", kind="Deployment")
    assert health.judge(pods, deploy, None).health == MISSING


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
                }
            ],
            "properties": {"k8s.io/k8s-version": {"value": "v1.29.4"}},
        },
    }
    assert inventory.cluster_version(member, "property:k8s.io/k8s-version") == "1.29.4"
    assert inventory.cluster_version(member, "label:v") == "1.30.1"
    assert inventory.availability(member) == (
        False,
        "MemberAgent condition Healthy is False (HeartbeatLost)",
    )


def test_configuration_problems_name_the_flag() -> None:
    assert KubeFleetConfig().problems() == []
    problems = KubeFleetConfig(
        health_source="prometheus", collect_interval="soon", version_source="nowhere"
    ).problems()
    assert any(p.startswith("--central-prometheus-url") for p in problems)
    assert any(p.startswith("--collect-interval") for p in problems)
    assert any(p.startswith("--version-source") for p in problems)


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


def test_the_generated_crds_are_current_and_the_tracker_checks_match_clusterversion() -> None:
    files = crdgen.all_files()
    stale = [str(p) for p, text in files.items() if not p.exists() or p.read_text() != text]
    assert not stale, "run `python -m tests.plugins.kubefleet.crdgen`: " + ", ".join(stale)
    tracker = yaml.safe_load((crdgen.OURS / "clusterstagedworkloadtrackers.yaml").read_text())
    schema = tracker["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    expected = structural_schema(api.HealthChecks)
    got = {k: v for k, v in schema["healthChecks"].items() if k != "description"}
    assert got == {k: v for k, v in expected.items() if k != "description"}
    report = yaml.safe_load((crdgen.OURS / "metriccollectorreports.yaml").read_text())
    columns = [c["name"].upper() for c in report["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:2] == ["WORKLOADS", "LAST-COLLECTION"]


def test_a_stage_of_more_than_100_clusters_gets_several_placements() -> None:
    ref = gatelib.GateRef(CLUSTER_APPROVAL_REQUESTS, "", "r-after-prod", "r", "prod")
    request = {"metadata": {"name": "r-after-prod", "uid": "u-1"}}
    clusters = [f"m-{i:03d}" for i in range(250)]
    objects = collection_objects(ref, request, clusters, KubeFleetConfig())
    kinds = [res.kind for res, _ in objects]
    assert (
        kinds == ["MetricCollector", "ClusterResourceOverride"] + ["ClusterResourcePlacement"] * 3
    )
    placements = [body for res, body in objects if res.kind == "ClusterResourcePlacement"]
    names = [p["metadata"]["name"] for p in placements]
    assert names == ["crp-mc-r-prod", "crp-mc-r-prod-2", "crp-mc-r-prod-3"]
    picked = [p["spec"]["policy"]["clusterNames"] for p in placements]
    assert [len(p) for p in picked] == [100, 100, 50]
    assert [c for names in picked for c in names] == clusters
    override = objects[1][1]["spec"]
    assert "placement" not in override  # it applies to all three placements
    assert all(b["metadata"]["ownerReferences"][0]["uid"] == "u-1" for _, b in objects)
    single = collection_objects(ref, request, clusters[:3], KubeFleetConfig())
    assert single[1][1]["spec"]["placement"] == {"name": "crp-mc-r-prod", "scope": "Cluster"}
    assert single[0][1]["spec"]["reportNamespace"] == "set-by-override"


def test_plugin_flags_are_name_equals_host_port() -> None:
    assert parse_plugin_flag("kubefleet=127.0.0.1:50061") == ("kubefleet", "127.0.0.1:50061")
    assert parse_plugin_flag("kf-2=plugin.svc:443") == ("kf-2", "plugin.svc:443")
    for bad in ("kubefleet", "=127.0.0.1:1", "KubeFleet=h:1", "kf=host", "kf=h:port"):
        with pytest.raises(ValueError, match="NAME=HOST:PORT"):
            parse_plugin_flag(bad)
