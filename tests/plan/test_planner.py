"""The planner converges, keeps the floor, orders steps, halts on failure and resumes."""

from __future__ import annotations

from collections import Counter

from orchestrator import api
from orchestrator.fleet import OpKind
from orchestrator.plan import PlanInput, plan
from orchestrator.simulate import T0, simulate
from tests.plan.model import make_fleet, spec_for


def test_rollout_converges_and_keeps_the_floor() -> None:
    fleet = make_fleet(20)
    result = simulate(fleet, spec_for(fleet, "1.29.1", required=15))
    assert result.last.status.phase == api.RolloutPhase.COMPLETED
    assert all(c.control_plane_version == "1.29.1" for c in fleet.clusters.values())
    assert all(p.version == "1.29.1" for c in fleet.clusters.values() for p in c.node_pools)
    assert all(c.in_service for c in fleet.clusters.values())
    assert fleet.min_available_in_service == 15
    steps = Counter(fleet.started_steps)
    assert max(steps.values()) == 1, "a step was started twice"
    assert result.last.status.clusters is None
    assert result.last.status.summary is not None and result.last.status.summary.up_to_date == 20


def test_steps_run_in_order_per_cluster() -> None:
    fleet = make_fleet(4)
    simulate(fleet, spec_for(fleet, "1.29.1", required=2))
    for cid in fleet.clusters:
        kinds = [k for c, k, _, _ in fleet.started_steps if c == cid]
        assert kinds == [
            OpKind.SERVICE_OUT,
            OpKind.CONTROL_PLANE,
            OpKind.NODE_POOL,
            OpKind.NODE_POOL,
            OpKind.SERVICE_IN,
        ]


def test_failure_halts_and_touches_no_further_cluster() -> None:
    fleet = make_fleet(10)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    result = simulate(fleet, spec_for(fleet, "1.29.1", required=9))
    assert result.last.status.phase == api.RolloutPhase.HALTED
    touched = {c for c, *_ in fleet.started_steps}
    assert touched == {"c00000"}
    failed = [e for e in result.last.status.clusters or [] if e.phase == api.ClusterPhase.FAILED]
    assert [e.id for e in failed] == ["c00000"]
    assert "injected failure" in (failed[0].message or "")
    ready = next(c for c in result.last.status.conditions or [] if c.type == "Ready")
    assert ready.status == "False" and ready.reason == "ClusterFailed"


def test_failed_cluster_is_not_reissued_until_retry_annotation() -> None:
    fleet = make_fleet(3)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    spec = spec_for(fleet, "1.29.1", required=2)
    result = simulate(fleet, spec)
    before = len(fleet.started_steps)
    again = plan(
        PlanInput(
            spec=spec, snapshot=fleet.snapshot(), now=T0, status=result.last.status, uid="sim"
        )
    )
    assert again.actions == []
    fleet.fail.clear()
    retried = plan(
        PlanInput(
            spec=spec,
            snapshot=fleet.snapshot(),
            now=T0,
            status=result.last.status,
            retry_clusters=frozenset({"c00000"}),
        )
    )
    assert [a.kind for a in retried.actions] == [OpKind.CONTROL_PLANE]
    assert retried.actions[0].request_id.endswith(":1")
    assert len(fleet.started_steps) == before


def test_stages_run_in_order() -> None:
    fleet = make_fleet(9, staged=True)
    stages = [
        {"name": n, "selector": {"matchLabels": {"stage": n}}} for n in ("canary", "early", "main")
    ]
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 6,
            "version": "1.29.1",
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "strategy": {"stages": stages},
        }
    )
    result = simulate(fleet, spec)
    assert result.last.status.phase == api.RolloutPhase.COMPLETED
    order = [
        fleet.clusters[c].labels["stage"]
        for c, k, *_ in fleet.started_steps
        if k == OpKind.SERVICE_OUT
    ]
    assert order == sorted(order, key=["canary", "early", "main"].index)


def test_manual_approval_blocks_the_stage() -> None:
    fleet = make_fleet(6, staged=True)
    stages = [
        {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}},
        {
            "name": "rest",
            "selector": {
                "matchExpressions": [
                    {"key": "stage", "operator": "In", "values": ["early", "main"]}
                ]
            },
            "approval": "Manual",
        },
    ]
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 3,
            "version": "1.29.1",
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "strategy": {"stages": stages},
        }
    )
    result = simulate(fleet, spec)
    assert not result.settled
    assert result.last.status.current_stage == "rest"
    stage = next(s for s in result.last.status.stages or [] if s.name == "rest")
    assert stage.phase == api.StagePhase.AWAITING_APPROVAL
    result = simulate(fleet, spec, approved=frozenset({"rest"}))
    assert result.last.status.phase == api.RolloutPhase.COMPLETED


def test_invalid_spec_issues_nothing() -> None:
    fleet = make_fleet(3)
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 3,
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "clusters": [
                {"id": "c00000", "version": "1.29.1"},
                {"id": "nope", "version": "1.29.1"},
                {"id": "c00001", "version": "1.27.0"},
            ],
        }
    )
    invalid = plan(PlanInput(spec=spec, snapshot=fleet.snapshot(), now=T0))
    assert invalid.actions == []
    fields = {p.field for p in invalid.problems}
    assert fields == {
        "spec.clusters[1].id",
        "spec.clusters[2].version",
        "spec.requiredAvailableCount",
    }
    ready = next(c for c in invalid.status.conditions or [] if c.type == "Ready")
    assert ready.reason == "InvalidSpec" and "spec.clusters[1].id" in ready.message
