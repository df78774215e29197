"""What happened in one reconcile pass, as transitions with stable ids (pure: no I/O).

One function, `transitions`, turns (the run's status before a pass, the status the pass wrote,
the ClusterUpgrade statuses the pass wrote) into the list of things that happened: the run
started, halted, finished; a stage started, completed, failed or awaits approval; a cluster
changed phase or failed. Both the Kubernetes Events and the notifications are made from this
list and from nothing else, so there is one Event per transition per object (never one per
health-check evaluation) and one notification per transition.

Each transition has an id built from what it is about, never from when it was computed: the run's
uid, what happened and to which stage or cluster (and attempt); where the same thing can happen
again later in a run (a halt after a retry), the id also carries the time the status recorded
for it (the run's Progressing condition, a stage's completion time). The caller computes
transitions only from writes that took effect, so a pass that repeats after a conflict computes
nothing twice; the ids let receivers (and the deterministic Event names) drop duplicates anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import api
from orchestrator.engine.conditions import get_condition

__all__ = [
    "AGGREGATE_AT",
    "ClusterChange",
    "Transition",
    "event_name",
    "events_of",
    "transitions",
]

#: A cluster's phases inside an attempt, between its start (PreUpgradeHook or ServicingOut) and
#: its end (Upgraded, Failed...): `Transition.detail`.
STEP_PHASES = frozenset(
    {
        api.UpgradePhase.UPGRADING_CONTROL_PLANE,
        api.UpgradePhase.UPGRADING_NODE_POOLS,
        api.UpgradePhase.VERIFYING,
        api.UpgradePhase.POST_HOOK,
        api.UpgradePhase.SERVICING_IN,
    }
)

E = api.NotificationEvent
S = api.StagePhase
R = api.RunPhase

_NOT_STARTED = frozenset({S.PENDING, S.AWAITING_APPROVAL})
_STARTED = frozenset({S.PROGRESSING, S.VERIFYING, S.SOAKING, S.COMPLETED, S.FAILED})
_DONE = frozenset({S.COMPLETED, S.SOAKING})
_RUN_END = {
    R.SUCCEEDED: E.RUN_SUCCEEDED,
    R.FAILED: E.RUN_FAILED,
    R.HALTED: E.RUN_HALTED,
    R.STOPPED: E.RUN_STOPPED,
}


@dataclass(frozen=True)
class ClusterChange:
    """One ClusterUpgrade status write that took effect in the pass."""

    name: str
    cluster_id: str
    stage: str
    old: api.ClusterUpgradeStatus
    new: api.ClusterUpgradeStatus
    #: The phases the decision took it through in this write, with their messages (the
    #: engine's record: a retry goes Failed → Pending → on in one pass); empty: old → new.
    steps: tuple[tuple[api.UpgradePhase, str], ...] = ()


@dataclass(frozen=True)
class Transition:
    """One thing that happened to a run, a stage or a cluster."""

    #: Stable: the same transition always has the same id (the CloudEvent id, the Event name).
    id: str
    #: The Event reason: the notification event's name, or the cluster's new phase.
    reason: str
    #: The notification event; None for transitions that are Events only (a cluster's phases).
    event: api.NotificationEvent | None
    message: str
    warning: bool
    stage: str | None = None
    cluster: str | None = None
    #: The ClusterUpgrade the Event is about; None: the UpdateRun.
    upgrade: str | None = None
    #: A cluster's step inside an attempt (control plane, node pools, verifying, post-hook,
    #: service-in): its ClusterUpgrade's status records it; an Event only with --step-events.
    detail: bool = False
    #: What a person did to a cluster (a retry or a skip, with who and why): told on the
    #: ClusterVersion too.
    person: bool = False

    @property
    def subject(self) -> str | None:
        """The CloudEvents subject: the cluster, else the stage."""
        return self.cluster or self.stage


PEOPLES_WORDS = ("retry requested by ", "skipped by ")
"""How a cluster's message starts when a person retried or skipped it (engine.decide writes
them: `_retry`, `_people_first`)."""


def transitions(
    uid: str,
    prev: api.UpdateRunStatus,
    new: api.UpdateRunStatus,
    clusters: Sequence[ClusterChange] = (),
) -> list[Transition]:
    """The transitions between two statuses of a run (and its written ClusterUpgrades).

    prev: the run's status before the pass (an empty status before it was initialized);
    new: the status the pass wrote (pass prev again when the run's write did not take effect);
    clusters: the ClusterUpgrade writes that took effect in the pass, in the order made.
    """
    out: list[Transition] = []
    mark = _mark(new)
    if prev.start_time is None and new.start_time is not None:
        out.append(
            Transition(
                f"{uid}/RunStarted",
                E.RUN_STARTED,
                E.RUN_STARTED,
                new.message or "started",
                False,
            )
        )
    before = {s.name: s for s in prev.stages or []}
    by_stage: dict[str, list[ClusterChange]] = {}
    for change in clusters:
        if change.old.phase != change.new.phase or change.steps:
            by_stage.setdefault(change.stage, []).append(change)
    # Stage by stage, in the order things happen: it starts, its clusters move, it ends.
    for stage in new.stages or []:
        old = before.get(stage.name)
        out += _stage(uid, stage, old.phase if old is not None else S.PENDING, mark, "start")
        out += [t for c in by_stage.pop(stage.name, []) for t in _cluster(uid, c)]
        out += _stage(uid, stage, old.phase if old is not None else S.PENDING, mark, "end")
    out += [t for changes in by_stage.values() for c in changes for t in _cluster(uid, c)]
    end = _RUN_END.get(new.phase) if new.phase is not None else None
    if end is not None and new.phase != prev.phase:
        out.append(
            Transition(
                f"{uid}/{end.value}/{mark}",
                end.value,
                end,
                new.message or end.value,
                end in (E.RUN_FAILED, E.RUN_HALTED),
                stage=new.current_stage,
            )
        )
    return out


def _stage(
    uid: str, stage: api.StageStatus, was: api.StagePhase, mark: str, part: str
) -> list[Transition]:
    """A stage's transitions: its start ("start") or its end ("end")."""
    now = stage.phase
    out: list[Transition] = []
    if was == now:
        return out
    if part == "start":
        if now == S.AWAITING_APPROVAL:
            out.append(
                Transition(
                    f"{uid}/ApprovalAwaited/{stage.name}",
                    E.APPROVAL_AWAITED,
                    E.APPROVAL_AWAITED,
                    f"stage {stage.name} awaits approval",
                    False,
                    stage=stage.name,
                )
            )
        if was in _NOT_STARTED and now in _STARTED:
            out.append(
                Transition(
                    f"{uid}/StageStarted/{stage.name}",
                    E.STAGE_STARTED,
                    E.STAGE_STARTED,
                    f"stage {stage.name} started ({stage.total} clusters)",
                    False,
                    stage=stage.name,
                )
            )
        return out
    counts = (
        f"{stage.upgraded}/{stage.total} upgraded, {stage.skipped} skipped, {stage.failed} failed"
    )
    if now in _DONE and was not in _DONE:
        out.append(
            Transition(
                f"{uid}/StageCompleted/{stage.name}/{stage.completion_time or mark}",
                E.STAGE_COMPLETED,
                E.STAGE_COMPLETED,
                f"stage {stage.name} completed: {counts}",
                False,
                stage=stage.name,
            )
        )
    if now == S.FAILED:
        out.append(
            Transition(
                f"{uid}/StageFailed/{stage.name}/{mark}",
                E.STAGE_FAILED,
                E.STAGE_FAILED,
                f"stage {stage.name} failed: {counts}",
                True,
                stage=stage.name,
            )
        )
    return out


def _cluster(uid: str, change: ClusterChange) -> list[Transition]:
    """A cluster's phase changes (a notification only when it failed)."""
    steps = change.steps or (
        (
            change.new.phase,
            change.new.message or f"{change.old.phase.value} → {change.new.phase.value}",
        ),
    )
    out = []
    for phase, message in steps:
        failed = phase == api.UpgradePhase.FAILED
        detail = phase in STEP_PHASES
        what = E.CLUSTER_FAILED.value if failed else phase.value
        out.append(
            Transition(
                f"{uid}/{what}/{change.cluster_id}/{change.new.attempt}",
                phase.value,
                E.CLUSTER_FAILED if failed else None,
                message,
                failed,
                stage=change.stage,
                cluster=change.cluster_id,
                upgrade=change.name,
                detail=detail,
                person=message.startswith(PEOPLES_WORDS),
            )
        )
    return out


def _mark(status: api.UpdateRunStatus) -> str:
    """When the run last turned (the Progressing condition's lastTransitionTime), for ids of
    transitions that can happen more than once in a run (halted, retried, halted again)."""
    progressing = get_condition(status.conditions, "Progressing")
    if progressing is not None and progressing.last_transition_time:
        return progressing.last_transition_time
    return status.end_time or status.start_time or "0"


def event_name(object_name: str, transition_id: str) -> str:
    """The Event's name for one transition of one object: the same transition, the same name
    (a second create is AlreadyExists), so a transition is recorded once even across restarts."""
    digest = hashlib.sha256(transition_id.encode()).hexdigest()[:16]
    return f"{object_name[:200]}.{digest}"


#: More clusters than this making the same transition in one stage in one pass are told in one
#: Event on the run (Kubernetes' EventAggregator combines similar Events past its maxEvents of
#: 10: client-go tools/record/events_cache.go, defaultAggregateMaxEvents).
AGGREGATE_AT = 10
#: How many of the clusters an aggregated Event names.
AGGREGATE_NAMES = 5


def events_of(found: Sequence[Transition], step_events: bool = False) -> list[Transition]:
    """The Events a pass's transitions make (Kubernetes Events only: notifications go by
    `found` itself):

    - a cluster's steps inside an attempt (`Transition.detail`) only with step_events: by
      default a ClusterUpgrade gets an Event when its attempt starts and when it ends;
    - at most one Event per cluster per pass: a cluster that made several transitions in the
      pass (a retry that carries it on out of service: Pending, then ServicingOut) gets one,
      with the last reason and every message in order;
    - where more than AGGREGATE_AT clusters of a stage make the same transition in one pass
      (a wave starting, a wave ending), one Event on the run names how many and the first
      AGGREGATE_NAMES of them, in place of theirs (a warning if any is one).
    The run's and the stages' transitions pass unchanged, in their order; a group takes the
    place of its first member."""
    kept = [t for t in found if not t.detail or step_events]
    # One per cluster: the last of its transitions, carrying the ones before it.
    by_upgrade: dict[str, list[Transition]] = {}
    for t in kept:
        if t.upgrade:
            by_upgrade.setdefault(t.upgrade, []).append(t)
    merged: list[Transition] = []
    for t in kept:
        if not t.upgrade:
            merged.append(t)
            continue
        group = by_upgrade[t.upgrade]
        if t is not group[-1]:
            continue
        merged.append(_one_per_cluster(group) if len(group) > 1 else t)
    # Many clusters, one transition: one Event on the run.
    similar: dict[tuple[str | None, str], list[Transition]] = {}
    for t in merged:
        if t.upgrade:
            similar.setdefault((t.stage, t.reason), []).append(t)
    out: list[Transition] = []
    for t in merged:
        group = similar.get((t.stage, t.reason), []) if t.upgrade else []
        if len(group) <= AGGREGATE_AT:
            out.append(t)
        elif t is group[0]:
            out.append(_aggregate(group))
    return out


def _one_per_cluster(group: Sequence[Transition]) -> Transition:
    last = group[-1]
    message = "; then ".join([group[0].message] + [f"{t.reason}: {t.message}" for t in group[1:]])
    return Transition(
        last.id,
        last.reason,
        next((t.event for t in reversed(group) if t.event is not None), None),
        message,
        any(t.warning for t in group),
        stage=last.stage,
        cluster=last.cluster,
        upgrade=last.upgrade,
        detail=last.detail,
        person=any(t.person for t in group),
    )


def _aggregate(group: Sequence[Transition]) -> Transition:
    first = group[0]
    clusters = [t.cluster or t.upgrade or "" for t in group]
    named = ", ".join(clusters[:AGGREGATE_NAMES])
    more = f" and {len(clusters) - AGGREGATE_NAMES} more" if len(clusters) > AGGREGATE_NAMES else ""
    where = f" in stage {first.stage}" if first.stage else ""
    digest = hashlib.sha256("\n".join(sorted(t.id for t in group)).encode()).hexdigest()[:16]
    return Transition(
        f"{first.id.partition('/')[0]}/{first.reason}/{first.stage or ''}/{digest}",
        first.reason,
        None,
        f"{len(clusters)} clusters {first.reason}{where}: {named}{more} "
        f"(their ClusterUpgrades say why; first: {first.message})",
        any(t.warning for t in group),
        stage=first.stage,
    )
