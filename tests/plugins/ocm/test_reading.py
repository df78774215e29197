"""How the plugin reads OCM objects: taints, inventory, curator conditions, work feedback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm import curator, inventory, work
from plugins.ocm.config import TaintConfig, parse_config
from tests.plugins.ocm.conftest import curator_config, work_config
from tests.plugins.ocm.webhook import process_taints
from tests.support.ocm_emulator import jsonpath, select_clusters

OURS = TaintConfig()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING, SUCCEEDED, FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)
FOREIGN = [
    {"key": "cluster.open-cluster-management.io/unreachable", "effect": "NoSelect"},
    {"key": "example.com/maintenance", "value": "db", "effect": "PreferNoSelect"},
    {"key": OURS.key, "value": "someone-else", "effect": "NoSelect"},
]


def mc(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "c1", "labels": {"env": "prod"}},
        "spec": {"taints": status.pop("taints", [])},
        "status": {
            "conditions": [
                {"type": "ManagedClusterConditionAvailable", "status": "True", "reason": "Up"}
            ],
            "version": {"kubernetes": "v1.28.5+k3s1"},
            "clusterClaims": [{"name": "platform.open-cluster-management.io", "value": "AWS"}],
            **status,
        },
    }


# -- taints --------------------------------------------------------------------------------------


def test_adding_our_taint_keeps_every_foreign_taint_in_place() -> None:
    new = inventory.with_our_taint(list(FOREIGN), OURS)
    assert new is not None
    assert new[:3] == FOREIGN
    # No timeAdded: the hub's webhook stamps it and denies a new taint that carries one.
    assert new[3] == {"key": OURS.key, "value": OURS.value, "effect": "NoSelect"}
    assert inventory.with_our_taint(new, OURS) is None  # already there: nothing to write


def test_removing_removes_only_ours_never_a_same_key_taint_of_someone_else() -> None:
    tainted = inventory.with_our_taint(list(FOREIGN), OURS)
    assert tainted is not None
    assert inventory.without_our_taint(tainted, OURS) == FOREIGN
    assert inventory.without_our_taint(list(FOREIGN), OURS) is None  # ours absent: no write


def _stamped(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The taints as the hub stores them: each with its own timeAdded (all different)."""
    return [{**t, "timeAdded": f"2026-01-0{i + 1}T00:00:00Z"} for i, t in enumerate(taints)]


OUR_TAINT = {"key": OURS.key, "value": OURS.value, "effect": "NoSelect"}
SAME_KEY_A = {"key": OURS.key, "value": "team-a", "effect": "NoSelect"}
SAME_KEY_B = {"key": OURS.key, "value": "team-b", "effect": "NoSelect"}
SAME_KEY_A_AGAIN = {"key": OURS.key, "value": "team-a", "effect": "NoSelect"}
OTHER = {"key": "example.com/maintenance", "value": "db", "effect": "PreferNoSelect"}


@pytest.mark.parametrize(
    "order",
    [
        pytest.param([SAME_KEY_A, OUR_TAINT], id="foreign-first"),
        pytest.param([OUR_TAINT, SAME_KEY_A], id="ours-first"),
        pytest.param([SAME_KEY_A, OUR_TAINT, SAME_KEY_B], id="ours-between"),
        pytest.param([OUR_TAINT, SAME_KEY_A, OTHER, SAME_KEY_B], id="ours-first-of-several"),
        pytest.param([SAME_KEY_A, SAME_KEY_B, OTHER, OUR_TAINT], id="ours-last-of-several"),
        pytest.param([SAME_KEY_A, OUR_TAINT, SAME_KEY_A_AGAIN], id="a-duplicate-after-ours"),
        pytest.param([SAME_KEY_A, OTHER], id="ours-absent"),
    ],
)
def test_no_taint_write_is_one_the_hub_webhook_denies_whatever_the_same_key_order(
    order: list[dict[str, Any]],
) -> None:
    """The hub's webhook compares each taint sent with the first old taint of its key; every
    list this plugin sends (adding ours, removing ours, or the ledger alone) passes it, and
    keeps every foreign taint's key, value and effect, in place."""
    old = _stamped(order)
    foreign = [t for t in order if not inventory.is_our_taint(t, OURS)]
    plain = [{k: v for k, v in t.items() if k != "timeAdded"} for t in old]
    for target, wanted in (
        (inventory.with_our_taint(old, OURS) or old, [*foreign, OUR_TAINT]),
        (inventory.without_our_taint(old, OURS) or old, foreign),
        (old, plain),
    ):
        sent = inventory.admissible_taints(target, old)
        _, denied = process_taints({"spec": {"taints": sent}}, {"spec": {"taints": old}}, "now")
        assert denied == []
        as_sent = [{k: v for k, v in t.items() if k != "timeAdded"} for t in sent]
        if wanted is plain:
            assert as_sent == plain
        else:
            assert sorted(map(str, as_sent)) == sorted(map(str, wanted))
            assert [t for t in as_sent if t != OUR_TAINT] == foreign
    # A taint whose key is first of its kind keeps its timeAdded (nothing is re-stamped that
    # need not be): the first same-key taint and the other key.
    sent = inventory.admissible_taints(old, old)
    firsts = {t["key"]: t for t in reversed(old)}
    for before, after in zip(old, sent, strict=True):
        if firsts[before["key"]] is before:
            assert after == before


# -- inventory -----------------------------------------------------------------------------------


def test_managed_cluster_maps_to_a_contract_cluster() -> None:
    cfg = parse_config(work_config())  # a k3s member: its Kubernetes version is the version
    obj = mc()
    cluster = inventory.to_cluster(
        obj, cfg, inventory.cluster_version(obj, cfg.version_source), None
    )
    assert cluster.id == "c1"
    assert cluster.control_plane_version == "1.28.5+k3s1"
    assert dict(cluster.labels) == {
        "env": "prod",
        "clusterclaim/platform.open-cluster-management.io": "AWS",
    }
    assert cluster.available and cluster.in_service
    assert not cluster.node_pools


def test_our_taint_means_out_of_service_and_a_foreign_one_does_not() -> None:
    cfg = parse_config(curator_config())
    ours = inventory.with_our_taint([], OURS)
    assert not inventory.to_cluster(mc(taints=ours), cfg, "", None).in_service
    foreign = [{"key": OURS.key, "value": "someone-else", "effect": "NoSelect"}]
    assert inventory.to_cluster(mc(taints=foreign), cfg, "", None).in_service


@pytest.mark.parametrize(
    ("status", "taints", "reason"),
    [
        ("False", [], "ManagedClusterConditionAvailable is False (Down): lease expired"),
        ("Unknown", [], "ManagedClusterConditionAvailable is Unknown (Down): lease expired"),
        (
            "True",
            [{"key": "cluster.open-cluster-management.io/unavailable", "effect": "NoSelect"}],
            "the hub set taint cluster.open-cluster-management.io/unavailable",
        ),
    ],
)
def test_unavailable_from_the_condition_or_the_hub_taints(
    status: str, taints: list[dict[str, Any]], reason: str
) -> None:
    cond = {
        "type": "ManagedClusterConditionAvailable",
        "status": status,
        "reason": "Down" if status != "True" else "Up",
        "message": "lease expired" if status != "True" else "",
    }
    assert inventory.availability(mc(conditions=[cond], taints=taints)) == (False, reason)


def test_version_sources() -> None:
    obj = mc(clusterClaims=[{"name": "version.openshift.io", "value": "4.15.3"}])
    obj["metadata"]["labels"]["openshiftVersion"] = "4.15.3"
    assert inventory.cluster_version(obj, "kubernetes") == "1.28.5+k3s1"
    assert inventory.cluster_version(obj, "clusterClaim:version.openshift.io") == "4.15.3"
    assert inventory.cluster_version(obj, "label:openshiftVersion") == "4.15.3"
    assert inventory.cluster_version(obj, "clusterClaim:absent") == ""


def test_the_managed_cluster_info_answers_only_for_an_absent_openshift_claim() -> None:
    """ManagedClusterInfo status.distributionInfo.ocp.version (stolostron cluster-lifecycle-api
    clusterinfo/v1beta1 types.go) stands in for the version.openshift.io claim when the
    ManagedCluster has none; the claim wins when both exist; other sources never read it."""
    info = {"status": {"distributionInfo": {"type": "OCP", "ocp": {"version": "4.14.10"}}}}
    claimless = mc()
    source = "clusterClaim:version.openshift.io"
    assert inventory.cluster_version(claimless, source) == ""
    assert inventory.cluster_version(claimless, source, info) == "4.14.10"
    claimed = mc(clusterClaims=[{"name": "version.openshift.io", "value": "4.15.2"}])
    assert inventory.cluster_version(claimed, source, info) == "4.15.2"
    assert inventory.cluster_version(claimless, "kubernetes", info) == "1.28.5+k3s1"
    assert inventory.cluster_version(claimless, "clusterClaim:other", info) == ""
    assert inventory.cluster_version(claimless, source, {"status": {}}) == ""


# -- ClusterCurator ------------------------------------------------------------------------------


def curator_obj(*conditions: dict[str, Any], job: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"desiredCuration": "upgrade", "upgrade": {"desiredUpdate": "1.29.1"}}
    if job:
        spec["curatorJob"] = job
    return {"metadata": {"name": "c1"}, "spec": spec, "status": {"conditions": list(conditions)}}


def cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


CFG = parse_config(curator_config(monitorTimeout="10m"))


def test_curator_running_reports_progress_from_the_monitor_message() -> None:
    obj = curator_obj(
        cond("clustercurator-job", "False", "Job_has_finished", "job-1 DesiredCuration: upgrade"),
        cond("upgrade-cluster", "True", "Job_has_finished"),
        cond(
            "monitor-upgrade", "False", "Job_has_finished", "Upgrade status - 1.29.1: 50% complete"
        ),
        job="job-1",
    )
    verdict = curator.curator_verdict(obj, "1.28.5", "1.29.1", T0, T0, CFG)
    assert verdict.state == RUNNING
    assert 30 < verdict.progress < 95


def test_curator_failure_names_the_step_and_its_message() -> None:
    obj = curator_obj(
        cond("monitor-upgrade", "True", "Job_failed", "Timed out waiting for monitor upgrade job"),
        cond(
            "clustercurator-job",
            "True",
            "Job_failed",
            "job-1 DesiredCuration: upgrade Version (1.29.1;;) Failed - "
            "Timed out waiting for monitor upgrade job",
        ),
    )
    verdict = curator.curator_verdict(obj, "1.28.5", "1.29.1", T0, T0, CFG)
    assert (verdict.state, verdict.error_code) == (FAILED, "CURATION_FAILED")
    assert verdict.message == (
        "ClusterCurator c1: curation step monitor-upgrade failed: "
        "Timed out waiting for monitor upgrade job"
    )


def test_curator_success_waits_for_the_hub_to_report_the_version() -> None:
    done = curator_obj(cond("clustercurator-job", "True", "Job_has_finished", "job-1 ..."))
    waiting = curator.curator_verdict(done, "1.28.5", "1.29.1", T0, T0, CFG)
    assert waiting.state == RUNNING and "waiting for the new version" in waiting.message
    assert curator.curator_verdict(done, "1.29.1", "1.29.1", T0, T0, CFG).state == SUCCEEDED
    late = curator.curator_verdict(done, "1.28.5", "1.29.1", T0, T0 + timedelta(minutes=11), CFG)
    assert (late.state, late.error_code) == (FAILED, "TIMEOUT")
    assert "reports version 1.28.5, not 1.29.1" in late.message


def test_curator_that_never_starts_times_out_after_monitor_timeout() -> None:
    idle = curator_obj()
    assert curator.curator_verdict(idle, "1.28.5", "1.29.1", T0, T0, CFG).state == RUNNING
    late = curator.curator_verdict(idle, "1.28.5", "1.29.1", T0, T0 + timedelta(minutes=11), CFG)
    assert late.state == FAILED
    assert late.message.startswith("no result within monitorTimeout (10 min)")


def test_curator_patch_asks_for_the_upgrade_and_never_touches_the_status() -> None:
    cfg = parse_config(curator_config(clusterCurator={"channel": "stable-4.15"}))
    patch = curator.curator_patch(cfg, "c1", "1.29.1", "req-1", "ocm-1", T0)
    assert patch["spec"] == {
        "desiredCuration": "upgrade",
        "upgrade": {"desiredUpdate": "1.29.1", "monitorTimeout": 1, "channel": "stable-4.15"},
    }
    # The controller's predicate drops an update whose status changed: the spec write never
    # carries one (RESET_PATCH clears an old status in a write of its own).
    assert "status" not in patch and "operation" not in patch
    assert curator.RESET_PATCH == {"status": None, "operation": None}
    notes = patch["metadata"]["annotations"]
    assert notes["fleetupgrade.io/request-id"] == "req-1"
    assert notes["fleetupgrade.io/started-at"] == "2026-01-01T00:00:00Z"


# -- ManifestWork --------------------------------------------------------------------------------

WCFG = parse_config(work_config())


def test_the_template_is_rendered_with_version_and_cluster() -> None:
    assert WCFG.manifest_work is not None
    body = work.upgrade_work(WCFG.manifest_work, "c1", "1.29.1", "req-1", "ocm-1", T0)
    plan = body["spec"]["workload"]["manifests"][0]
    assert plan["spec"]["version"] == "v1.29.1"
    assert plan["metadata"]["labels"] == {"fleetupgrade.io/cluster": "c1"}
    config = body["spec"]["manifestConfigs"][0]
    assert config["resourceIdentifier"] == {
        "group": "upgrade.cattle.io",
        "resource": "plans",
        "name": "control-plane",
        "namespace": "system-upgrade",
    }
    assert config["feedbackRules"][0]["type"] == "JSONPaths"
    assert body["metadata"]["namespace"] == "c1"


def upgrade_status(generation: int, observed: int, values: dict[str, Any]) -> dict[str, Any]:
    assert WCFG.manifest_work is not None
    body = work.upgrade_work(WCFG.manifest_work, "c1", "1.29.1", "req-1", "ocm-1", T0)
    body["metadata"]["generation"] = generation
    ident = body["spec"]["manifestConfigs"][0]["resourceIdentifier"]
    body["status"] = {
        "conditions": [
            {"type": "Applied", "status": "True", "reason": "x", "observedGeneration": observed}
        ],
        "resourceStatus": {
            "manifests": [
                {
                    "resourceMeta": {**ident, "kind": "Plan", "ordinal": 0},
                    "statusFeedback": {
                        "values": [
                            {"name": k, "fieldValue": {"type": "String", "string": v}}
                            for k, v in values.items()
                        ]
                    },
                    "conditions": [],
                }
            ]
        },
    }
    return body


def test_feedback_of_an_older_generation_never_ends_a_new_upgrade() -> None:
    stale = upgrade_status(2, 1, {"complete": "True"})
    verdict = work.work_verdict(stale, "1.29.1", "1.29.1", T0, T0, WCFG)
    assert verdict.state == RUNNING and "new spec" in verdict.message


def test_work_feedback_success_and_failure() -> None:
    done = upgrade_status(1, 1, {"complete": "True"})
    assert work.work_verdict(done, "1.29.1", "1.29.1", T0, T0, WCFG).state == SUCCEEDED
    assert work.work_verdict(done, "1.28.5", "1.29.1", T0, T0, WCFG).state == RUNNING
    failed = upgrade_status(
        1, 1, {"complete": "False", "reason": "JobFailed", "message": "drain timed out"}
    )
    verdict = work.work_verdict(failed, "1.28.5", "1.29.1", T0, T0, WCFG)
    assert (verdict.state, verdict.error_code) == (FAILED, "UPGRADE_FAILED")
    assert verdict.message == "control-plane: drain timed out"


def health(entry_conditions: list[dict[str, Any]], values: dict[str, int]) -> dict[str, Any]:
    body = work.health_work(WCFG.workloads, "c1", [("shop", "web")])
    body["metadata"]["generation"] = 1
    body["status"] = {
        "conditions": [
            {"type": "Applied", "status": "True", "reason": "x", "observedGeneration": 1}
        ],
        "resourceStatus": {
            "manifests": [
                {
                    "resourceMeta": {
                        "group": "apps",
                        "resource": "deployments",
                        "name": "web",
                        "namespace": "shop",
                    },
                    "statusFeedback": {
                        "values": [
                            {"name": k, "fieldValue": {"type": "Integer", "integer": v}}
                            for k, v in values.items()
                        ]
                    },
                    "conditions": entry_conditions,
                }
            ]
        },
    }
    return body


PRESENT = [
    {"type": "Available", "status": "True", "reason": "ResourceAvailable"},
    {"type": "StatusFeedbackSynced", "status": "True", "reason": "StatusFeedbackSynced"},
]
H = health_pb2


@pytest.mark.parametrize(
    ("work_obj", "available", "minimum", "expected", "replicas"),
    [
        (health(PRESENT, {"AvailableReplicas": 3}), True, 2, H.WORKLOAD_HEALTH_HEALTHY, 3),
        (health(PRESENT, {"AvailableReplicas": 1}), True, 2, H.WORKLOAD_HEALTH_UNHEALTHY, 1),
        (health(PRESENT, {"Replicas": 2}), True, 0, H.WORKLOAD_HEALTH_UNHEALTHY, 0),
        (
            health(
                [{"type": "Available", "status": "False", "reason": "ResourceNotAvailable"}], {}
            ),
            True,
            0,
            H.WORKLOAD_HEALTH_MISSING,
            0,
        ),
        (health([], {}), True, 0, H.WORKLOAD_HEALTH_UNKNOWN, 0),
        (health(PRESENT, {"AvailableReplicas": 3}), False, 0, H.WORKLOAD_HEALTH_UNKNOWN, 0),
        (None, True, 0, H.WORKLOAD_HEALTH_UNKNOWN, 0),
    ],
    ids=["healthy", "too-few", "zero-omitted", "missing", "not-synced", "stale", "no-work"],
)
def test_workload_verdicts(
    work_obj: dict[str, Any] | None, available: bool, minimum: int, expected: int, replicas: int
) -> None:
    reading = work.read_workload(work_obj, (available, "agent down"), "shop", "web", minimum)
    assert (reading.health, reading.healthy_replicas) == (expected, replicas), reading.message


def test_health_work_is_read_only_with_feedback_rules() -> None:
    body = work.health_work(WCFG.workloads, "c1", [("shop", "web"), ("shop", "api")])
    configs = body["spec"]["manifestConfigs"]
    assert [c["resourceIdentifier"]["name"] for c in configs] == ["api", "web"]
    assert all(c["updateStrategy"] == {"type": "ReadOnly"} for c in configs)
    assert all(c["feedbackRules"] == [{"type": "WellKnownStatus"}] for c in configs)
    assert work.workloads_in(body) == {("shop", "web"), ("shop", "api")}


# -- the emulator's placement and JSONPath helpers (they decide what the e2e tests see) ------


def test_placement_selection_honours_no_select_taints_and_tolerations() -> None:
    clusters = [
        {"metadata": {"name": "a", "labels": {"env": "prod"}}, "spec": {}},
        {
            "metadata": {"name": "b", "labels": {"env": "prod"}},
            "spec": {"taints": [{"key": OURS.key, "value": OURS.value, "effect": "NoSelect"}]},
        },
        {
            "metadata": {"name": "c", "labels": {"env": "prod"}},
            "spec": {"taints": [{"key": "x.io/soft", "effect": "PreferNoSelect"}]},
        },
        {"metadata": {"name": "d", "labels": {"env": "dev"}}, "spec": {}},
    ]
    prod = {
        "spec": {
            "predicates": [
                {"requiredClusterSelector": {"labelSelector": {"matchLabels": {"env": "prod"}}}}
            ]
        }
    }
    assert select_clusters(prod, clusters) == ["a", "c"]
    tolerant = {"spec": {**prod["spec"], "tolerations": [{"key": OURS.key, "operator": "Exists"}]}}
    assert select_clusters(tolerant, clusters) == ["a", "b", "c"]


def test_emulator_jsonpath_subset() -> None:
    obj = {
        "status": {
            "conditions": [{"type": "A", "status": "x"}, {"type": "Complete", "status": "True"}]
        }
    }
    assert jsonpath(obj, '.status.conditions[?(@.type=="Complete")].status') == "True"
    assert jsonpath(obj, ".status.conditions[0].type") == "A"
    assert jsonpath(obj, ".status.missing") is None


def test_a_bare_target_is_met_by_the_distributions_build_of_that_release() -> None:
    done = curator_obj(cond("clustercurator-job", "True", "Job_has_finished", "job-1 ..."))
    assert curator.curator_verdict(done, "1.29.1+k3s1", "1.29.1", T0, T0, CFG).state == SUCCEEDED
    assert curator.curator_verdict(done, "1.29.0+k3s1", "1.29.1", T0, T0, CFG).state == RUNNING


def _done(version: str, failed: bool = False) -> dict[str, Any]:
    info = f"{version};;;;"
    message = f"curator-job-1 DesiredCuration: upgrade Version ({info})"
    if failed:
        message += " Failed - Provided version is not valid"
    reason = "Job_failed" if failed else "Job_has_finished"
    return {"status": {"conditions": [cond("clustercurator-job", "True", reason, message)]}}


@pytest.mark.parametrize(
    ("curator_obj", "target", "reset"),
    [
        ({}, "1.29.1", False),  # a new curator
        (_done("1.28.5"), "1.29.1", False),  # a finished upgrade to an older version
        (_done("1.29.1"), "1.29.1", True),  # finished at the target: NeedToUpgrade says no
        (_done("1.30.0"), "1.29.1", True),
        (_done("1.29.1", failed=True), "1.29.1", True),  # a failure is never retried as is
        (_done("1.28.5", failed=True), "1.29.1", True),  # its step failures would count
        ({**_done("1.28.5"), "operation": {}}, "1.29.1", True),  # updates dropped while set
        (
            {"status": {"conditions": [cond("Initiated", "True", "WorkflowSupported")]}},
            "1.29.1",
            True,
        ),
    ],
)
def test_the_status_is_cleared_first_unless_it_records_an_older_finished_upgrade(
    curator_obj: dict[str, Any], target: str, reset: bool
) -> None:
    assert curator.needs_reset(curator_obj, target) is reset


def test_the_record_of_an_earlier_curation_is_never_read_as_this_one() -> None:
    earlier = {"metadata": {"name": "c1"}, "spec": {}, **_done("1.28.5")}
    verdict = curator.curator_verdict(earlier, "1.28.5", "1.29.1", T0, T0, CFG)
    assert verdict.state == RUNNING and "waiting for the curator to start a job" in verdict.message
    ours = {"metadata": {"name": "c1"}, "spec": {}, **_done("1.29.1")}
    assert curator.curator_verdict(ours, "1.29.1", "1.29.1", T0, T0, CFG).state == SUCCEEDED
