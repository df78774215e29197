"""Operating a rollout (issue 12) through the real RunDriver and engine on a model fleet: failure
budgets (run and stage, count and percent), failedClusterPolicy, skips of clusters and stages
(spec and annotations), retry rounds, stop and resume, and the scheduled start (notBefore)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from orchestrator import api
from orchestrator.engine.conditions import format_time
from orchestrator.engine.decide import RECOVER_GAVE_UP
from orchestrator.engine.observations import OpKind, WindowObs
from orchestrator.engine.validate import validate_spec
from orchestrator.pipeline.simulate import T0
from tests.engine.model import (
    LIFECYCLE,
    Harness,
    U,
    as_run_spec,
    harness,
    health_checks,
    make_fleet,
    spec_for,
    staged_spec,
)

NEW = "1.29.1"


def _select(*stages: str) -> dict[str, object]:
    return {"matchExpressions": [{"key": "stage", "operator": "In", "values": list(stages)}]}


def _three_stages(**per_stage: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": name, "selector": _select(name), **per_stage.get(name, {})}
        for name in ("canary", "early", "main")
    ]


def _staged(fleet_size: int, required: int, stages: list[dict[str, Any]], **extra: Any) -> Harness:
    fleet = make_fleet(fleet_size, staged=True)
    return Harness(fleet, as_run_spec(staged_spec(required, stages, **extra)))


def _service_outs_after(h: Harness, t: float) -> list[str]:
    return [
        cid
        for (cid, kind, _, _), at in zip(h.fleet.started_steps, h.fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT and at > t
    ]


# -- failure budgets --------------------------------------------------------------------------


def test_failures_within_the_run_budget_go_on_and_end_failed_with_the_count() -> None:
    fleet = make_fleet(10)
    fleet.fail |= {("c00002", OpKind.CONTROL_PLANE), ("c00005", OpKind.NODE_POOL)}
    # Two failed clusters stay out and count as down: 10 - 2 leaves room for one more at 7.
    h = harness(spec_for(fleet, NEW, required=7, maxFailures=2), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.FAILED  # finished, but not every cluster reached target
    phases = h.phases()
    assert {c for c, p in phases.items() if p == U.FAILED} == {"c00002", "c00005"}
    assert {p for c, p in phases.items() if c not in ("c00002", "c00005")} == {U.UPGRADED}
    assert fleet.min_available_in_service >= 7
    assert h.last is not None
    assert h.last.decision.failures == api.FailureSummary(
        count=2, max_failures=2, clusters=["c00002", "c00005"]
    )
    # Failed clusters stay out (KeepOut) and count as down: the floor held with them out.
    assert not fleet.clusters["c00002"].in_service and not fleet.clusters["c00005"].in_service


def test_one_failure_past_the_run_budget_halts_and_admits_nothing_more() -> None:
    fleet = make_fleet(12)
    for cid in ("c00000", "c00001", "c00002"):
        fleet.fail.add((cid, OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=9, maxFailures=1, maxConcurrency=1), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    failed = sorted(c for c, p in h.phases().items() if p == U.FAILED)
    assert failed == ["c00000", "c00001"]  # the second failure is one past the budget
    halted_at = next(t for t, c, p, _ in h.transitions if c == "c00001" and p == "Failed")
    assert _service_outs_after(h, halted_at) == []
    d = h.last.decision if h.last else None
    assert d is not None and d.failures is not None
    assert (d.failures.count, d.failures.max_failures) == (2, 1)
    assert "2 failure(s) past the budget (run maxFailures 1)" in d.message
    assert "c00000 (OperationFailed)" in d.message and "c00001 (OperationFailed)" in d.message
    assert d.waiting_reason == "Halted"
    before = len(fleet.started_steps)
    h.step()
    assert len(fleet.started_steps) == before


@pytest.mark.parametrize(("percent", "tolerated"), [("15%", 1), ("5%", 0), ("0%", 0)])
def test_a_percent_budget_rounds_down_and_may_be_zero(percent: str, tolerated: int) -> None:
    fleet = make_fleet(10)
    fleet.fail |= {("c00000", OpKind.CONTROL_PLANE), ("c00001", OpKind.CONTROL_PLANE)}
    h = harness(spec_for(fleet, NEW, required=8, maxFailures=percent, maxConcurrency=1), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    assert h.last is not None and h.last.decision.failures is not None
    assert h.last.decision.failures.max_failures == tolerated
    assert h.last.decision.failures.count == tolerated + 1
    assert api.parse_max_failures(percent, 10) == tolerated


def test_a_stage_budget_halts_the_run_even_when_the_run_tolerates_everything() -> None:
    h = _staged(
        12,
        6,
        _three_stages(canary={"maxFailures": 0}, early={"maxFailures": "50%"}),
        strategy={"onFailure": "Continue", "maxConcurrency": 1},
    )
    early = [c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "early"]
    for cid in early[:3]:
        h.fleet.fail.add((cid, OpKind.CONTROL_PLANE))
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    assert h.stage("canary").phase == api.StagePhase.COMPLETED
    assert h.stage("canary").max_failures == 0
    stage = h.stage("early")
    assert stage.phase == api.StagePhase.FAILED and stage.max_failures == 2
    assert stage.failed == 3  # the third failure is one past 50% of 4
    assert h.stage("main").phase == api.StagePhase.PENDING
    main = {c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "main"}
    assert not main & h.touched()
    assert h.last is not None and "stage early (3 failed, maxFailures 2)" in h.last.decision.message


def test_failures_within_a_stage_budget_complete_the_stage_and_the_run_goes_on() -> None:
    h = _staged(
        12,
        10,
        _three_stages(early={"maxFailures": 1}),
        strategy={"maxFailures": 1, "maxConcurrency": 1},
    )
    early = [c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "early"]
    h.fleet.fail.add((early[0], OpKind.NODE_POOL))
    assert h.run()
    assert h.phase == api.RunPhase.FAILED  # finished with one failure
    assert [s.phase for s in h.stages] == [api.StagePhase.COMPLETED] * 3
    assert h.phases()[early[0]] == U.FAILED
    assert sum(1 for p in h.phases().values() if p == U.UPGRADED) == 11
    assert h.fleet.min_available_in_service >= 10


# -- failedClusterPolicy --------------------------------------------------------------------


def test_service_in_if_healthy_services_a_failed_cluster_back_in_after_its_checks() -> None:
    fleet = make_fleet(6)
    fleet.fail.add(("c00001", OpKind.NODE_POOL))
    h = harness(
        spec_for(
            fleet,
            NEW,
            required=4,
            maxFailures=1,
            failedClusterPolicy="ServiceInIfHealthy",
            _healthChecks=health_checks(interval="10s", success=2),
        ),
        fleet,
    )
    assert h.run()
    assert h.phase == api.RunPhase.FAILED
    st = h.by_cluster()["c00001"]
    assert st.phase == U.FAILED and st.reason == "OperationFailed"  # the reason is kept
    assert "serviced back in" in (st.message or "") and "injected failure" in (st.message or "")
    assert fleet.clusters["c00001"].in_service
    # Invariant 3 for a failed cluster too: two passing evaluations of it before its service-in.
    service_in = max(
        at
        for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if cid == "c00001" and kind is OpKind.SERVICE_IN
    )
    failed_at = next(t for t, c, p, _ in h.transitions if c == "c00001" and p == "Failed")
    passes = [
        e
        for e in h.checker.evaluations
        if "c00001" in e.clusters and failed_at <= e.at <= service_in
    ]
    assert len(passes) >= 2 and all(e.passed for e in passes)


def test_service_in_if_healthy_leaves_a_cluster_out_while_its_checks_fail() -> None:
    fleet = make_fleet(4)
    fleet.fail.add(("c00000", OpKind.NODE_POOL))
    h = harness(
        spec_for(
            fleet,
            NEW,
            required=2,
            onFailure="Continue",
            failedClusterPolicy="ServiceInIfHealthy",
            _healthChecks=health_checks(interval="10s", success=2, failure=2),
        ),
        fleet,
    )
    h.checker.passes = lambda ids, stage: "c00000" not in ids
    assert h.run()
    assert h.phase == api.RunPhase.FAILED
    st = h.by_cluster()["c00000"]
    assert st.phase == U.FAILED and st.step == RECOVER_GAVE_UP
    assert not fleet.clusters["c00000"].in_service
    assert OpKind.SERVICE_IN not in h.steps_of("c00000")


def test_keep_out_leaves_a_failed_cluster_out_of_service() -> None:
    fleet = make_fleet(4)
    fleet.fail.add(("c00000", OpKind.NODE_POOL))
    h = harness(spec_for(fleet, NEW, required=2, onFailure="Continue"), fleet)
    assert h.run()
    assert not fleet.clusters["c00000"].in_service
    assert OpKind.SERVICE_IN not in h.steps_of("c00000")


# -- skips --------------------------------------------------------------------------------------


def test_spec_skip_of_a_cluster_is_recorded_with_who_and_why_and_never_touches_it() -> None:
    fleet = make_fleet(5)
    cv = spec_for(
        fleet,
        NEW,
        required=3,
        maxConcurrency=1,
        _skip={"clusters": ["c00003"], "reason": "customer freeze", "requestedBy": "alice"},
    )
    h = harness(cv, fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    st = h.by_cluster()["c00003"]
    assert (st.phase, st.reason) == (U.SKIPPED, "SkippedByUser")
    assert st.message == "skipped by alice: customer freeze"
    assert "c00003" not in h.touched()


def test_annotation_skip_names_the_requester_or_unknown() -> None:
    fleet = make_fleet(4)
    h = harness(spec_for(fleet, NEW, required=3, maxConcurrency=1), fleet)
    h.step()
    h.step(skip=frozenset({"c00003"}))
    assert h.by_cluster()["c00003"].message == "skipped by unknown: no reason given"
    h.requested_by, h.reason = "bob", "flaky"
    h.step(skip=frozenset({"c00002"}))
    assert h.by_cluster()["c00002"].message == "skipped by bob: flaky"


@pytest.mark.parametrize("how", ["spec", "annotation"])
def test_a_skipped_stage_never_starts_and_the_run_moves_on(how: str) -> None:
    stages = _three_stages(early={"approval": "Manual"})
    extra: dict[str, Any] = {"strategy": {"maxConcurrency": 2}}
    if how == "spec":
        extra["skip"] = {"stages": ["early"], "reason": "bad batch", "requestedBy": "carol"}
    h = _staged(12, 10, stages, **extra)
    if how == "annotation":
        h.skip_stages, h.requested_by, h.reason = frozenset({"early"}), "carol", "bad batch"
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    early = {c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "early"}
    assert not early & h.touched()
    assert h.stage("early").phase == api.StagePhase.SKIPPED
    assert h.stage("early").health is None  # its checks are never evaluated
    for cid in early:
        st = h.by_cluster()[cid]
        assert (st.phase, st.reason) == (U.SKIPPED, "StageSkipped")
        assert st.message == "skipped by carol: bad batch (stage early)"
    main = {c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "main"}
    assert all(h.phases()[c] == U.UPGRADED for c in main)


def test_skipping_a_stage_mid_way_lets_members_in_flight_finish() -> None:
    h = _staged(12, 9, _three_stages(), strategy={"maxConcurrency": 2})
    early = sorted(c for c, o in h.fleet.clusters.items() if o.labels["stage"] == "early")
    assert h.run(until=lambda x: any(x.phases()[c] in (U.UPGRADING_CONTROL_PLANE,) for c in early))
    in_flight = {c for c in early if h.phases()[c] not in (U.PENDING, U.UPGRADED)}
    assert in_flight
    h.skip_stages = frozenset({"early"})
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    for cid in early:
        want = U.UPGRADED if cid in in_flight or h.phases()[cid] == U.UPGRADED else U.SKIPPED
        assert h.phases()[cid] == want, cid
    assert all(h.fleet.clusters[c].in_service for c in h.fleet.clusters)
    assert h.fleet.min_available_in_service >= 9


# -- retries ----------------------------------------------------------------------------------


def test_spec_retry_round_retries_once_per_round_and_reaches_upgraded() -> None:
    fleet = make_fleet(3)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    h.spec = h.spec.model_copy(
        update={"retry": api.RetrySpec(clusters=["c00000"], round=1, requested_by="dave")}
    )
    # The fault is still there: the round's attempt fails too, and re-applying the same
    # round (GitOps re-sync) does not retry again.
    assert h.run()
    st = h.by_cluster()["c00000"]
    assert st.phase == U.FAILED and st.attempt == 1 and st.retry_round == 1
    h.step()
    h.step()
    assert h.by_cluster()["c00000"].attempt == 1
    fleet.fail.clear()
    h.spec = h.spec.model_copy(
        update={"retry": api.RetrySpec(clusters=["c00000"], round=2, requested_by="dave")}
    )
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    st = h.by_cluster()["c00000"]
    assert (st.phase, st.attempt, st.retry_round) == (U.UPGRADED, 2, 2)
    # The pinned targets were kept.
    assert fleet.clusters["c00000"].control_plane_version == NEW


def test_a_retry_brings_back_a_cluster_a_person_skipped() -> None:
    fleet = make_fleet(3)
    h = harness(spec_for(fleet, NEW, required=2, maxConcurrency=1), fleet)
    h.step(skip=frozenset({"c00002"}))
    assert h.phases()["c00002"] == U.SKIPPED
    h.step(retry=frozenset({"c00002"}))
    assert h.phases()["c00002"] == U.PENDING
    assert "retry requested by unknown" in (h.by_cluster()["c00002"].message or "")
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert h.steps_of("c00002") == LIFECYCLE


def test_a_cluster_both_skipped_and_retried_is_a_spec_error_naming_both_fields() -> None:
    fleet = make_fleet(3)
    cv = spec_for(
        fleet,
        NEW,
        required=1,
        maxFailures="x%",
        notBefore="tomorrow",
        _skip={"clusters": ["c00001"]},
        _retry={"clusters": ["c00001"], "round": 1},
    )
    problems = {p.field: p.message for p in validate_spec(cv)}
    assert "spec.skip.clusters" in problems["spec.retry.clusters"]
    assert "c00001" in problems["spec.retry.clusters"]
    assert "spec.strategy.maxFailures" in problems
    assert "RFC 3339" in problems["spec.strategy.notBefore"]


# -- stop and resume, scheduled start --------------------------------------------------------


def test_stop_mid_stage_keeps_the_floor_and_resume_finishes() -> None:
    fleet = make_fleet(10)
    h = harness(spec_for(fleet, NEW, required=7), fleet)
    assert h.run(until=lambda x: len(x.touched()) >= 3 and any(x.held[-1:]))
    h.spec = h.spec.model_copy(update={"state": api.RunState.STOP})
    assert h.run()
    assert h.phase == api.RunPhase.STOPPED
    assert h.last is not None and h.last.decision.waiting_reason == "Stopped"
    assert all(c.in_service for c in fleet.clusters.values())
    assert fleet.min_available_in_service >= 7
    h.spec = h.spec.model_copy(update={"state": api.RunState.RUN})
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert fleet.min_available_in_service >= 7


def test_not_before_holds_every_cluster_until_the_scheduled_start() -> None:
    fleet = make_fleet(4)
    start = T0 + timedelta(hours=2)
    h = harness(
        spec_for(fleet, NEW, required=2, notBefore=format_time(start), maxConcurrency=1), fleet
    )
    h.step()
    d = h.last.decision if h.last else None
    assert d is not None and d.calls == [] and d.preflight_needed == []
    assert d.waiting_reason == "NotBefore" and d.next_start_time == format_time(start)
    assert d.requeue_after == pytest.approx(7200.0)
    st = h.by_cluster()["c00000"]
    assert (st.phase, st.reason) == (U.PENDING, "NotBefore")
    assert format_time(start) in (st.message or "")
    assert h.run(until=lambda x: bool(x.touched()))
    waiting = [s for s in h.by_cluster().values() if s.phase == U.PENDING]
    assert waiting and all(s.reason != "NotBefore" for s in waiting)  # no stale wait shown
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert min(fleet.started_at) >= 7200.0


def test_not_before_in_the_past_does_not_wait() -> None:
    fleet = make_fleet(2)
    cv = spec_for(fleet, NEW, required=1, notBefore="2020-01-01T00:00:00+01:00")
    h = harness(cv, fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert h.last is not None and h.last.decision.next_start_time is None


def test_paused_says_so() -> None:
    fleet = make_fleet(2)
    h = harness(spec_for(fleet, NEW, required=1, paused=True), fleet)
    h.step()
    assert h.last is not None and h.last.decision.waiting_reason == "Paused"
    assert h.last.decision.calls == [] and not h.touched()


# -- maintenance windows ---------------------------------------------------------------------


def test_a_closed_window_holds_clusters_until_it_opens_and_they_start_inside_it() -> None:
    fleet = make_fleet(3)
    # T0 is 2026-01-01T00:00Z: the window opens at 01:00 UTC for 2 h; an upgrade takes 30 min.
    maintenance = {
        "windows": [{"start": "01:00", "duration": "2h", "timeZone": "UTC"}],
        "expectedDuration": "30m",
    }
    h = harness(spec_for(fleet, NEW, required=2, maintenance=maintenance), fleet)
    h.step()
    d = h.last.decision if h.last else None
    assert d is not None and d.calls == [] and d.preflight_needed == []
    assert d.waiting_reason == "MaintenanceWindow"
    assert d.next_start_time == "2026-01-01T01:00:00Z"
    st = h.by_cluster()["c00000"]
    assert (st.phase, st.reason) == (U.PENDING, "MaintenanceWindow")
    assert "2026-01-01T01:00:00Z" in (st.message or "")
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    outs = [
        at
        for (_, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT
    ]
    assert len(outs) == 3 and all(3600.0 <= at <= 3600.0 + 90 * 60 for at in outs), outs


def test_a_stage_window_overrides_the_run_window() -> None:
    always = {"windows": [{"start": "00:00", "duration": "24h"}], "expectedDuration": "1m"}
    later = {"windows": [{"start": "05:00", "duration": "1h"}], "expectedDuration": "1m"}
    h = _staged(
        6,
        4,
        _three_stages(early={"maintenance": later}),
        strategy={"maintenance": always, "maxConcurrency": 2},
    )
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    by_stage = {c: o.labels["stage"] for c, o in h.fleet.clusters.items()}
    outs = [
        (by_stage[cid], at)
        for (cid, kind, _, _), at in zip(h.fleet.started_steps, h.fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT
    ]
    assert all(at < 5 * 3600 for s, at in outs if s == "canary")
    assert all(5 * 3600 <= at < 6 * 3600 for s, at in outs if s == "early")


def test_clusters_whose_provider_window_is_open_go_first() -> None:
    fleet = make_fleet(3)
    # c00000 and c00001 report a provider window opening at 10:00; c00002 one open now.
    late = WindowObs("window", "late", T0 + timedelta(hours=10), T0 + timedelta(hours=12))
    now = WindowObs("window", "now", T0, T0 + timedelta(hours=2))
    for cid, w in (("c00000", late), ("c00001", late), ("c00002", now)):
        fleet.clusters[cid] = replace(fleet.clusters[cid], maintenance_windows=(w,))
    maintenance = {"providerWindows": "Windows", "expectedDuration": "10m"}
    h = harness(spec_for(fleet, NEW, required=2, maintenance=maintenance), fleet)
    h.step()
    assert h.last is not None
    assert h.last.decision.preflight_needed == ["c00002"] or [
        c.cluster_id for c in h.last.decision.calls
    ] == ["c00002"]
    assert h.by_cluster()["c00000"].reason == "MaintenanceWindow"
    assert h.run()
    first = [cid for (cid, kind, _, _) in fleet.started_steps if kind is OpKind.SERVICE_OUT]
    assert first[0] == "c00002"
    late_outs = [
        at
        for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT and cid != "c00002"
    ]
    assert late_outs and all(at >= 10 * 3600 for at in late_outs)
