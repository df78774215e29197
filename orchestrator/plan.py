"""The pure planner: (spec, fleet snapshot, previous status, now) → actions and the next status."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestrator import api
from orchestrator.conditions import format_time, parse_time, set_condition
from orchestrator.fleet import ClusterObs, OpKind, OpObs, OpState, Snapshot, apply_succeeded
from orchestrator.health import judge
from orchestrator.validate import Problem, Target, Targets, resolve_targets, validate_spec
from plugins.sdk import versions

__all__ = [
    "ACTIVE_PHASES",
    "Action",
    "Event",
    "Plan",
    "PlanInput",
    "invalid",
    "plan",
    "request_id",
]

P = api.ClusterPhase
#: Phases in which a cluster is held out of the availability count by this rollout.
ACTIVE_PHASES = frozenset(
    {
        P.SERVICING_OUT,
        P.UPGRADING_CONTROL_PLANE,
        P.UPGRADING_NODE_POOLS,
        P.VERIFYING,
        P.SERVICING_IN,
    }
)
_STEP_PHASE = {
    OpKind.SERVICE_OUT: P.SERVICING_OUT,
    OpKind.CONTROL_PLANE: P.UPGRADING_CONTROL_PLANE,
    OpKind.NODE_POOL: P.UPGRADING_NODE_POOLS,
    OpKind.SERVICE_IN: P.SERVICING_IN,
}
#: How often to look again at a cluster waiting to become available before service-in.
VERIFY_POLL_SECONDS = 2.0


@dataclass(frozen=True)
class Action:
    """One mutating plugin call to make."""

    kind: OpKind
    cluster_id: str
    request_id: str
    version: str = ""
    node_pool: str = ""

    @property
    def step(self) -> str:
        """The step name kept in status, e.g. "nodePool/pool-a"."""
        return f"{self.kind.value}/{self.node_pool}" if self.node_pool else self.kind.value


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to record about one cluster's transition."""

    cluster_id: str
    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class PlanInput:
    """Everything the planner reads."""

    spec: api.ClusterVersionSpec
    snapshot: Snapshot
    now: datetime
    uid: str = "cv"
    generation: int = 1
    status: api.ClusterVersionStatus | None = None
    approved_stages: frozenset[str] = frozenset()
    retry_clusters: frozenset[str] = frozenset()


@dataclass
class Plan:
    """What to do now, and the status to write once it is done."""

    actions: list[Action]
    status: api.ClusterVersionStatus
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    problems: list[Problem] = field(default_factory=list)


def request_id(uid: str, cluster_id: str, step: str, target: str, attempt: int) -> str:
    """The deterministic request id of one step: the same step is never started twice."""
    return f"{uid}:{cluster_id}:{step}:{target}:{attempt}"


def _needs_cp(obs: ClusterObs, target: Target) -> bool:
    return not versions.meets(obs.control_plane_version, target.version)


def _pool_needing(obs: ClusterObs, target: Target) -> str | None:
    for pool in obs.node_pools:
        if not versions.meets(pool.version, target.pool_target(pool.name)):
            return pool.name
    return None


def _needs_upgrade(obs: ClusterObs, target: Target) -> bool:
    return _needs_cp(obs, target) or _pool_needing(obs, target) is not None


def _find_op(rid: str, obs: ClusterObs, snap: Snapshot) -> OpObs | None:
    op = snap.operations.get(rid)
    if op is not None:
        return op
    current = obs.current_operation
    return current if current is not None and current.request_id == rid else None


def _achieved(action: Action, obs: ClusterObs) -> bool:
    """True when the observed cluster already shows the step's effect."""
    if action.kind is OpKind.SERVICE_OUT:
        return not obs.in_service
    if action.kind is OpKind.SERVICE_IN:
        return obs.in_service
    if action.kind is OpKind.CONTROL_PLANE:
        return versions.meets(obs.control_plane_version, action.version)
    pool = next((p for p in obs.node_pools if p.name == action.node_pool), None)
    return pool is None or versions.meets(pool.version, action.version)


class _Planner:
    def __init__(self, inp: PlanInput, targets: Targets) -> None:
        self.inp = inp
        self.targets = targets
        self.now = format_time(inp.now)
        self.strategy = inp.spec.strategy or api.Strategy()
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.entries: dict[str, api.ClusterStatusEntry] = {}
        self.effective: dict[str, ClusterObs] = dict(inp.snapshot.clusters)
        self._needs: dict[str, bool] = {}

    def needs(self, cid: str) -> bool:
        """Whether a managed cluster, as now known, is short of its target (cached)."""
        known = self._needs.get(cid)
        if known is None:
            known = self._needs[cid] = _needs_upgrade(
                self.effective[cid], self.targets.by_cluster[cid]
            )
        return known

    def _wake(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def _set(self, entry: api.ClusterStatusEntry, **changes: object) -> api.ClusterStatusEntry:
        phase = changes.get("phase", entry.phase)
        if phase != entry.phase:
            changes["last_transition_time"] = self.now
            msg = changes.get("message") or f"{entry.phase.value} → {phase}"
            self.events.append(Event(entry.id, str(phase), str(msg), phase == P.FAILED))
        new = entry.model_copy(update=changes)
        self.entries[entry.id] = new
        return new

    def _issue(self, entry: api.ClusterStatusEntry, action: Action) -> None:
        self.actions.append(action)
        self._set(
            entry,
            phase=_STEP_PHASE[action.kind],
            step=action.step,
            request_id=action.request_id,
            operation_id=None,
            message=None,
            health=None,
        )

    def _action(self, kind: OpKind, cid: str, attempt: int, pool: str = "") -> Action:
        target = self.targets.by_cluster[cid]
        version = target.pool_target(pool) if pool else target.version
        step = f"{kind.value}/{pool}" if pool else kind.value
        rid = request_id(self.inp.uid, cid, step, target.version if not pool else version, attempt)
        op_version = version if kind in (OpKind.CONTROL_PLANE, OpKind.NODE_POOL) else ""
        return Action(kind, cid, rid, op_version, pool)

    def _current_action(self, entry: api.ClusterStatusEntry, obs: ClusterObs) -> Action | None:
        """The step an in-flight entry is at, from its status or derived from its phase."""
        if entry.step and entry.step != "verify":
            kind_text, _, pool = entry.step.partition("/")
            return self._action(OpKind(kind_text), entry.id, entry.attempt, pool)
        kind = {v: k for k, v in _STEP_PHASE.items()}.get(entry.phase)
        if kind is None:
            return None
        if kind is OpKind.NODE_POOL:
            needing = _pool_needing(obs, self.targets.by_cluster[entry.id])
            return None if needing is None else self._action(kind, entry.id, entry.attempt, needing)
        return self._action(kind, entry.id, entry.attempt)

    def advance(self, entry: api.ClusterStatusEntry, obs: ClusterObs) -> None:
        """Pick the next step of a cluster that has no operation in flight."""
        target = self.targets.by_cluster[entry.id]
        if obs.in_service and _needs_upgrade(obs, target):
            self._issue(entry, self._action(OpKind.SERVICE_OUT, entry.id, entry.attempt))
        elif _needs_cp(obs, target):
            self._issue(entry, self._action(OpKind.CONTROL_PLANE, entry.id, entry.attempt))
        elif (pool := _pool_needing(obs, target)) is not None:
            self._issue(entry, self._action(OpKind.NODE_POOL, entry.id, entry.attempt, pool))
        elif not obs.in_service:
            self.verify(entry, obs)
        else:
            self.entries.pop(entry.id, None)
            self.events.append(Event(entry.id, P.UPGRADED.value, f"upgraded to {target.version}"))

    def verify(self, entry: api.ClusterStatusEntry, obs: ClusterObs) -> None:
        """Service the cluster in once it is available and its health gate passes."""
        waiting = None
        checks = self.health_checks(entry.stage)
        health = entry.health
        if not obs.available:
            waiting = f"waiting for the cluster to become available: {obs.unavailable_reason}"
        elif not all(p.ready for p in obs.node_pools):
            waiting = "waiting for node pools to become ready"
        elif checks is not None:
            verdict = judge(health, checks, self.inp.now)
            if verdict.failed:
                self._set(entry, phase=P.FAILED, step="verify", message=verdict.message)
                return
            if health is None:
                health = api.HealthState(since=self.now)
            if not verdict.passed:
                self._set(
                    entry,
                    phase=P.VERIFYING,
                    step="verify",
                    operation_id=None,
                    request_id=None,
                    message=verdict.message,
                    health=health,
                )
                self._wake(verdict.wait_seconds)
                return
        if waiting is not None:
            self._set(
                entry,
                phase=P.VERIFYING,
                step="verify",
                operation_id=None,
                request_id=None,
                message=waiting.rstrip(": "),
            )
            self._wake(VERIFY_POLL_SECONDS)
            return
        self._issue(entry, self._action(OpKind.SERVICE_IN, entry.id, entry.attempt))

    def health_checks(self, stage: str | None) -> api.HealthChecks | None:
        """The health checks that apply to a stage (its own, else the spec's)."""
        for spec_stage in self.strategy.stages or []:
            if spec_stage.name == stage and spec_stage.health_checks is not None:
                return spec_stage.health_checks
        return self.inp.spec.health_checks

    def follow(self, entry: api.ClusterStatusEntry) -> None:
        """Carry one status entry forward from what its operation did."""
        obs = self.inp.snapshot.clusters.get(entry.id)
        if obs is None or entry.id not in self.targets.by_cluster:
            reason = (
                "is no longer in the plugin's inventory" if obs is None else "is no longer in spec"
            )
            self._set(entry, message=f"cluster {reason}; left as it is")
            return
        if entry.phase == P.FAILED:
            if entry.id not in self.inp.retry_clusters:
                self.entries[entry.id] = entry
                return
            entry = self._set(
                entry,
                phase=P.PENDING,
                attempt=entry.attempt + 1,
                message=f"retry requested (attempt {entry.attempt + 2})",
                operation_id=None,
                request_id=None,
            )
            if not obs.in_service:  # ours, out of service already: carry on at once
                self.advance(entry, obs)
                return
        if entry.phase not in ACTIVE_PHASES:
            self.entries[entry.id] = entry  # Pending: reconsidered with the stage's candidates
            return
        if entry.phase == P.VERIFYING:
            self.advance(entry, obs)
            return
        action = self._current_action(entry, obs)
        op = None if action is None else _find_op(action.request_id, obs, self.inp.snapshot)
        if action is None or (op is None and _achieved(action, obs)):
            self.advance(entry.model_copy(update={"operation_id": None}), obs)
            return
        if op is None:
            # Issued, but the operation is unknown (the call failed, the write was lost, or the
            # controller restarted): the same request id returns the same operation.
            self.actions.append(action)
            self.entries[entry.id] = entry.model_copy(
                update={"step": action.step, "request_id": action.request_id}
            )
            return
        if not op.state.terminal:
            self.entries[entry.id] = entry.model_copy(
                update={"operation_id": op.id, "step": action.step, "request_id": action.request_id}
            )
            return
        if op.state == OpState.FAILED:
            self._set(
                entry,
                phase=P.FAILED,
                operation_id=op.id,
                step=action.step,
                message=f"{action.step} failed: {op.error_code}: {op.error_message}",
            )
            return
        obs = apply_succeeded(obs, op)
        self.effective[entry.id] = obs
        self._needs.pop(entry.id, None)
        self.advance(entry.model_copy(update={"operation_id": None}), obs)


def plan(inp: PlanInput) -> Plan:
    """Decide the next actions and the status that describes them. Pure: no I/O."""
    problems = validate_spec(inp.spec)
    resolved = resolve_targets(inp.spec, inp.snapshot.clusters)
    if isinstance(resolved, list):
        problems += [p for p in resolved if p not in problems]
    if problems or isinstance(resolved, list):
        return invalid(inp.status, problems, inp.generation, inp.now)
    planner = _Planner(inp, resolved)
    previous = inp.status or api.ClusterVersionStatus()
    for entry in previous.entries().values():
        planner.follow(entry)
    return _start_and_summarise(planner, previous)


def _start_and_summarise(pl: _Planner, previous: api.ClusterVersionStatus) -> Plan:
    inp, targets, strategy = pl.inp, pl.targets, pl.strategy
    on_failure = strategy.on_failure
    failed = {cid for cid, e in pl.entries.items() if e.phase == P.FAILED}
    halted = bool(failed) and on_failure == api.OnFailure.HALT
    held = {cid for cid, e in pl.entries.items() if e.phase in ACTIVE_PHASES}
    managed = targets.by_cluster
    free = sum(
        1
        for cid in managed
        if cid not in held and (o := pl.effective[cid]).available and o.in_service
    )
    budget = free - inp.spec.required_available_count
    prev_stages = {s.name: s for s in previous.stages or []}
    stage_status: list[api.StageStatus] = []
    active: int | None = None
    blocked_reason = ""
    stage_failure = ""
    for s, members in enumerate(targets.stage_members):
        name = targets.stage_names[s]
        spec_stage = strategy.stages[s] if strategy.stages else None
        done = sum(1 for c in members if c not in pl.entries and not pl.needs(c))
        n_failed = sum(1 for c in members if c in failed)
        complete = done + (n_failed if on_failure == api.OnFailure.CONTINUE else 0) == len(members)
        prev = prev_stages.get(name)
        start = prev.start_time if prev and prev.start_time else None
        phase = api.StagePhase.PENDING
        completion = None
        health = None
        last_stage = s + 1 == len(targets.stage_members)
        checks = None if last_stage else pl.health_checks(name)  # gates the next stage
        if (
            complete
            and active is None
            and checks is not None
            and not (prev and prev.health and judge(prev.health, checks, inp.now).passed)
        ):
            health = prev.health if prev and prev.health else api.HealthState(since=pl.now)
            verdict = judge(prev.health if prev else None, checks, inp.now)
            active = -1  # later stages wait for this stage's analysis
            if verdict.failed:
                phase = api.StagePhase.FAILED
                stage_failure = f"stage {name}: {verdict.message}"
            else:
                phase = api.StagePhase.VERIFYING
                blocked_reason = f"stage {name}: {verdict.message}"
                pl._wake(verdict.wait_seconds)
        elif complete and active is None:
            health = prev.health if prev else None
            phase = api.StagePhase.COMPLETED
            completion = prev.completion_time if prev and prev.completion_time else pl.now
            soak = (
                api.parse_duration(spec_stage.soak_time)
                if spec_stage and spec_stage.soak_time
                else None
            )
            if soak and s + 1 < len(targets.stage_members):
                remaining = parse_time(completion) + soak - inp.now
                if remaining > timedelta(0):
                    phase = api.StagePhase.SOAKING
                    active = -1  # later stages wait
                    blocked_reason = (
                        f"stage {name} soaking for {int(remaining.total_seconds())}s more"
                    )
                    pl._wake(remaining.total_seconds())
        elif active is None:
            active = s
            if n_failed and on_failure == api.OnFailure.HALT:
                phase = api.StagePhase.FAILED
            elif (
                spec_stage
                and spec_stage.approval == api.Approval.MANUAL
                and name not in inp.approved_stages
                and not start
            ):
                phase = api.StagePhase.AWAITING_APPROVAL
                blocked_reason = (
                    f"stage {name} awaits approval: add it to the "
                    f"{api.ANNOTATION_APPROVE_STAGES} annotation"
                )
            else:
                phase = api.StagePhase.PROGRESSING
        stage_status.append(
            api.StageStatus(
                name=name,
                phase=phase,
                total=len(members),
                upgraded=done,
                failed=n_failed,
                start_time=start,
                completion_time=completion,
                health=health,
            )
        )

    current = targets.stage_names[active] if active is not None and active >= 0 else None
    if (
        active is not None
        and active >= 0
        and stage_status[active].phase == api.StagePhase.PROGRESSING
    ):
        stage_conc = strategy.stages[active].max_concurrency if strategy.stages else None
        limit_spec = stage_conc if stage_conc is not None else strategy.max_concurrency
        members = targets.stage_members[active]
        limit = (
            api.parse_max_concurrency(limit_spec, len(members))
            if limit_spec is not None
            else len(members)
        )
        in_flight = len(held)
        started = False
        candidates = []
        for cid in members:
            obs = pl.effective[cid]
            entry = pl.entries.get(cid)
            if entry is not None and entry.phase != P.PENDING:
                continue
            if not pl.needs(cid):
                continue
            if obs.current_operation is not None and not obs.current_operation.state.terminal:
                pl.entries[cid] = _waiting(
                    cid,
                    active,
                    targets,
                    entry,
                    pl.now,
                    f"operation {obs.current_operation.id} from another caller "
                    "is in flight; waiting for it to end",
                )
                continue
            if not obs.in_service:
                pl.entries[cid] = _waiting(
                    cid,
                    active,
                    targets,
                    entry,
                    pl.now,
                    "out of service outside this rollout; waiting for it to return to service",
                )
                continue
            cost = 1 if obs.available else 0
            candidates.append((cost, cid, entry))
        candidates.sort(key=lambda c: (c[0], c[1]))
        for cost, cid, entry in candidates:
            if halted or strategy.paused or in_flight >= limit or (cost and budget < cost):
                if not halted and not strategy.paused and in_flight == 0 and not blocked_reason:
                    blocked_reason = (
                        f"waiting: no availability budget ({free} available in service, "
                        f"{inp.spec.required_available_count} required)"
                    )
                if entry is not None and entry.attempt == 0:
                    del pl.entries[cid]  # waiting for its turn is the rest state: not listed
                continue
            budget -= cost
            in_flight += 1
            started = True
            if entry is None:
                base = api.ClusterStatusEntry(id=cid, phase=P.PENDING, stage=current)
            else:
                base = entry.model_copy(update={"stage": current})
            pl.advance(base, pl.effective[cid])
        if started and not stage_status[active].start_time:
            stage_status[active] = stage_status[active].model_copy(update={"start_time": pl.now})

    if stage_failure:
        halted = True
        blocked_reason = stage_failure
    return _summarise(pl, stage_status, current, halted, blocked_reason, previous)


#: In-flight clusters shown in full in status; the rest are listed by id under inFlight.
DETAIL_LIMIT = 20


def compact_entries(entries: Mapping[str, api.ClusterStatusEntry]) -> dict[str, object]:
    """Split entries into detailed ones and compact in-flight id lists (status stays small).

    Failed, waiting (with a message) and retried clusters are always detailed; of the plain
    in-flight ones, the DETAIL_LIMIT most recently changed are detailed too.
    """
    detailed: list[api.ClusterStatusEntry] = []
    plain: list[api.ClusterStatusEntry] = []
    for entry in entries.values():
        if entry.phase in ACTIVE_PHASES and not (entry.message or entry.attempt or entry.health):
            plain.append(entry)
        else:
            detailed.append(entry)
    plain.sort(key=lambda e: (e.last_transition_time or "", e.id), reverse=True)
    detailed += plain[:DETAIL_LIMIT]
    compact: dict[str, list[str]] = {}
    for entry in plain[DETAIL_LIMIT:]:
        compact.setdefault(entry.phase.value, []).append(entry.id)
    return {
        "clusters": sorted(detailed, key=lambda e: e.id) or None,
        "in_flight": {k: sorted(v) for k, v in sorted(compact.items())} or None,
    }


def _waiting(
    cid: str,
    stage: int,
    targets: Targets,
    entry: api.ClusterStatusEntry | None,
    now: str,
    message: str,
) -> api.ClusterStatusEntry:
    base = entry or api.ClusterStatusEntry(id=cid, phase=P.PENDING, last_transition_time=now)
    return base.model_copy(update={"stage": targets.stage_names[stage], "message": message})


def _summarise(
    pl: _Planner,
    stages: list[api.StageStatus],
    current: str | None,
    halted: bool,
    blocked_reason: str,
    previous: api.ClusterVersionStatus,
) -> Plan:
    inp, managed = pl.inp, pl.targets.by_cluster
    by_phase: Counter[str] = Counter()
    for cid in managed:
        entry = pl.entries.get(cid)
        if entry is not None:
            by_phase[entry.phase.value] += 1
        elif pl.needs(cid):
            by_phase[P.PENDING.value] += 1
        else:
            by_phase[P.UPGRADED.value] += 1
    failed = by_phase.get(P.FAILED.value, 0)
    in_flight = sum(by_phase.get(p.value, 0) for p in ACTIVE_PHASES)
    avail = sum(
        1 for cid in managed if pl.effective[cid].available and pl.effective[cid].in_service
    )
    summary = api.Summary(
        total=len(managed),
        up_to_date=by_phase.get(P.UPGRADED.value, 0),
        in_flight=in_flight,
        failed=failed,
        available_in_service=avail,
        by_phase=dict(sorted(by_phase.items())),
    )
    completed = summary.up_to_date == summary.total and not pl.entries
    paused = (inp.spec.strategy or api.Strategy()).paused
    if completed:
        phase, reason, message = (
            api.RolloutPhase.COMPLETED,
            "Completed",
            (f"all {summary.total} clusters run their target versions"),
        )
    elif failed and in_flight == 0 and all(s.phase == api.StagePhase.COMPLETED for s in stages):
        phase, reason = api.RolloutPhase.FAILED, "ClusterFailed"
        message = f"finished with {failed} failed cluster(s); retry them with the "
        message += f"{api.ANNOTATION_RETRY_CLUSTERS} annotation"
    elif halted and not failed:
        phase, reason, message = api.RolloutPhase.HALTED, "StageFailed", f"halted: {blocked_reason}"
    elif halted:
        first = sorted(c for c, e in pl.entries.items() if e.phase == P.FAILED)[0]
        phase, reason = api.RolloutPhase.HALTED, "ClusterFailed"
        message = f"halted: cluster {first} failed: {pl.entries[first].message}"
    elif paused:
        phase, reason, message = api.RolloutPhase.PAUSED, "Paused", "paused by spec.strategy.paused"
    else:
        phase, reason = api.RolloutPhase.PROGRESSING, "Progressing"
        message = blocked_reason or (
            f"{summary.up_to_date}/{summary.total} upgraded, {in_flight} in flight"
            + (f", stage {current}" if current else "")
        )
    gen = inp.generation
    conds = list(previous.conditions or [])
    conds = set_condition(conds, "Ready", completed, reason, message, gen, inp.now)
    conds = set_condition(
        conds,
        "Progressing",
        phase == api.RolloutPhase.PROGRESSING or (paused and in_flight > 0),
        reason,
        message,
        gen,
        inp.now,
    )
    degraded_msg = f"{failed} cluster(s) failed" if failed else "no failures"
    conds = set_condition(
        conds,
        "Degraded",
        failed > 0,
        "ClusterFailed" if failed else "AsExpected",
        degraded_msg,
        gen,
        inp.now,
    )
    conds = set_condition(
        conds,
        "Paused",
        paused,
        "Paused" if paused else "NotPaused",
        "spec.strategy.paused is " + str(paused).lower(),
        gen,
        inp.now,
    )
    status = api.ClusterVersionStatus(
        observed_generation=gen,
        phase=phase,
        current_stage=current,
        summary=summary,
        stages=stages,
        **compact_entries(pl.entries),
        conditions=conds,
    )
    return Plan(pl.actions, status, pl.events, pl.requeue)


def invalid(
    previous: api.ClusterVersionStatus | None,
    problems: Sequence[Problem],
    generation: int,
    now: datetime,
) -> Plan:
    """The plan for a spec that is invalid: no action, Ready=False with reason InvalidSpec."""
    previous = previous or api.ClusterVersionStatus()
    text = "; ".join(str(p) for p in problems[:5])
    if len(problems) > 5:
        text += f"; and {len(problems) - 5} more"
    conds = set_condition(
        list(previous.conditions or []), "Ready", False, "InvalidSpec", text, generation, now
    )
    conds = set_condition(conds, "Progressing", False, "InvalidSpec", text, generation, now)
    status = previous.model_copy(
        update={
            "phase": api.RolloutPhase.INVALID,
            "conditions": conds,
            "observed_generation": generation,
        }
    )
    return Plan([], status, [], None, list(problems))
