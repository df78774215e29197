"""orchestrator.engine.transitions.events_of: which Kubernetes Events a pass makes (issue 21
item 1): a start and an end per cluster by default, at most one Event per cluster per pass, and
one Event on the run where many clusters of a stage make the same transition at once."""

from __future__ import annotations

from collections import Counter

from orchestrator import api
from orchestrator.engine.transitions import (
    AGGREGATE_AT,
    ClusterChange,
    events_of,
    transitions,
)

U = api.UpgradePhase
S = api.StagePhase
UID = "run-uid"


def _status(phase: U, attempt: int = 0, message: str | None = None) -> api.ClusterUpgradeStatus:
    return api.ClusterUpgradeStatus(phase=phase, attempt=attempt, message=message)


def _run(stages: list[api.StageStatus]) -> api.UpdateRunStatus:
    return api.UpdateRunStatus(phase=api.RunPhase.PROGRESSING, start_time="t0", stages=stages)


def _wave(count: int, old: U, new: U, stage: str = "main") -> list[ClusterChange]:
    return [
        ClusterChange(f"up-{i:03d}", f"c-{i:03d}", stage, _status(old), _status(new))
        for i in range(count)
    ]


def _described(events: list[object]) -> Counter[tuple[str, str]]:
    """(object, reason) of each Event, as `kubectl describe` would list them: on the
    ClusterUpgrade for a cluster's Event, else on the run."""
    out: Counter[tuple[str, str]] = Counter()
    for t in events:
        out[(getattr(t, "upgrade", None) or "run", getattr(t, "reason", ""))] += 1
    return out


def _stages() -> tuple[api.UpdateRunStatus, api.UpdateRunStatus]:
    before = _run(
        [api.StageStatus(name="main", phase=S.PROGRESSING, total=50, upgraded=0, failed=0)]
    )
    return before, before


def test_a_few_clusters_starting_each_get_their_event() -> None:
    prev, new = _stages()
    found = transitions(UID, prev, new, _wave(AGGREGATE_AT, U.PENDING, U.SERVICING_OUT))
    events = events_of(found)
    assert _described(events) == Counter(
        {(f"up-{i:03d}", "ServicingOut"): 1 for i in range(AGGREGATE_AT)}
    )


def test_a_wave_starting_is_one_event_on_the_run_naming_the_count_and_the_first() -> None:
    prev, new = _stages()
    found = transitions(UID, prev, new, _wave(40, U.PENDING, U.SERVICING_OUT))
    assert len(found) == 40  # every transition is still there (notifications use them)
    events = events_of(found)
    assert _described(events) == Counter({("run", "ServicingOut"): 1})
    (event,) = events
    assert event.message.startswith(
        "40 clusters ServicingOut in stage main: c-000, c-001, c-002, c-003, c-004 and 35 more"
    )
    assert not event.warning
    # The same wave gives the same Event name (recorded once, across restarts too).
    again = events_of(transitions(UID, prev, new, _wave(40, U.PENDING, U.SERVICING_OUT)))
    assert again[0].id == event.id


def test_many_failing_at_once_is_one_warning_and_others_keep_theirs() -> None:
    prev, new = _stages()
    upgraded = ClusterChange("up-x", "c-x", "main", _status(U.SERVICING_IN), _status(U.UPGRADED))
    changes = [*_wave(12, U.VERIFYING, U.FAILED), upgraded]
    events = events_of(transitions(UID, prev, new, changes))
    assert _described(events) == Counter({("run", "Failed"): 1, ("up-x", "Upgraded"): 1})
    assert next(e for e in events if e.upgrade is None).warning


def test_steps_inside_an_attempt_are_events_only_when_asked() -> None:
    prev, new = _stages()
    changes = _wave(3, U.SERVICING_OUT, U.UPGRADING_CONTROL_PLANE)
    assert events_of(transitions(UID, prev, new, changes)) == []
    asked = events_of(transitions(UID, prev, new, changes), step_events=True)
    assert _described(asked) == Counter(
        {(f"up-{i:03d}", "UpgradingControlPlane"): 1 for i in range(3)}
    )


def test_one_event_per_cluster_per_pass_with_every_message() -> None:
    """A retry that carries a cluster on out of service goes Pending, then ServicingOut, in
    one pass: one Event request, saying both."""
    prev, new = _stages()
    change = ClusterChange(
        "up-r",
        "c-r",
        "main",
        _status(U.FAILED, 0),
        _status(U.SERVICING_OUT, 1),
        (
            (U.PENDING, "retry requested by bob: flaky (attempt 2)"),
            (U.SERVICING_OUT, "carried on out of service"),
        ),
    )
    found = transitions(UID, prev, new, [change])
    assert len(found) == 2
    events = events_of(found)
    assert _described(events) == Counter({("up-r", "ServicingOut"): 1})
    assert events[0].message == (
        "retry requested by bob: flaky (attempt 2); then ServicingOut: carried on out of service"
    )
    assert events[0].person  # told on the ClusterVersion too, as a person's retry is


def test_run_and_stage_events_pass_unchanged_in_order() -> None:
    prev = _run([api.StageStatus(name="main", phase=S.PENDING, total=30, upgraded=0, failed=0)])
    prev = prev.model_copy(update={"start_time": None})
    new = _run([api.StageStatus(name="main", phase=S.PROGRESSING, total=30, upgraded=0, failed=0)])
    found = transitions(UID, prev, new, _wave(30, U.PENDING, U.SERVICING_OUT))
    events = events_of(found)
    assert [(e.upgrade, e.reason) for e in events] == [
        (None, "RunStarted"),
        (None, "StageStarted"),
        (None, "ServicingOut"),
    ]
