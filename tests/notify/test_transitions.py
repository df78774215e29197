"""orchestrator.engine.transitions: what a pass changed, from status pairs, each transition once."""

from __future__ import annotations

import itertools

from orchestrator import api
from orchestrator.engine.transitions import ClusterChange, Transition, event_name, transitions

E = api.NotificationEvent
S = api.StagePhase
R = api.RunPhase
U = api.UpgradePhase
UID = "0b9c-uid"


def stage(
    name: str, phase: S, done: int = 0, failed: int = 0, completed: str | None = None
) -> api.StageStatus:
    return api.StageStatus(
        name=name,
        phase=phase,
        total=2,
        upgraded=done,
        failed=failed,
        completion_time=completed,
    )


def run(
    phase: api.RunPhase | None,
    stages: list[api.StageStatus] | None = None,
    *,
    started: bool = True,
    progressing: tuple[bool, str] | None = None,
    message: str | None = None,
) -> api.UpdateRunStatus:
    conditions = None
    if progressing is not None:
        conditions = [
            api.Condition(
                type="Progressing",
                status="True" if progressing[0] else "False",
                reason="x",
                last_transition_time=progressing[1],
            )
        ]
    return api.UpdateRunStatus(
        phase=phase,
        stages=stages,
        start_time="2026-11-23T04:00:00Z" if started else None,
        conditions=conditions,
        message=message,
        counts=api.RunCounts(total=4),
    )


def cluster(
    cid: str, old: U, new: U, attempt: int = 0, message: str | None = None
) -> ClusterChange:
    return ClusterChange(
        f"run-{cid}",
        cid,
        "canary",
        api.ClusterUpgradeStatus(phase=old, attempt=attempt),
        api.ClusterUpgradeStatus(phase=new, attempt=attempt, message=message),
    )


def kinds(found: list[Transition]) -> list[str]:
    return [t.reason for t in found]


def test_a_whole_run_yields_each_transition_once_with_stable_ids() -> None:
    t0, t1, t2 = "2026-11-23T04:00:01Z", "2026-11-23T04:05:00Z", "2026-11-23T04:09:00Z"
    history = [
        api.UpdateRunStatus(),
        run(R.PROGRESSING, [stage("canary", S.PENDING), stage("rest", S.PENDING)]),
        run(
            R.PROGRESSING,
            [stage("canary", S.PROGRESSING), stage("rest", S.PENDING)],
            progressing=(True, t0),
        ),
        run(
            R.PROGRESSING,
            [stage("canary", S.COMPLETED, 2, completed=t1), stage("rest", S.AWAITING_APPROVAL)],
            progressing=(True, t0),
        ),
        run(
            R.PROGRESSING,
            [stage("canary", S.COMPLETED, 2, completed=t1), stage("rest", S.PROGRESSING)],
            progressing=(True, t0),
        ),
        run(
            R.SUCCEEDED,
            [
                stage("canary", S.COMPLETED, 2, completed=t1),
                stage("rest", S.COMPLETED, 2, completed=t2),
            ],
            progressing=(False, t2),
            message="4 upgraded, 0 skipped of 4",
        ),
    ]
    found: list[Transition] = []
    for prev, new in itertools.pairwise(history):
        found += transitions(UID, prev, new)
        # A pass that repeats (its write conflicted, nothing changed): nothing new.
        assert transitions(UID, new, new) == []
    assert kinds(found) == [
        "RunStarted",
        "StageStarted",
        "StageCompleted",
        "ApprovalAwaited",
        "StageStarted",
        "StageCompleted",
        "RunSucceeded",
    ]
    assert [t.stage for t in found][1:6] == ["canary", "canary", "rest", "rest", "rest"]
    ids = [t.id for t in found]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith(f"{UID}/") for i in ids)
    assert f"{UID}/StageCompleted/canary/{t1}" in ids and f"{UID}/RunSucceeded/{t2}" in ids
    # The same pair always gives the same ids (a receiver can drop what it saw).
    again = [t.id for p, n in itertools.pairwise(history) for t in transitions(UID, p, n)]
    assert again == ids
    assert found[-1].message == "4 upgraded, 0 skipped of 4" and not found[-1].warning


def test_health_check_evaluations_and_unchanged_phases_are_not_transitions() -> None:
    prev = run(api.RunPhase.PROGRESSING, [stage("canary", S.VERIFYING)], progressing=(True, "a"))
    health = api.HealthState(since="2026-11-23T04:00:00Z", passes=1)
    new = prev.model_copy(
        update={"stages": [stage("canary", S.VERIFYING).model_copy(update={"health": health})]}
    )
    verifying = api.ClusterUpgradeStatus(phase=U.VERIFYING)
    evaluated = verifying.model_copy(update={"health": health})
    change = ClusterChange("run-c1", "c1", "canary", verifying, evaluated)
    assert transitions(UID, prev, new, [change]) == []


def test_cluster_failure_is_a_notification_and_other_phases_are_events_only() -> None:
    status = run(api.RunPhase.PROGRESSING, [stage("canary", S.PROGRESSING)])
    changes = [
        cluster("c1", U.PENDING, U.SERVICING_OUT),
        cluster("c2", U.UPGRADING_NODE_POOLS, U.FAILED, message="nodePool/workers: FAILED"),
    ]
    found = transitions(UID, status, status, changes)
    assert [(t.reason, t.event, t.upgrade, t.warning) for t in found] == [
        ("ServicingOut", None, "run-c1", False),
        ("Failed", E.CLUSTER_FAILED, "run-c2", True),
    ]
    failed = found[1]
    assert failed.id == f"{UID}/ClusterFailed/c2/0"
    assert failed.subject == "c2" and failed.stage == "canary"
    assert failed.message == "nodePool/workers: FAILED"
    # The retried attempt failing again is a new transition.
    again = transitions(UID, status, status, [cluster("c2", U.VERIFYING, U.FAILED, attempt=1)])
    assert again[0].id == f"{UID}/ClusterFailed/c2/1"


def test_halt_retry_halt_are_two_transitions_and_stage_failure_is_a_warning() -> None:
    going = run(R.PROGRESSING, [stage("canary", S.PROGRESSING)], progressing=(True, "t0"))
    halted = run(
        R.HALTED,
        [stage("canary", S.FAILED, failed=1)],
        progressing=(False, "t1"),
        message="halted: cluster c2 failed",
    )
    first = transitions(UID, going, halted)
    assert kinds(first) == ["StageFailed", "RunHalted"]
    assert all(t.warning for t in first)
    assert first[1].message == "halted: cluster c2 failed"
    resumed = run(R.PROGRESSING, [stage("canary", S.PROGRESSING)], progressing=(True, "t2"))
    assert kinds(transitions(UID, halted, resumed)) == []
    halted_again = halted.model_copy(
        update={
            "conditions": [
                api.Condition(
                    type="Progressing", status="False", reason="x", last_transition_time="t3"
                )
            ]
        }
    )
    second = transitions(UID, resumed, halted_again)
    assert kinds(second) == ["StageFailed", "RunHalted"]
    assert {t.id for t in first}.isdisjoint(t.id for t in second)


def test_stopped_and_failed_runs() -> None:
    going = run(R.PROGRESSING, [], progressing=(True, "t0"))
    stopped = run(R.STOPPED, [], progressing=(False, "t1"))
    failed = run(R.FAILED, [], progressing=(False, "t1"))
    assert [(t.reason, t.warning) for t in transitions(UID, going, stopped)] == [
        ("RunStopped", False)
    ]
    assert [(t.reason, t.warning) for t in transitions(UID, going, failed)] == [("RunFailed", True)]
    # Stopped before it started: no RunStarted, one RunStopped.
    never = api.UpdateRunStatus(phase=R.STOPPED, end_time="t1")
    assert kinds(transitions(UID, api.UpdateRunStatus(), never)) == ["RunStopped"]


def test_event_names_are_deterministic_and_valid() -> None:
    a = event_name("fleet-0123456789-cluster-00", f"{UID}/ClusterFailed/cluster-00/0")
    assert a == event_name("fleet-0123456789-cluster-00", f"{UID}/ClusterFailed/cluster-00/0")
    assert a != event_name("fleet-0123456789-cluster-00", f"{UID}/ClusterFailed/cluster-00/1")
    long = event_name("x" * 253, "id")
    assert len(long) <= 253 and long.startswith("x" * 200 + ".")


def test_a_retry_is_recorded_with_the_phases_the_decision_took_it_through() -> None:
    status = run(R.PROGRESSING, [stage("canary", S.PROGRESSING)])
    failed = api.ClusterUpgradeStatus(phase=U.FAILED, attempt=0)
    verifying = api.ClusterUpgradeStatus(phase=U.VERIFYING, attempt=1, message="checks 0/2")
    steps = (
        (U.PENDING, "retry requested by alice (attempt 2)"),
        (U.SERVICING_OUT, "Pending → ServicingOut"),
        (U.VERIFYING, "checks 0/2"),
    )
    change = ClusterChange("run-c1", "c1", "canary", failed, verifying, steps)
    found = transitions(UID, status, status, [change])
    assert [(t.reason, t.message, t.id) for t in found] == [
        ("Pending", "retry requested by alice (attempt 2)", f"{UID}/Pending/c1/1"),
        ("ServicingOut", "Pending → ServicingOut", f"{UID}/ServicingOut/c1/1"),
        ("Verifying", "checks 0/2", f"{UID}/Verifying/c1/1"),
    ]
    assert all(t.event is None and t.upgrade == "run-c1" for t in found)


def test_a_clusters_steps_inside_an_attempt_are_detail_its_start_and_end_are_not() -> None:
    """Events by default: a ClusterUpgrade's start and end (5,000 clusters with an Event per step is
    25,000 Events a rollout); --step-events records the detail too
    (orchestrator.controllers.updaterun)."""
    status = run(R.PROGRESSING, [stage("canary", S.PROGRESSING)])
    path = [
        U.PENDING,
        U.PRE_HOOK,
        U.SERVICING_OUT,
        U.UPGRADING_CONTROL_PLANE,
        U.UPGRADING_NODE_POOLS,
        U.VERIFYING,
        U.POST_HOOK,
        U.SERVICING_IN,
        U.UPGRADED,
    ]
    detail = {}
    for old, new in itertools.pairwise(path):
        change = ClusterChange(
            "run-c1",
            "c1",
            "canary",
            api.ClusterUpgradeStatus(phase=old),
            api.ClusterUpgradeStatus(phase=new),
        )
        [t] = transitions(UID, status, status, [change])
        detail[t.reason] = t.detail
    assert detail == {
        "PreUpgradeHook": False,
        "ServicingOut": False,
        "UpgradingControlPlane": True,
        "UpgradingNodePools": True,
        "Verifying": True,
        "PostUpgradeHook": True,
        "ServicingIn": True,
        "Upgraded": False,
    }
    for end in (U.FAILED, U.BLOCKED, U.SKIPPED):
        change = ClusterChange(
            "run-c1",
            "c1",
            "canary",
            api.ClusterUpgradeStatus(phase=U.UPGRADING_NODE_POOLS),
            api.ClusterUpgradeStatus(phase=end),
        )
        assert [t.detail for t in transitions(UID, status, status, [change])] == [False]
