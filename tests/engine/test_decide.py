"""Single decisions of the pure engine: the health gate, admission under the floor (also across
runs), re-issued service-outs, preflight refusals, invalid specs and size at 10,000 clusters."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from orchestrator import api
from orchestrator.engine.decide import (
    ACTIVE,
    KEEP_WATCH_SECONDS,
    RECOVER_STEP,
    Call,
    Decision,
    Floor,
    Preflight,
    RunInput,
    Verdict,
    call_failed,
    decide,
    request_id,
    rests,
    retry_waits,
    with_status,
)
from orchestrator.engine.initialize import pin_upgrades
from orchestrator.engine.observations import OpKind, OpObs, OpState, Snapshot
from orchestrator.engine.validate import validate_spec
from orchestrator.pipeline.simulate import T0, simulate
from tests.engine.model import (
    U,
    as_run_spec,
    decide_once,
    health_checks,
    make_fleet,
    pinned,
    spec_for,
    status_after,
)

NEW = "1.29.1"
UID = "uid-1"


_pinned, _decide, _status = pinned, decide_once, status_after


def _out(d: Decision) -> list[str]:
    return sorted(c.cluster_id for c in d.calls if c.kind is OpKind.SERVICE_OUT)


# -- the health gate before service-in -----------------------------------------------------------


def _verifying(
    health: api.HealthState, seconds: float
) -> tuple[Decision, api.ClusterUpgradeStatus]:
    """c00000 upgraded and out of service, verifying since T0, with the given health."""
    fleet = make_fleet(3, version=NEW)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    spec = spec_for(fleet, NEW, required=1, _healthChecks=health_checks("10s", 2, 2, "5m"))
    verifying = api.ClusterUpgradeStatus(
        phase=U.VERIFYING, step="verify", step_start_time="2026-01-01T00:00:00Z", health=health
    )
    d, by_id = _decide(fleet, spec, {"c00000": verifying}, seconds)
    return d, _status(d, by_id, "c00000")


def test_the_gate_waits_for_success_threshold_passes() -> None:
    one = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=1, last_check_time="2026-01-01T00:00:00Z"
    )
    d, st = _verifying(one, 3)
    assert d.calls == []
    assert st.phase == U.VERIFYING and "1/2 passes" in (st.message or "")
    assert d.requeue_after == 7  # the next evaluation is due 10 s after the last
    two = one.model_copy(update={"passes": 2})
    d, st = _verifying(two, 10)
    assert [(c.kind, c.cluster_id) for c in d.calls] == [(OpKind.SERVICE_IN, "c00000")]
    assert st.phase == U.SERVICING_IN


def test_a_service_in_asked_again_passes_the_gate_again() -> None:
    """Invariant 3 on re-issue (simulation seeds 25351, 26309): a service-in on record whose
    call has not taken effect is asked again only while its health still has successThreshold
    passes in a row; once a failing evaluation came after them (the driver folds in one of its
    own that no write kept), the cluster verifies again and nothing is called."""
    fleet = make_fleet(3, version=NEW)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    spec = spec_for(fleet, NEW, required=1, _healthChecks=health_checks("10s", 2, 2, "5m"))
    rid = request_id(UID, "c00000", OpKind.SERVICE_IN.value, NEW, 0)
    passed = api.HealthState(since="2026-01-01T00:00:00Z", passes=2)
    asked = api.ClusterUpgradeStatus(
        phase=U.SERVICING_IN,
        step=OpKind.SERVICE_IN.value,
        request_id=rid,
        step_start_time="2026-01-01T00:00:30Z",
        health=passed,
    )
    d, _ = _decide(fleet, spec, {"c00000": asked}, 40)
    assert [(c.kind, c.request_id) for c in d.calls] == [(OpKind.SERVICE_IN, rid)]
    reset = asked.model_copy(update={"health": passed.model_copy(update={"passes": 0})})
    d, by_id = _decide(fleet, spec, {"c00000": reset}, 40)
    assert d.calls == []
    st = _status(d, by_id, "c00000")
    assert st.phase == U.VERIFYING and st.request_id is None and st.health == reset.health


def test_the_gate_fails_at_failure_threshold_and_on_timeout() -> None:
    bad = api.HealthState(
        since="2026-01-01T00:00:00Z",
        failures=2,
        last_check_time="2026-01-01T00:00:00Z",
        results=[
            api.CheckResult(name="ok", passed=False, value=0.0, message="value 0 outside [1, ∞]")
        ],
    )
    d, st = _verifying(bad, 1)
    assert d.calls == []
    assert st.phase == U.FAILED and st.reason == "HealthCheckFailed"
    assert "value 0 outside [1, ∞]" in (st.message or "")
    assert d.phase == api.RunPhase.HALTED
    assert ("c00000", "Failed") in [(c, p) for c, p, _, warning in d.events if warning]
    slow = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=1, last_check_time="2026-01-01T00:04:59Z"
    )
    d, st = _verifying(slow, 301)
    assert d.calls == []
    assert st.phase == U.FAILED and "within 5m" in (st.message or "")


@pytest.mark.parametrize("away", ["gone", "unreachable"])
def test_a_verifying_cluster_out_of_sight_starts_its_checks_again_when_seen(away: str) -> None:
    """Invariant 7 (simulation seed 92214): a Verifying cluster that left the inventory, or
    whose provider did not answer, for longer than the checks' timeout and came back within
    the step's bound was failed HealthCheckFailed on the window its absence spent. While it
    cannot be seen its health is dropped, as while it is unavailable, and counts anew."""
    fleet = make_fleet(3, version=NEW)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    spec = spec_for(fleet, NEW, required=1, _healthChecks=health_checks("10s", 2, 2, "5m"))
    one = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=1, last_check_time="2026-01-01T00:00:00Z"
    )
    verifying = api.ClusterUpgradeStatus(
        phase=U.VERIFYING, step="verify", step_start_time="2026-01-01T00:00:00Z", health=one
    )
    seen = {k: v for k, v in fleet.clusters.items() if k != "c00000"}
    unknown = {"c00000": "plugin down"} if away == "unreachable" else {}
    d, by_id = _decide(
        fleet, spec, {"c00000": verifying}, 60, snapshot=Snapshot(seen, unknown=unknown)
    )
    st = _status(d, by_id, "c00000")
    assert d.calls == [] and st.phase == U.VERIFYING and st.health is None, st
    # Back after the checks' 5m window, within the step's bound (timeouts.ready, 30m).
    d, by_id = _decide(fleet, spec, {"c00000": st}, 400)
    st = _status(d, by_id, "c00000")
    assert d.calls == [] and st.phase == U.VERIFYING, st
    assert st.health is not None and st.health.since == "2026-01-01T00:06:40Z", st.health


def test_a_cluster_not_ready_is_never_serviced_in_and_times_out() -> None:
    fleet = make_fleet(3, version=NEW)
    c0 = fleet.clusters["c00000"]
    fleet.clusters["c00000"] = replace(
        c0, in_service=False, available=False, unavailable_reason="apiserver down"
    )
    spec = spec_for(fleet, NEW, required=1)
    verifying = api.ClusterUpgradeStatus(
        phase=U.VERIFYING, step="verify", step_start_time="2026-01-01T00:00:00Z"
    )
    d, by_id = _decide(fleet, spec, {"c00000": verifying}, 60)
    st = _status(d, by_id, "c00000")
    assert d.calls == [] and st.phase == U.VERIFYING
    assert "apiserver down" in (st.message or "")
    d, by_id = _decide(fleet, spec, {"c00000": verifying}, 30 * 60 + 1)
    st = _status(d, by_id, "c00000")
    assert d.calls == [] and st.phase == U.FAILED and st.reason == "NotReady"


# -- admission and the floor ---------------------------------------------------------------------


def test_admission_takes_exactly_the_budget() -> None:
    fleet = make_fleet(10)
    d, _ = _decide(fleet, spec_for(fleet, NEW, required=7))
    assert _out(d) == ["c00000", "c00001", "c00002"]


def test_unavailable_and_out_of_service_clusters_count_as_down() -> None:
    fleet = make_fleet(6)
    fleet.clusters["c00004"] = replace(fleet.clusters["c00004"], available=False)
    fleet.clusters["c00005"] = replace(fleet.clusters["c00005"], in_service=False)
    d, by_id = _decide(fleet, spec_for(fleet, NEW, required=3))
    assert _out(d) == ["c00000"]  # 4 up and in service, 3 required
    assert _status(d, by_id, "c00005").phase == U.PENDING
    # at the floor already: nothing at all
    d, _ = _decide(fleet, spec_for(fleet, NEW, required=4))
    assert d.calls == [] and "availability budget" in d.message


def test_a_foreign_operation_in_flight_counts_as_down_and_is_not_joined() -> None:
    fleet = make_fleet(4)
    foreign = OpObs("op-x", OpKind.CONTROL_PLANE, "c00000", OpState.RUNNING, "someone-else:1")
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], current_operation=foreign)
    d, by_id = _decide(fleet, spec_for(fleet, NEW, required=2))
    assert _out(d) == ["c00001"]  # 3 free, 2 required
    st = _status(d, by_id, "c00000")
    assert (
        st.phase == U.PENDING and st.reason == "ForeignOperation" and "op-x" in (st.message or "")
    )


def test_a_cluster_held_by_another_run_waits_naming_the_holder() -> None:
    fleet = make_fleet(4)
    d, by_id = _decide(fleet, spec_for(fleet, NEW, required=1), held_by={"c00000": "other/run-a"})
    assert _out(d) == ["c00001", "c00002"]  # the held one is down: 3 free, 1 required
    st = _status(d, by_id, "c00000")
    assert st.phase == U.PENDING and st.reason == "HeldByAnotherRun"
    assert "other/run-a" in (st.message or "")


def test_a_run_that_waits_only_for_the_world_names_what_it_waits_for() -> None:
    """Invariant 4 (simulation seed 63809): every member done but one a person took out of
    service; nothing moves until it returns. The run says which cluster and why (message and
    waitingReason), not only how many are upgraded; while something is in flight it counts."""
    fleet = make_fleet(4, version=NEW)
    old = make_fleet(1).clusters["c00000"]
    fleet.clusters["c00002"] = replace(old, id="c00002", in_service=False)
    d, by_id = _decide(fleet, spec_for(fleet, NEW, required=1))
    assert d.calls == [] and _status(d, by_id, "c00002").reason == "OutOfService"
    assert d.phase == api.RunPhase.PROGRESSING
    assert d.waiting_reason == "OutOfService"
    assert d.message.startswith("waiting: c00002: out of service outside this run"), d.message
    # Two held elsewhere: the first named, the rest counted.
    foreign = OpObs("op-x", OpKind.CONTROL_PLANE, "c00003", OpState.RUNNING, "someone-else:1")
    fleet.clusters["c00003"] = replace(old, id="c00003", current_operation=foreign)
    fleet.clusters["c00001"] = replace(old, id="c00001")
    d, by_id = _decide(fleet, spec_for(fleet, NEW, required=1), held_by={"c00001": "ns/other"})
    assert d.calls == [] and d.waiting_reason == "HeldByAnotherRun"
    assert d.message.startswith("waiting: c00001: held by UpdateRun ns/other"), d.message
    assert d.message.endswith("(and 2 more)"), d.message
    # One of them free again: it is taken out, the run counts what is in flight.
    d, _ = _decide(fleet, spec_for(fleet, NEW, required=1))
    assert _out(d) == ["c00001"]
    assert d.waiting_reason is None and "1 in flight" in d.message, d.message


def test_a_run_kept_going_only_by_a_recovery_says_so() -> None:
    """Invariant 4 (simulation seeds 60927, 60970): every stage complete, one failed cluster
    on its way back in (failedClusterPolicy ServiceInIfHealthy) and not ready yet: the run is
    Progressing because of it and names it, not only a count."""
    fleet = make_fleet(3, version=NEW)
    old = make_fleet(1).clusters["c00000"]
    fleet.clusters["c00001"] = replace(old, id="c00001", in_service=False, available=False)
    spec = spec_for(fleet, NEW, required=1, maxFailures=1, failedClusterPolicy="ServiceInIfHealthy")
    failed = api.ClusterUpgradeStatus(
        phase=U.FAILED,
        reason="OperationFailed",
        message="nodePool failed",
        step=RECOVER_STEP,
        step_start_time="2026-01-01T00:00:00Z",
    )
    d, by_id = _decide(fleet, spec, {"c00001": failed}, seconds=30)
    assert d.calls == [] and _status(d, by_id, "c00001").step == RECOVER_STEP
    assert d.phase == api.RunPhase.PROGRESSING
    assert d.waiting_reason == "Recovering"
    assert d.message.startswith("waiting: c00001 failed and is serviced back in"), d.message


def test_the_floor_of_another_run_sharing_clusters_holds_too() -> None:
    fleet = make_fleet(6)
    mine = spec_for(fleet, NEW, required=1).model_copy(
        update={"clusters": [api.ClusterSpec(id=f"c{i:05d}", version=NEW) for i in range(4)]}
    )
    other = Floor("other/run-b", frozenset(f"c{i:05d}" for i in range(2, 6)), required=3)
    d, _ = _decide(fleet, mine, floors=[other])
    # Own budget 3; the other run (4 members, 3 required) lets one of c00002/c00003 go.
    assert _out(d) == ["c00000", "c00001", "c00002"]


def _unconfirmed_service_out(cid: str) -> tuple[str, api.ClusterUpgradeStatus]:
    """A service-out on record whose call has not taken effect (no operation seen)."""
    rid = request_id(UID, cid, OpKind.SERVICE_OUT.value, NEW, 0)
    return rid, api.ClusterUpgradeStatus(
        phase=U.SERVICING_OUT,
        step=OpKind.SERVICE_OUT.value,
        request_id=rid,
        step_start_time="2026-01-01T00:00:00Z",
    )


def test_a_reissued_service_out_passes_the_budget_again() -> None:
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=2)
    rid, unconfirmed = _unconfirmed_service_out("c00000")
    d, by_id = _decide(fleet, spec, {"c00000": unconfirmed}, 5)
    assert [(c.kind, c.request_id, c.reissue) for c in d.calls if c.cluster_id == "c00000"] == [
        (OpKind.SERVICE_OUT, rid, True)
    ]
    # Meanwhile two others went down: taking c00000 out now would break the floor.
    for cid in ("c00002", "c00003"):
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False)
    d, by_id = _decide(fleet, spec, {"c00000": unconfirmed}, 5)
    assert d.calls == []
    st = _status(d, by_id, "c00000")
    assert st.phase == U.PENDING and st.reason == "WaitingForBudget"


def test_a_reissued_service_out_asks_the_provider_again_once_its_verdict_is_stale() -> None:
    """Invariant 5 on re-issue (simulation seed 9225): admitted with an ACCEPTED verdict, the
    service-out did not take effect; a minute later someone upgraded the control plane past the
    target, so the provider now refuses. The re-issue asks again and drains nothing."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=2)
    rid, unconfirmed = _unconfirmed_service_out("c00000")
    at_admission = {"c00000": Preflight(Verdict.ACCEPTED, T0)}
    # Fresh: the re-issue goes out.
    d, _ = _decide(
        fleet, spec, {"c00000": unconfirmed}, 30, preflight_supported=True, preflight=at_admission
    )
    assert [c.request_id for c in d.calls if c.cluster_id == "c00000"] == [rid]
    # Stale: nothing goes out for c00000 before the provider is asked again.
    d, _ = _decide(
        fleet, spec, {"c00000": unconfirmed}, 90, preflight_supported=True, preflight=at_admission
    )
    assert "c00000" in d.preflight_needed
    assert [c for c in d.calls if c.cluster_id == "c00000"] == []
    # The fresh answer refuses: recorded, and still nothing is drained.
    refused = Preflight(
        Verdict.REFUSED_NEVER, T0 + timedelta(seconds=90), "DOWNGRADE", "control plane is past"
    )
    d, by_id = _decide(
        fleet,
        spec,
        {"c00000": unconfirmed},
        90,
        preflight_supported=True,
        preflight={"c00000": refused},
    )
    assert [c for c in d.calls if c.cluster_id == "c00000"] == []
    st = _status(d, by_id, "c00000")
    assert st.phase == U.BLOCKED and st.reason == "Refused" and st.step is None
    assert "control plane is past" in (st.message or "")


def _failed_service_out(state: OpState) -> tuple[api.ClusterUpgradeStatus, Snapshot]:
    """c00000 Failed at its service-out (timed out), its operation in the given state."""
    fleet = make_fleet(4)
    rid, unconfirmed = _unconfirmed_service_out("c00000")
    failed = unconfirmed.model_copy(
        update={
            "phase": U.FAILED,
            "operation_id": "op-1",
            "reason": "OperationFailed",
            "message": "serviceOut failed: INTERNAL: injected",
            "end_time": "2026-01-01T00:00:10Z",
        }
    )
    op = OpObs("op-1", OpKind.SERVICE_OUT, "c00000", state, rid)
    return failed, Snapshot(fleet.clusters, {rid: op})


def test_a_retry_never_adopts_a_cluster_another_run_took_out_after_its_own_attempt_let_go() -> None:
    """Invariant 4 across runs (simulation seed 18657). Run A's service-out of c00000 failed and
    the cluster stayed in service; later run B took it out, failed it at a node pool and kept it
    out (not an active holder). A retry in A must not adopt B's cluster: once A sees the cluster
    in service with nothing of its own in flight, its failed attempt keeps nothing out."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1)
    failed, snap = _failed_service_out(OpState.FAILED)
    d, by_id = _decide(fleet, spec, {"c00000": failed}, 20, snapshot=snap)
    let_go = _status(d, by_id, "c00000")
    assert let_go.phase == U.FAILED and let_go.reason == "OperationFailed"
    assert let_go.step is None and let_go.request_id is None
    assert let_go.message == failed.message and let_go.end_time == failed.end_time
    # B takes it out and keeps it out; then a person retries c00000 in A.
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    d, by_id = _decide(fleet, spec, {"c00000": let_go}, 600, retry_clusters=frozenset({"c00000"}))
    st = _status(d, by_id, "c00000")
    assert st.phase == U.PENDING and st.attempt == 1 and st.step is None
    assert [c for c in d.calls if c.cluster_id == "c00000"] == []
    # Without the release, the same retry would carry B's cluster on as A's.
    d, by_id = _decide(fleet, spec, {"c00000": failed}, 600, retry_clusters=frozenset({"c00000"}))
    assert [c.kind for c in d.calls if c.cluster_id == "c00000"] == [OpKind.CONTROL_PLANE]


def test_a_failed_attempt_with_its_service_out_still_in_flight_keeps_the_cluster() -> None:
    """A service-out that timed out may still take effect: while it runs the attempt keeps
    its step (a retry carries the cluster on), even though the cluster is still in service."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1)
    failed, snap = _failed_service_out(OpState.RUNNING)
    failed = failed.model_copy(update={"reason": "StepTimedOut"})
    d, by_id = _decide(fleet, spec, {"c00000": failed}, 20, snapshot=snap)
    assert _status(d, by_id, "c00000").step == OpKind.SERVICE_OUT.value


def test_a_finished_run_that_keeps_a_cluster_looks_again_until_it_lets_it_go() -> None:
    """Simulation seed 104873. A stopped run's failed service-out may still act: the run keeps
    the cluster (holding it against every other run, crossrun.holding_of), so it must look
    again until it sees the cluster in service with nothing of its own in flight, and let it
    go. A stopped run that rested with the step kept held the cluster for ever, and its
    retry, applied when it was deleted, adopted the cluster another run had taken out since."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1)
    stopped = as_run_spec(spec).model_copy(update={"state": api.RunState.STOP})
    failed, snap = _failed_service_out(OpState.RUNNING)
    by_id = _pinned(fleet, spec)
    by_id["c00000"] = with_status(
        by_id["c00000"], failed.model_copy(update={"reason": "StepTimedOut"})
    )

    def once(snapshot: Snapshot) -> Decision:
        upgrades = {u.name: u for u in by_id.values()}
        at = T0 + timedelta(seconds=20)
        inp = RunInput("ns/run", UID, stopped, upgrades, snapshot, at, preflight_supported=False)
        return decide(inp)

    d = once(snap)  # its service-out still runs
    assert d.phase == api.RunPhase.STOPPED and d.keeping == 1
    assert not rests(d.phase, d.keeping)
    assert d.requeue_after is not None and d.requeue_after <= KEEP_WATCH_SECONDS
    d = once(Snapshot(snap.clusters, {}))  # it ended (forgotten) with the cluster in service
    assert d.keeping == 0 and rests(d.phase, d.keeping)
    assert _status(d, by_id, "c00000").step is None


def test_a_failed_cluster_someone_serviced_back_in_is_no_longer_kept_out() -> None:
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1)
    kept_out = api.ClusterUpgradeStatus(
        phase=U.FAILED, step="nodePool/pool-0", reason="OperationFailed", message="pool failed"
    )
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    d, by_id = _decide(fleet, spec, {"c00000": kept_out}, 20)
    assert "c00000" not in d.changed or _status(d, by_id, "c00000").step == kept_out.step
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=True)
    d, by_id = _decide(fleet, spec, {"c00000": kept_out}, 20)
    st = _status(d, by_id, "c00000")
    assert st.phase == U.FAILED and st.step is None and st.message == "pool failed"


def test_a_person_skipping_a_failed_cluster_keeps_when_its_attempt_ended() -> None:
    """endTime is when the attempt's work ended (simulation seeds 4585, 12521: a skip after the
    stage was verified moved it, and the stage looked completed without checks since)."""
    fleet = make_fleet(3)
    spec = spec_for(fleet, NEW, required=1)
    failed = api.ClusterUpgradeStatus(
        phase=U.FAILED,
        reason="OperationFailed",
        end_time="2026-01-01T00:00:10Z",
        last_transition_time="2026-01-01T00:00:10Z",
    )
    d, by_id = _decide(fleet, spec, {"c00000": failed}, 300, skip_clusters=frozenset({"c00000"}))
    st = _status(d, by_id, "c00000")
    assert st.phase == U.SKIPPED and st.reason == "SkippedByUser"
    assert st.end_time == "2026-01-01T00:00:10Z"
    assert st.last_transition_time != st.end_time  # the skip itself is when it was recorded


def test_a_stage_verdict_older_than_a_members_end_is_not_reused() -> None:
    """Invariant 3: a canary member ended after the stage's passing analysis began (it was
    retried, and the stage's reopening never reached the run's status): the stage verifies
    anew instead of completing on the old verdict, and the next stage waits."""
    fleet = make_fleet(6, version=NEW, staged=True)
    stages = [
        {"name": n, "selector": {"matchLabels": {"stage": n}}} for n in ("canary", "early", "main")
    ]
    spec = spec_for(fleet, NEW, required=1).model_copy(
        update={
            "strategy": api.Strategy.model_validate({"stages": stages}),
            "health_checks": api.HealthChecks.model_validate(health_checks(success=2)),
        }
    )
    for cid in ("c00001", "c00002", "c00004", "c00005"):  # early and main still to do
        fleet.clusters[cid] = replace(fleet.clusters[cid], control_plane_version="1.28.5")
    canary = {
        "c00000": api.ClusterUpgradeStatus(
            phase=U.UPGRADED, attempt=1, end_time="2026-01-01T00:05:00Z"
        ),
        "c00003": api.ClusterUpgradeStatus(phase=U.UPGRADED, end_time="2026-01-01T00:01:00Z"),
    }
    passed = api.HealthState(since="2026-01-01T00:02:00Z", passes=2)
    old = [
        api.StageStatus(
            name="canary", phase=api.StagePhase.COMPLETED, total=2, upgraded=2, health=passed
        ),
        api.StageStatus(name="early", phase=api.StagePhase.PENDING, total=2, upgraded=0),
        api.StageStatus(name="main", phase=api.StagePhase.PENDING, total=2, upgraded=0),
    ]
    d, _ = _decide(fleet, spec, canary, 310, stages=old)
    assert [s.phase for s in d.stages][:2] == [api.StagePhase.VERIFYING, api.StagePhase.PENDING]
    assert d.stages[0].health is not None and d.stages[0].health.passes == 0
    assert _out(d) == []
    # The same verdict, begun after every member ended, stands.
    begun_after = passed.model_copy(update={"since": "2026-01-01T00:05:00Z"})
    d, _ = _decide(
        fleet,
        spec,
        canary,
        310,
        stages=[old[0].model_copy(update={"health": begun_after}), *old[1:]],
    )
    assert d.stages[0].phase == api.StagePhase.COMPLETED
    assert _out(d)


def test_a_verdict_asked_for_another_target_is_asked_again() -> None:
    """Simulation seeds 12831, 13378: a preflight cache shared by runs with different targets
    lent one run another's ACCEPTED verdict; a verdict answers the version it was asked for."""
    fleet = make_fleet(3)
    other = Preflight(Verdict.ACCEPTED, T0, version="1.30.1")
    mine = Preflight(Verdict.ACCEPTED, T0, version=NEW)
    d, _ = _decide(
        fleet,
        spec_for(fleet, NEW, required=1),
        preflight_supported=True,
        preflight={"c00000": other, "c00001": mine},
    )
    assert _out(d) == ["c00001"]
    assert d.preflight_needed == ["c00000"]  # (the budget of 2 is spent on these two)


def test_a_refused_service_in_of_a_failed_cluster_keeps_when_its_attempt_ended() -> None:
    """failedClusterPolicy services a failed cluster back in; when the plugin refuses that
    service-in, the cluster stays Failed and its attempt still ended when it failed (seed
    14569: the moved end made a verified stage look unverified)."""
    failed = api.ClusterUpgradeStatus(
        phase=U.FAILED, reason="OperationFailed", end_time="2026-01-01T00:06:56Z"
    )
    call = Call(OpKind.SERVICE_IN, "c00000", "rid", "run-c0", reissue=False)
    new, wait = call_failed(
        failed, call, "FAILED_PRECONDITION", False, "refused", T0 + timedelta(seconds=426)
    )
    assert wait is None
    assert new.phase == U.FAILED and new.reason == "Refused"
    assert new.end_time == "2026-01-01T00:06:56Z"
    # A cluster in flight whose call is refused ends now.
    flying = api.ClusterUpgradeStatus(phase=U.SERVICING_IN)
    new, _ = call_failed(flying, call, "FAILED_PRECONDITION", False, "refused", T0)
    assert new.phase == U.FAILED and new.end_time is not None


def test_a_refused_preflight_blocks_before_anything_is_taken_out() -> None:
    fleet = make_fleet(3)
    refused = Preflight(Verdict.REFUSED_NEVER, T0, "SKIPS_MINOR", "1.28 to 1.30 skips a minor")
    d, by_id = _decide(
        fleet,
        spec_for(fleet, NEW, required=1),
        preflight_supported=True,
        preflight={"c00000": refused, "c00001": Preflight(Verdict.ACCEPTED, T0)},
    )
    assert _out(d) == ["c00001"]
    assert d.preflight_needed == ["c00002"]  # not asked yet: asked before anything happens
    st = _status(d, by_id, "c00000")
    assert (
        st.phase == U.BLOCKED and st.reason == "Refused" and "skips a minor" in (st.message or "")
    )


# -- invalid specs -------------------------------------------------------------------------------


def test_an_invalid_spec_pins_nothing_and_names_the_fields() -> None:
    fleet = make_fleet(3)
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 2,
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "clusters": [
                {"id": "c00000", "version": NEW},
                {"id": "nope", "version": NEW},
                {"id": "c00001", "version": "1.27.0"},
            ],
        }
    )
    problems = pin_upgrades("run", as_run_spec(spec), fleet.clusters)
    assert isinstance(problems, list)
    assert {p.field for p in problems} == {"spec.clusters[1].id", "spec.clusters[2].version"}
    assert any("downgrade" in p.message for p in problems)
    outcome = simulate(fleet, spec)
    assert outcome.problems and not fleet.started_steps
    # The floor is checked before the inventory is read.
    floor = spec.model_copy(update={"required_available_count": 3})
    problems = pin_upgrades("run", as_run_spec(floor), fleet.clusters)
    assert isinstance(problems, list)
    assert [p.field for p in problems] == ["spec.requiredAvailableCount"]


def test_bad_health_checks_are_an_invalid_spec() -> None:
    fleet = make_fleet(3)
    raw = spec_for(fleet, NEW, required=1).dump()
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
    assert {p.field for p in problems} == {
        "spec.healthChecks.checks[0].metric.query",
        "spec.healthChecks.checks[1].metric.thresholdRange",
        "spec.healthChecks.checks[2].metric.provider.type",
    }
    assert any("not valid PromQL" in p.message for p in problems)


# -- size ----------------------------------------------------------------------------------------


def test_every_object_stays_small_at_ten_thousand_clusters() -> None:
    fleet = make_fleet(10_000, staged=True)
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 8_000,
            "version": NEW,
            "opsEndpoint": {"endpoint": "plugin:9000"},
            "strategy": {"stages": [{"name": "all", "selector": {}}]},
        }
    )
    d, by_id = _decide(fleet, spec)
    assert len(_out(d)) == 2_000  # the whole budget in flight at once
    assert len(d.changed) == 2_000
    run = api.UpdateRunStatus(
        phase=d.phase, message=d.message, counts=d.counts, stages=d.stages, current_stage="all"
    )
    assert len(json.dumps(run.dump())) <= 4 * 1024
    for u in by_id.values():
        st = d.changed.get(u.name, u.status)
        body = {"metadata": {"name": u.name}, "spec": u.spec.dump(), "status": st.dump()}
        assert len(json.dumps(body)) <= 2 * 1024
    assert d.counts == api.RunCounts(total=10_000, pending=8_000, in_flight=2_000)


def test_snapshot_operations_carry_a_step_forward() -> None:
    fleet = make_fleet(2)
    spec = spec_for(fleet, NEW, required=1)
    rid, unconfirmed = _unconfirmed_service_out("c00000")
    out = unconfirmed.model_copy(update={"operation_id": "op-1"})
    done = OpObs("op-1", OpKind.SERVICE_OUT, "c00000", OpState.SUCCEEDED, rid)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    by_id = _pinned(fleet, spec)
    inp = RunInput(
        key="ns/run",
        uid=UID,
        spec=as_run_spec(spec),
        upgrades={by_id["c00000"].name: with_status(by_id["c00000"], out)},
        snapshot=Snapshot(fleet.clusters, {rid: done}),
        now=T0 + timedelta(seconds=3),
        preflight_supported=False,
    )
    d = decide(inp)
    (call,) = d.calls
    assert call.kind is OpKind.CONTROL_PLANE and call.version == NEW
    assert call.request_id == request_id(UID, "c00000", OpKind.CONTROL_PLANE.value, NEW, 0)


def test_a_retry_of_a_failed_cluster_gone_from_the_inventory_keeps_it_and_carries_it_on() -> None:
    """Invariant 4 (simulation seed 577 of the sweep after the Lease change): a cluster failed
    at its control plane and kept out leaves the inventory; a person retries it; it returns, out
    of service. The retry kept no claim on it (step cleared, Pending), so the run waited for it
    as 'out of service outside this run' for ever. The retry now keeps the claim while the
    cluster is away, and carries it on when it returns."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1)
    kept_out = api.ClusterUpgradeStatus(
        phase=U.FAILED,
        step=OpKind.CONTROL_PLANE.value,
        reason="OperationFailed",
        message="controlPlane failed",
        end_time="2026-01-01T00:00:10Z",
    )
    away = fleet.clusters["c00000"]
    gone = fleet.snapshot()
    del gone.clusters["c00000"]
    d, by_id = _decide(
        fleet, spec, {"c00000": kept_out}, 60, retry_clusters=frozenset({"c00000"}), snapshot=gone
    )
    retried = _status(d, by_id, "c00000")
    # Away, it is not at rest: the retry waits with the claim kept (seed 40704, below).
    assert retried.phase == U.FAILED and retried.reason == "OperationFailed", retried
    assert retry_waits(retried), retried
    assert retried.step == OpKind.CONTROL_PLANE.value and d.calls == [], (retried, d.calls)
    # Back, still out of service (the failed attempt took it out): the run carries it on.
    fleet.clusters["c00000"] = replace(away, in_service=False)
    d, by_id = _decide(fleet, spec, {"c00000": retried}, 120)
    back = _status(d, by_id, "c00000")
    assert back.phase in ACTIVE and back.reason != "OutOfService", back


def test_a_retry_of_a_cluster_not_seen_waits_and_never_decides_a_service_out_no_gate_admitted() -> (
    None
):
    """The time invariant (simulation seed 40704): a service-out whose operation hung failed at
    its step timeout, the run halted, and its provider became unavailable. A person retried the
    cluster. The retry kept a claim on it as if the cluster were out of service: a new
    service-out's intent (a new request id) outside the maintenance window, through no gate
    and no floor, while the cluster was in service. A retry now begins only once its cluster is
    seen at rest: not while away, not while this run's operation still acts on it; then, in
    service, it is a fresh attempt that waits for the window like any other."""
    fleet = make_fleet(4)
    # T0 is 2026-01-01T00:00Z; the window opens at 01:00 UTC.
    window = {"windows": [{"start": "01:00", "duration": "1h", "timeZone": "UTC"}]}
    spec = spec_for(fleet, NEW, required=1, maintenance=window)
    rid = request_id(UID, "c00000", OpKind.SERVICE_OUT.value, NEW, 0)
    timed_out = api.ClusterUpgradeStatus(
        phase=U.FAILED,
        step=OpKind.SERVICE_OUT.value,
        request_id=rid,
        reason="StepTimedOut",
        message="serviceOut did not finish within 0:02:00",
        start_time="2026-01-01T00:00:00Z",
        end_time="2026-01-01T00:02:00Z",
    )
    hung = OpObs("op-1", OpKind.SERVICE_OUT, "c00000", OpState.RUNNING, rid)
    unseen = fleet.snapshot()
    del unseen.clusters["c00000"]
    d, by_id = _decide(
        fleet,
        spec,
        {"c00000": timed_out},
        600,
        retry_clusters=frozenset({"c00000"}),
        snapshot=unseen,
    )
    waiting = _status(d, by_id, "c00000")
    assert waiting.phase == U.FAILED and waiting.reason == "StepTimedOut", waiting
    assert retry_waits(waiting), waiting
    assert (waiting.step, waiting.request_id, waiting.attempt) == (timed_out.step, rid, 0)
    assert waiting.message is not None
    assert waiting.message.startswith("retry requested by "), waiting.message
    assert waiting.message.endswith("waits until the cluster is seen again"), waiting.message
    assert d.calls == []
    # Seen in service, the hung service-out still running: still waiting, nothing asked.
    in_flight = replace(fleet.clusters["c00000"], current_operation=hung)
    fleet.clusters["c00000"] = in_flight
    d, by_id = _decide(fleet, spec, {"c00000": waiting}, 660)
    still = _status(d, by_id, "c00000")
    assert still.phase == U.FAILED and retry_waits(still), still
    assert still.message is not None and still.message.endswith("this run's operation on it ends")
    assert d.calls == []
    # It failed; the cluster is in service and at rest: a fresh attempt, held by the window.
    ended = replace(hung, state=OpState.FAILED)
    fleet.clusters["c00000"] = replace(in_flight, current_operation=ended)
    d, by_id = _decide(fleet, spec, {"c00000": still}, 720)
    fresh = _status(d, by_id, "c00000")
    assert fresh.phase == U.PENDING and fresh.attempt == 1 and fresh.step is None, fresh
    assert fresh.message == waiting.message.split("; waits until ")[0], fresh.message
    assert d.calls == [] and d.waiting_reason == "MaintenanceWindow", (d.calls, d.waiting_reason)


def test_a_run_waiting_for_a_preflight_verdict_says_so() -> None:
    """Invariant 4 (simulation seed 7490): the driver asks the provider at once and decides
    again; when the ask fails, the run's status must say what it waits for, not only a count."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=1).model_copy(
        update={"strategy": api.Strategy.model_validate({"maxConcurrency": 1})}
    )
    d, _ = _decide(fleet, spec, preflight_supported=True)
    assert d.preflight_needed and not d.calls
    assert d.waiting_reason == "Preflight", (d.waiting_reason, d.message)
    assert "preflight verdict on c0000" in d.message, d.message


def test_a_preflight_accepted_with_a_notice_says_it_on_the_cluster_it_drains() -> None:
    """A provider that accepts with a notice (the GKE plugin's BLUE_GREEN_UPGRADE: how long the
    blue-green soak will take) is heard: the service-out step's message says it, where
    `kubectl get cu` and `status` show it; an accepted verdict without a reason says nothing."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=2, maxConcurrency=2)
    notice = Preflight(
        Verdict.ACCEPTED,
        T0,
        "BLUE_GREEN_UPGRADE",
        "pool pool-0 upgrades blue-green: expected soak 1h5m",
    )
    plain = Preflight(Verdict.ACCEPTED, T0)
    d, by_id = _decide(
        fleet,
        spec,
        {},
        1,
        preflight_supported=True,
        preflight={"c00000": notice, "c00001": plain},
    )
    assert sorted(c.cluster_id for c in d.calls if c.kind is OpKind.SERVICE_OUT) == [
        "c00000",
        "c00001",
    ]
    drained = _status(d, by_id, "c00000")
    assert drained.phase == U.SERVICING_OUT
    assert drained.message == (
        "preflight: BLUE_GREEN_UPGRADE: pool pool-0 upgrades blue-green: expected soak 1h5m"
    )
    assert _status(d, by_id, "c00001").message is None
