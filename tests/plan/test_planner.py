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


def _verifying_plan(health: api.HealthState | None, now_offset: int = 0) -> tuple[object, object]:
    from datetime import timedelta

    from orchestrator.fleet import ClusterObs

    fleet = make_fleet(3, version="1.29.1")
    cid = "c00000"
    fleet.clusters[cid] = ClusterObs(
        id=cid,
        control_plane_version="1.29.1",
        in_service=False,
        node_pools=fleet.clusters[cid].node_pools,
    )
    spec = spec_for(fleet, "1.29.1", required=1).model_copy(
        update={
            "health_checks": api.HealthChecks.model_validate(
                {
                    "interval": "10s",
                    "successThreshold": 2,
                    "failureThreshold": 2,
                    "timeout": "5m",
                    "checks": [
                        {
                            "name": "ok",
                            "metric": {
                                "provider": {"type": "prometheus", "address": "http://p:9090"},
                                "query": "up",
                                "thresholdRange": {"min": 1},
                            },
                        }
                    ],
                }
            )
        }
    )
    entry = api.ClusterStatusEntry(
        id=cid, phase=api.ClusterPhase.VERIFYING, stage="default", health=health
    )
    status = api.ClusterVersionStatus(clusters=[entry])
    result = plan(
        PlanInput(
            spec=spec,
            snapshot=fleet.snapshot(),
            status=status,
            now=T0 + timedelta(seconds=now_offset),
        )
    )
    return result, next(iter(result.status.entries().values()), None)


def test_health_gate_waits_for_success_threshold() -> None:
    started = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=1, last_check_time="2026-01-01T00:00:00Z"
    )
    result, entry = _verifying_plan(started, now_offset=3)
    assert result.actions == []  # type: ignore[attr-defined]
    assert entry.phase == api.ClusterPhase.VERIFYING  # type: ignore[attr-defined]
    assert "1/2 passes" in entry.message  # type: ignore[attr-defined]
    assert result.requeue_after == 7  # type: ignore[attr-defined]
    passed = started.model_copy(update={"passes": 2})
    result, _ = _verifying_plan(passed, now_offset=10)
    assert [a.kind for a in result.actions] == [OpKind.SERVICE_IN]  # type: ignore[attr-defined]


def test_health_gate_fails_at_failure_threshold_and_on_timeout() -> None:
    bad = api.HealthState(
        since="2026-01-01T00:00:00Z",
        failures=2,
        last_check_time="2026-01-01T00:00:00Z",
        results=[
            api.CheckResult(name="ok", passed=False, value=0.0, message="value 0 outside [1, ∞]")
        ],
    )
    result, entry = _verifying_plan(bad, now_offset=1)
    assert result.actions == []  # type: ignore[attr-defined]
    assert entry.phase == api.ClusterPhase.FAILED  # type: ignore[attr-defined]
    assert "value 0 outside [1, ∞]" in entry.message  # type: ignore[attr-defined]
    assert result.status.phase == api.RolloutPhase.HALTED  # type: ignore[attr-defined]
    slow = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=1, last_check_time="2026-01-01T00:04:59Z"
    )
    _, entry = _verifying_plan(slow, now_offset=301)
    assert entry.phase == api.ClusterPhase.FAILED  # type: ignore[attr-defined]
    assert "within 5m" in entry.message  # type: ignore[attr-defined]


def test_bad_health_checks_are_invalid_spec() -> None:
    from orchestrator.validate import validate_spec

    fleet = make_fleet(3)
    base = spec_for(fleet, "1.29.1", required=1)
    raw = base.dump()
    raw["healthChecks"] = {
        "checks": [
            {
                "name": "a",
                "metric": {
                    "provider": {"type": "prometheus", "address": "http://p:9090"},
                    "query": 'sum(rate(x{cluster="{{ cluster }}"[5m]))',
                    "thresholdRange": {"min": 1},
                },
            },
            {
                "name": "b",
                "metric": {
                    "provider": {"type": "prometheus", "address": "http://p:9090"},
                    "query": "up",
                    "thresholdRange": {},
                },
            },
            {
                "name": "c",
                "metric": {
                    "provider": {"type": "datadog"},
                    "query": "up",
                    "thresholdRange": {"max": 1},
                },
            },
        ]
    }
    problems = validate_spec(api.ClusterVersionSpec.model_validate(raw))
    fields = {p.field for p in problems}
    assert fields == {
        "spec.healthChecks.checks[0].metric.query",
        "spec.healthChecks.checks[1].metric.thresholdRange",
        "spec.healthChecks.checks[2].metric.provider.type",
    }
    assert any("not valid PromQL" in p.message for p in problems)


def test_status_stays_small_at_ten_thousand_clusters() -> None:
    import json

    from orchestrator.fleet import Snapshot

    fleet = make_fleet(10_000, staged=True)
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 8_000,
            "version": "1.29.1",
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "strategy": {"stages": [{"name": "all", "selector": {}}]},
        }
    )
    first = plan(PlanInput(spec=spec, snapshot=Snapshot(fleet.clusters), now=T0))
    assert len(first.actions) == 2_000  # the whole budget in flight
    size = len(json.dumps(first.status.dump()))
    assert size <= 64 * 1024, size
    assert len(first.status.entries()) == 2_000  # nothing lost by the compact form
