"""The pure decision of one UpdateRun step: pinned intents, fleet, holdings → new states, calls.

No I/O. The driver (orchestrator.driver) observes, calls `decide`, writes every changed
ClusterUpgrade (intent before call) and only then makes the calls. The same function runs in the
product and inside the adversarial simulation (tests/sim), so what the simulation proves is what
ships. Each safety invariant of DESIGN.md has one place here:

1. Floor: `_admit` counts as down every cluster held by any run on the provider, every cluster
   with another caller's operation in flight, and every cluster unavailable or out of service;
   a re-issued service-out passes through `_admit_budget` again (`_follow`).
2. One owner: a cluster held by another run is never admitted (`held_by`).
3. Gate: service-in only from `_verify` after every applicable check passed successThreshold
   times (health state lives on the ClusterUpgrade); a stage completes only after its checks.
4. Never stranded: every active step has a start stamp and a bound (`StepTimeouts`); forgotten
   operations are re-asked with the same request id, then failed.
5. Refused before drained: a candidate is admitted only with a fresh ACCEPTED preflight.
6. No duplicate mutation: request ids are deterministic; the driver persists before calling.
7. Drift is local: a vanished, already-upgraded or busy cluster is recorded on its own upgrade.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from orchestrator import api
from orchestrator.conditions import format_time, parse_time
from orchestrator.fleet import ClusterObs, OpKind, OpObs, OpState, Snapshot, apply_succeeded
from orchestrator.health import judge
from plugins.sdk import versions

__all__ = [
    "ACTIVE",
    "FATAL_CODES",
    "MAX_REASKS",
    "PREFLIGHT_TTL",
    "Call",
    "Decision",
    "Floor",
    "Preflight",
    "RunInput",
    "Upgrade",
    "Verdict",
    "call_failed",
    "checks_for",
    "cluster_set_digest",
    "decide",
    "needs_upgrade",
    "request_id",
    "with_status",
]

U = api.UpgradePhase
#: Phases in which a cluster is held by its run (out of service or about to be).
ACTIVE = frozenset(
    {
        U.SERVICING_OUT,
        U.UPGRADING_CONTROL_PLANE,
        U.UPGRADING_NODE_POOLS,
        U.VERIFYING,
        U.SERVICING_IN,
    }
)
_DONE = frozenset({U.UPGRADED, U.SKIPPED})
_STEP_PHASE = {
    OpKind.SERVICE_OUT: U.SERVICING_OUT,
    OpKind.CONTROL_PLANE: U.UPGRADING_CONTROL_PLANE,
    OpKind.NODE_POOL: U.UPGRADING_NODE_POOLS,
    OpKind.SERVICE_IN: U.SERVICING_IN,
}
#: A forgotten operation is re-asked (same request id) this many times, then the cluster fails.
MAX_REASKS = 2
#: How long an ACCEPTED preflight verdict stands.
PREFLIGHT_TTL = timedelta(seconds=60)
#: How often a step in flight is looked at again even without news from the watch.
STEP_POLL_SECONDS = 10.0
#: How often to look again at a cluster waiting for availability or readiness.
POLL_SECONDS = 2.0


class Verdict(StrEnum):
    """A provider's answer to PreflightUpgrade."""

    ACCEPTED = "Accepted"
    REFUSED_LATER = "RefusedLater"
    REFUSED_NEVER = "RefusedNever"


@dataclass(frozen=True)
class Preflight:
    """One preflight answer, as the driver obtained it."""

    verdict: Verdict
    at: datetime
    reason: str = ""
    message: str = ""
    retry_after: float = 0.0


@dataclass(frozen=True)
class Upgrade:
    """One ClusterUpgrade as the engine sees it: the pinned spec and the mutable status."""

    name: str
    spec: api.ClusterUpgradeSpec
    status: api.ClusterUpgradeStatus

    @property
    def cluster_id(self) -> str:
        """The provider's cluster id."""
        return self.spec.cluster_id


@dataclass(frozen=True)
class Call:
    """One mutating plugin call, made only after its intent was persisted."""

    kind: OpKind
    cluster_id: str
    request_id: str
    upgrade: str
    version: str = ""
    node_pool: str = ""
    #: True when this re-issues a service-out (the driver re-checked the budget already here).
    reissue: bool = False


@dataclass(frozen=True)
class Floor:
    """Another live run on the provider that shares clusters with this one: its floor holds too."""

    run: str
    members: frozenset[str]
    required: int


@dataclass(frozen=True)
class RunInput:
    """Everything one decision reads."""

    key: str
    uid: str
    spec: api.UpdateRunSpec
    upgrades: Mapping[str, Upgrade]
    snapshot: Snapshot
    now: datetime
    #: Clusters (of this provider) held by other runs: cluster id → holder "namespace/name".
    held_by: Mapping[str, str] = field(default_factory=dict)
    preflight: Mapping[str, Preflight] = field(default_factory=dict)
    #: False when the provider does not implement PreflightUpgrade (nothing to ask).
    preflight_supported: bool = True
    stages: Sequence[api.StageStatus] = ()
    approved_stages: frozenset[str] = frozenset()
    retry_clusters: frozenset[str] = frozenset()
    skip_clusters: frozenset[str] = frozenset()
    #: Invariant 1 across runs: a service-out of a cluster shared with another live run keeps
    #: that run's floor too. The snapshot and held_by must cover the members of these runs.
    floors: Sequence[Floor] = ()


@dataclass
class Decision:
    """What to persist and what to call, in that order."""

    changed: dict[str, api.ClusterUpgradeStatus]
    calls: list[Call]
    preflight_needed: list[str]
    stages: list[api.StageStatus]
    counts: api.RunCounts
    phase: api.RunPhase
    message: str
    current_stage: str | None
    requeue_after: float | None
    events: list[tuple[str, str, str, bool]] = field(default_factory=list)
    retried: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)


def request_id(uid: str, cluster_id: str, step: str, target: str, attempt: int) -> str:
    """The deterministic request id of one step of one attempt: never started twice."""
    return f"{uid}:{cluster_id}:{step}:{target}:{attempt}"


def cluster_set_digest(items: Iterable[tuple[str, str, str]]) -> str:
    """sha256 over sorted (cluster id, control-plane target, node target) triples."""
    h = hashlib.sha256()
    for cid, cp, node in sorted(items):
        h.update(f"{cid}\0{cp}\0{node}\n".encode())
    return h.hexdigest()


def _pool_needing(obs: ClusterObs, spec: api.ClusterUpgradeSpec) -> str | None:
    for pool in obs.node_pools:
        if not versions.meets(pool.version, spec.pool_target(pool.name)):
            return pool.name
    return None


def needs_upgrade(obs: ClusterObs, spec: api.ClusterUpgradeSpec) -> bool:
    """Whether the cluster is short of its pinned targets (at or past target is done)."""
    return (
        not versions.meets(obs.control_plane_version, spec.version)
        or _pool_needing(obs, spec) is not None
    )


def _achieved(kind: OpKind, pool: str, version: str, obs: ClusterObs) -> bool:
    if kind is OpKind.SERVICE_OUT:
        return not obs.in_service
    if kind is OpKind.SERVICE_IN:
        return obs.in_service
    if kind is OpKind.CONTROL_PLANE:
        return versions.meets(obs.control_plane_version, version)
    found = next((p for p in obs.node_pools if p.name == pool), None)
    return found is None or versions.meets(found.version, version)


class _Run:
    """One decision in progress (private: `decide` is the public surface)."""

    def __init__(self, inp: RunInput) -> None:
        self.inp = inp
        self.now = inp.now
        self.stamp = format_time(inp.now)
        self.strategy = inp.spec.strategy or api.Strategy()
        self.timeouts = inp.spec.timeouts or api.StepTimeouts()
        self.status: dict[str, api.ClusterUpgradeStatus] = {
            n: u.status for n, u in inp.upgrades.items()
        }
        self.changed: dict[str, api.ClusterUpgradeStatus] = {}
        self.calls: list[Call] = []
        self.events: list[tuple[str, str, str, bool]] = []
        self.preflight_needed: list[str] = []
        self.requeue: float | None = None
        self.effective: dict[str, ClusterObs] = dict(inp.snapshot.clusters)
        self.stopping = inp.spec.state == api.RunState.STOP
        self.retried: set[str] = set()
        self.skipped: set[str] = set()

    # -- bookkeeping -----------------------------------------------------------------------

    def wake(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def set(self, u: Upgrade, **changes: object) -> api.ClusterUpgradeStatus:
        old = self.status[u.name]
        phase = changes.get("phase", old.phase)
        if phase != old.phase:
            changes.setdefault("last_transition_time", self.stamp)
            if phase in (U.UPGRADED, U.FAILED, U.SKIPPED):
                changes.setdefault("end_time", self.stamp)
            if old.phase == U.PENDING and phase in ACTIVE:
                changes.setdefault("start_time", old.start_time or self.stamp)
            msg = str(changes.get("message") or f"{old.phase.value} → {phase}")
            self.events.append((u.cluster_id, str(phase), msg, phase == U.FAILED))
        new = old.model_copy(update=changes)
        if new != old:
            self.status[u.name] = new
            self.changed[u.name] = new
        return new

    def timeout_of(self, kind: OpKind | None) -> timedelta:
        t = self.timeouts
        text = {
            OpKind.SERVICE_OUT: t.service_out,
            OpKind.CONTROL_PLANE: t.control_plane,
            OpKind.NODE_POOL: t.node_pool,
            OpKind.SERVICE_IN: t.service_in,
            None: t.ready,
        }[kind]
        return api.parse_duration(text)

    def checks_for(self, stage: str) -> api.HealthChecks | None:
        return checks_for(self.inp.spec, stage)

    # -- steps -------------------------------------------------------------------------------

    def issue(self, u: Upgrade, kind: OpKind, pool: str = "", reissue: bool = False) -> None:
        st = self.status[u.name]
        version = ""
        target = u.spec.version
        if kind is OpKind.CONTROL_PLANE:
            version = u.spec.version
        elif kind is OpKind.NODE_POOL:
            version = target = u.spec.pool_target(pool)
        step = f"{kind.value}/{pool}" if pool else kind.value
        rid = request_id(self.inp.uid, u.cluster_id, step, target, st.attempt)
        same = st.request_id == rid
        self.set(
            u,
            phase=_STEP_PHASE[kind],
            step=step,
            request_id=rid,
            operation_id=st.operation_id if same else None,
            step_start_time=st.step_start_time if same and st.step_start_time else self.stamp,
            reasks=st.reasks if same else 0,
            reason=None,
            message=None if not same else st.message,
        )
        self.calls.append(Call(kind, u.cluster_id, rid, u.name, version, pool, reissue))

    def fail(self, u: Upgrade, reason: str, message: str) -> None:
        self.set(u, phase=U.FAILED, reason=reason, message=message)

    def advance(self, u: Upgrade, obs: ClusterObs) -> None:
        """The next step of a cluster that has no operation in flight."""
        spec = u.spec
        if self.stopping:
            if not obs.in_service:
                self.verify(u, obs)
            else:
                self.set(
                    u,
                    phase=U.PENDING,
                    step=None,
                    request_id=None,
                    operation_id=None,
                    step_start_time=None,
                    reason="RunStopped",
                    message="run stopped; back in service",
                )
            return
        if obs.in_service and needs_upgrade(obs, spec):
            # Back in service yet short of target (someone serviced it in): start over, as a
            # new attempt (invariant 6: this attempt's service-out request id is spent; asked
            # again, the plugin would answer with the old, succeeded operation).
            self.set(
                u,
                phase=U.PENDING,
                attempt=self.status[u.name].attempt + 1,
                reasks=0,
                health=None,
                step=None,
                request_id=None,
                operation_id=None,
                step_start_time=None,
                reason="ServicedInElsewhere",
                message="serviced in outside this run before finishing; queued again",
            )
        elif not versions.meets(obs.control_plane_version, spec.version):
            self.issue(u, OpKind.CONTROL_PLANE)
        elif (pool := _pool_needing(obs, spec)) is not None:
            self.issue(u, OpKind.NODE_POOL, pool)
        elif not obs.in_service:
            self.verify(u, obs)
        else:
            self.set(
                u,
                phase=U.UPGRADED,
                step=None,
                reason="Upgraded",
                operation_id=None,
                message=f"runs {obs.control_plane_version}",
            )

    def verify(self, u: Upgrade, obs: ClusterObs) -> None:
        """Service in once available, pools ready and every applicable check passed."""
        st = self.status[u.name]
        entering = st.phase != U.VERIFYING
        since = self.stamp if entering or not st.step_start_time else st.step_start_time
        health = None if entering else st.health
        waiting = ""
        if not obs.available:
            waiting = "waiting for the cluster to become available"
            if obs.unavailable_reason:
                waiting += f": {obs.unavailable_reason}"
        elif not all(p.ready for p in obs.node_pools):
            waiting = "waiting for node pools to become ready"
        if waiting:
            if self.now - parse_time(since) > self.timeout_of(None):
                self.fail(u, "NotReady", f"{waiting} for longer than {self.timeouts.ready}")
                return
            self.set(
                u,
                phase=U.VERIFYING,
                step="verify",
                request_id=None,
                operation_id=None,
                step_start_time=since,
                message=waiting,
                health=None,
            )
            self.wake(POLL_SECONDS)
            return
        checks = self.checks_for(u.spec.stage)
        if checks is not None:
            if health is None:
                health = api.HealthState(since=self.stamp)
            verdict = judge(health, checks, self.now)
            if verdict.failed:
                self.set(u, health=health)
                self.fail(u, "HealthCheckFailed", verdict.message)
                return
            if not verdict.passed:
                self.set(
                    u,
                    phase=U.VERIFYING,
                    step="verify",
                    request_id=None,
                    operation_id=None,
                    step_start_time=since,
                    message=verdict.message,
                    health=health,
                )
                self.wake(max(verdict.wait_seconds, 0.0))
                return
        self.issue(u, OpKind.SERVICE_IN)

    def follow(self, u: Upgrade) -> None:
        """Carry one in-flight upgrade forward from what its operation did."""
        st = self.status[u.name]
        obs = self.effective.get(u.cluster_id)
        if st.phase == U.VERIFYING:
            if obs is None:
                self.gone(u, None)
                return
            self.verify(u, obs)
            return
        kind_text, _, pool = (st.step or "").partition("/")
        kind = OpKind(kind_text)
        version = u.spec.version if kind is OpKind.CONTROL_PLANE else u.spec.pool_target(pool)
        op = self._find_op(st.request_id or "", obs)
        if obs is None:
            self.gone(u, kind)
            return
        if op is None and _achieved(kind, pool, version, obs):
            self.advance(u, obs)
            return
        if op is None:
            if self.timed_out(u, kind):
                return
            reasks = st.reasks
            forgotten = (st.request_id or "") in self.inp.snapshot.forgotten
            if forgotten or st.operation_id:  # seen before, now unknown to the plugin
                if reasks >= MAX_REASKS:
                    self.fail(
                        u,
                        "OperationLost",
                        f"{st.step}: the plugin forgot operation "
                        f"{st.operation_id or st.request_id} {reasks + 1} times; "
                        "re-asking cannot help",
                    )
                    return
                reasks += 1
                self.set(
                    u,
                    reasks=reasks,
                    operation_id=None,
                    message=f"{st.step}: operation {st.operation_id or st.request_id} unknown "
                    "to the plugin; "
                    f"asked again with the same request id ({reasks}/{MAX_REASKS})",
                )
            if kind is OpKind.SERVICE_OUT and not needs_upgrade(obs, u.spec):
                # Invariants 5 and 7: upgraded elsewhere before our service-out took effect.
                self.set(
                    u,
                    phase=U.SKIPPED,
                    step=None,
                    step_start_time=None,
                    reason="AtTarget",
                    message=f"already at or past target ({obs.control_plane_version})",
                )
                return
            # Invariant 1: a service-out that is issued again passes admission again.
            if kind is OpKind.SERVICE_OUT and not self.budget_allows(u.cluster_id, own=u.name):
                self.set(
                    u,
                    phase=U.PENDING,
                    step=None,
                    step_start_time=None,
                    reason="WaitingForBudget",
                    message="service-out not confirmed and no availability budget "
                    "left now; waiting before asking again",
                )
                return
            self.calls.append(
                Call(
                    kind,
                    u.cluster_id,
                    st.request_id or "",
                    u.name,
                    version if kind in (OpKind.CONTROL_PLANE, OpKind.NODE_POOL) else "",
                    pool,
                    reissue=True,
                )
            )
            return
        if op.id != st.operation_id and (u.name in self.changed or op.state.terminal):
            # Recorded along with a write that happens anyway: progress alone costs no write
            # (at most two API writes per cluster step).
            self.set(u, operation_id=op.id)
        if not op.state.terminal:
            self.timed_out(u, kind)
            return
        if op.state == OpState.FAILED:
            self.fail(
                u,
                "OperationFailed",
                f"{st.step} failed: {op.error_code}: {op.error_message}".rstrip(": "),
            )
            return
        obs = apply_succeeded(obs, op)
        self.effective[u.cluster_id] = obs
        self.advance(u, obs)

    def _find_op(self, rid: str, obs: ClusterObs | None) -> OpObs | None:
        op = self.inp.snapshot.operations.get(rid)
        if op is not None:
            return op
        cur = obs.current_operation if obs is not None else None
        return cur if cur is not None and cur.request_id == rid else None

    def timed_out(self, u: Upgrade, kind: OpKind) -> bool:
        st = self.status[u.name]
        if not st.step_start_time:
            return False
        bound = self.timeout_of(kind)
        left = parse_time(st.step_start_time) + bound - self.now
        if left < timedelta(0):
            self.fail(u, "StepTimedOut", f"{st.step} did not finish within {bound}")
            return True
        self.wake(max(1.0, min(left.total_seconds(), STEP_POLL_SECONDS)))
        return False

    def gone(self, u: Upgrade, kind: OpKind | None) -> None:
        st = self.status[u.name]
        start = st.step_start_time or self.stamp
        if self.now - parse_time(start) > self.timeout_of(kind):
            # Invariant 7: drift is recorded on this cluster's upgrade; the run goes on.
            self.set(
                u,
                phase=U.SKIPPED,
                reason="ClusterGone",
                message=f"{st.step}: cluster left the plugin's inventory mid-upgrade and did "
                "not come back in time; if it returns, check whether it is in service",
            )
            return
        self.set(
            u,
            step_start_time=start,
            message=f"{st.step}: cluster is not in the plugin's inventory; waiting",
        )
        self.wake(POLL_SECONDS)

    # -- admission -------------------------------------------------------------------------

    def holder(self, cid: str) -> str | None:
        return self.inp.held_by.get(cid)

    def own_held(self) -> dict[str, str]:
        """This run's held clusters now: cluster id → upgrade name."""
        return {
            self.inp.upgrades[n].cluster_id: n for n, s in self.status.items() if s.phase in ACTIVE
        }

    def down(self, cid: str, held: Mapping[str, str], own: str | None = None) -> bool:
        """Counted as down by admission: held (by anyone), foreign op, unavailable, out."""
        obs = self.effective.get(cid)
        if obs is None or not obs.available or not obs.in_service:
            return True
        if self.holder(cid) is not None:
            return True
        if cid in held and held[cid] != own:
            return True
        cur = obs.current_operation
        return cur is not None and not cur.state.terminal and not self._ours(cur)

    def _ours(self, op: OpObs) -> bool:
        return op.request_id.startswith(f"{self.inp.uid}:")

    def budget(self) -> int:
        """Admissions the floor allows now (over this run's clusters)."""
        held = self.own_held()
        free = sum(1 for u in self.inp.upgrades.values() if not self.down(u.cluster_id, held))
        return free - self.inp.spec.required_available_count

    def budget_allows(self, cid: str, own: str) -> bool:
        """Whether cid may (again) be taken out: the floor holds without it."""
        held = self.own_held()
        free = sum(
            1
            for u in self.inp.upgrades.values()
            if u.cluster_id != cid and not self.down(u.cluster_id, held, own)
        )
        if free < self.inp.spec.required_available_count:
            return False
        return all(
            sum(1 for x in f.members if x != cid and not self.down(x, held, own)) >= f.required
            for f in self.inp.floors
            if cid in f.members
        )

    def floor_budgets(self) -> list[int]:
        """Admissions each other run's floor allows now (over that run's clusters)."""
        held = self.own_held()
        return [
            sum(1 for cid in f.members if not self.down(cid, held)) - f.required
            for f in self.inp.floors
        ]


def checks_for(spec: api.UpdateRunSpec, stage: str) -> api.HealthChecks | None:
    """The health checks that apply to a stage's clusters: the stage's own, else the run's."""
    for st in (spec.strategy.stages if spec.strategy else None) or []:
        if st.name == stage and st.health_checks is not None:
            return st.health_checks
    return spec.health_checks


def _limit(value: int | str | None, members: int) -> int:
    return members if value is None else api.parse_max_concurrency(value, members)


def decide(inp: RunInput) -> Decision:
    """One step of a run. Pure: the caller persists `changed` before making `calls`."""
    run = _Run(inp)
    by_stage: dict[int, list[Upgrade]] = {}
    for u in sorted(inp.upgrades.values(), key=lambda x: (x.spec.stage_index, x.cluster_id)):
        by_stage.setdefault(u.spec.stage_index, []).append(u)
    # People first: skips, then retries (each consumed once by the driver).
    for u in inp.upgrades.values():
        st = run.status[u.name]
        if u.cluster_id in inp.skip_clusters and st.phase in (U.PENDING, U.BLOCKED, U.FAILED):
            run.set(
                u,
                phase=U.SKIPPED,
                reason="SkippedByUser",
                message=f"skipped by {api.ANNOTATION_SKIP_CLUSTERS}",
            )
            run.skipped.add(u.cluster_id)
        elif u.cluster_id in inp.retry_clusters and st.phase in (U.FAILED, U.BLOCKED):
            run.set(
                u,
                phase=U.PENDING,
                attempt=st.attempt + 1,
                step=None,
                request_id=None,
                operation_id=None,
                reasks=0,
                health=None,
                step_start_time=None,
                reason="Retry",
                message=f"retry requested (attempt {st.attempt + 2})",
            )
            run.retried.add(u.cluster_id)
            obs = inp.snapshot.clusters.get(u.cluster_id)
            if st.step and obs is not None and not obs.in_service and not run.holder(u.cluster_id):
                # Invariant 4: the failed attempt took it out; the retry keeps it (no new
                # service-out, no budget) and `follow` carries it on from where it stands.
                run.set(
                    u,
                    phase=U.SERVICING_OUT,
                    step=OpKind.SERVICE_OUT.value,
                    request_id=request_id(
                        inp.uid,
                        u.cluster_id,
                        OpKind.SERVICE_OUT.value,
                        u.spec.version,
                        st.attempt + 1,
                    ),
                    step_start_time=run.stamp,
                )
    for u in inp.upgrades.values():
        if run.status[u.name].phase in ACTIVE:
            run.follow(u)
    # A failed cluster this run took out stays ours: if it is back in service, it is released.
    stages_spec = run.strategy.stages or []
    names = [s.name for s in stages_spec] or ["default"]
    prev = {s.name: s for s in inp.stages}
    on_failure = run.strategy.on_failure
    any_failed = any(s.phase == U.FAILED for s in run.status.values())
    halted = any_failed and on_failure == api.OnFailure.HALT
    stage_status: list[api.StageStatus] = []
    active_index: int | None = None
    blocked = ""
    for index, name in enumerate(names):
        members = by_stage.get(index, [])
        spec_stage = stages_spec[index] if stages_spec else None
        phases = [run.status[u.name].phase for u in members]
        n_done = sum(1 for p in phases if p in _DONE)
        n_failed = sum(1 for p in phases if p == U.FAILED)
        n_never = sum(
            1
            for u in members
            if run.status[u.name].phase == U.BLOCKED and run.status[u.name].reason == "Refused"
        )
        tolerated = n_failed + n_never if on_failure == api.OnFailure.CONTINUE else 0
        complete = n_done + tolerated == len(members)
        old = prev.get(name)
        start = old.start_time if old else None
        completion = old.completion_time if old else None
        health = old.health if old else None
        phase = api.StagePhase.PENDING
        last = index + 1 == len(names)
        if active_index is None and complete:
            checks = None if last else run.checks_for(name)
            verdict = judge(health, checks, inp.now) if checks is not None else None
            if verdict is not None and not verdict.passed:
                if health is None:
                    health = api.HealthState(since=run.stamp)
                    verdict = judge(health, checks, inp.now) if checks else verdict
                active_index = -1
                if verdict.failed:
                    phase = api.StagePhase.FAILED
                    halted = True
                    blocked = f"stage {name}: {verdict.message}"
                else:
                    phase = api.StagePhase.VERIFYING
                    blocked = f"stage {name}: {verdict.message}"
                    run.wake(max(verdict.wait_seconds, 0.5))
            else:
                phase = api.StagePhase.COMPLETED
                completion = completion or run.stamp
                soak = spec_stage.soak_time if spec_stage else None
                if soak and not last:
                    left = parse_time(completion) + api.parse_duration(soak) - inp.now
                    if left > timedelta(0):
                        phase = api.StagePhase.SOAKING
                        active_index = -1
                        blocked = f"stage {name} soaking for {int(left.total_seconds())}s more"
                        run.wake(left.total_seconds())
        elif active_index is None:
            active_index = index
            # Invariant 3: a stage that is incomplete again (a member retried) verifies anew.
            health = None
            if n_failed and on_failure == api.OnFailure.HALT:
                phase = api.StagePhase.FAILED
            elif n_never and n_done + n_never == len(members):
                # Invariant 5: all that is left of the stage is refused by the provider, which
                # waiting cannot change (onFailure Halt): the run halts and says why.
                phase = api.StagePhase.FAILED
                halted = True
                first = next(
                    u
                    for u in members
                    if run.status[u.name].phase == U.BLOCKED
                    and run.status[u.name].reason == "Refused"
                )
                blocked = (
                    f"{n_never} cluster(s) blocked; {first.cluster_id}: "
                    f"{run.status[first.name].message}"
                )
            elif (
                spec_stage is not None
                and spec_stage.approval == api.Approval.MANUAL
                and name not in inp.approved_stages
                and not start
            ):
                phase = api.StagePhase.AWAITING_APPROVAL
                blocked = (
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
                upgraded=n_done,
                failed=n_failed,
                start_time=start,
                completion_time=completion
                if phase in (api.StagePhase.COMPLETED, api.StagePhase.SOAKING)
                else None,
                health=health,
            )
        )
    current = names[active_index] if active_index is not None and active_index >= 0 else None
    if (
        active_index is not None
        and active_index >= 0
        and stage_status[active_index].phase == api.StagePhase.PROGRESSING
        and not halted
        and not run.stopping
        and not run.strategy.paused
    ):
        members = by_stage.get(active_index, [])
        spec_stage = stages_spec[active_index] if stages_spec else None
        value = (
            spec_stage.max_concurrency
            if spec_stage is not None and spec_stage.max_concurrency is not None
            else run.strategy.max_concurrency
        )
        limit = _limit(value, len(members))
        in_flight = sum(1 for s in run.status.values() if s.phase in ACTIVE)
        budget = run.budget()
        floor_budgets = run.floor_budgets()
        started = False
        waiting_budget = False
        for u in members:
            st = run.status[u.name]
            if st.phase not in (U.PENDING, U.BLOCKED):
                continue
            if st.phase == U.BLOCKED and st.reason == "Refused":
                continue
            obs = run.effective.get(u.cluster_id)
            if obs is None:
                run.set(
                    u,
                    phase=U.SKIPPED,
                    reason="ClusterGone",
                    message="not in the plugin's inventory when its turn came",
                )
                continue
            if not needs_upgrade(obs, u.spec):
                run.set(
                    u,
                    phase=U.SKIPPED,
                    reason="AtTarget",
                    message=f"already at or past target ({obs.control_plane_version})",
                )
                continue
            holder = run.holder(u.cluster_id)
            if holder is not None:
                run.set(
                    u,
                    phase=U.PENDING,
                    reason="HeldByAnotherRun",
                    message=f"held by UpdateRun {holder}; waiting for it to let go",
                )
                continue
            cur = obs.current_operation
            if cur is not None and not cur.state.terminal:
                run.set(
                    u,
                    phase=U.PENDING,
                    reason="ForeignOperation",
                    message=f"operation {cur.id} from another caller is in flight",
                )
                continue
            if (
                not obs.in_service
                and st.request_id
                and (
                    st.request_id
                    == request_id(
                        inp.uid, u.cluster_id, OpKind.SERVICE_OUT.value, u.spec.version, st.attempt
                    )
                )
            ):
                run.issue(u, OpKind.SERVICE_OUT)  # ours already (unconfirmed): resume it
                in_flight += 1
                continue
            if not obs.in_service:
                run.set(
                    u,
                    phase=U.PENDING,
                    reason="OutOfService",
                    message="out of service outside this run; waiting for it to return",
                )
                continue
            if in_flight >= limit:
                break
            # Invariant 1: an unavailable cluster costs budget too. It is down already, but once
            # taken out it stays down when it recovers, and then the floor must still hold.
            cost = 1
            shared = [i for i, f in enumerate(inp.floors) if u.cluster_id in f.members]
            if cost > budget or any(floor_budgets[i] < cost for i in shared):
                waiting_budget = True
                continue
            pre = inp.preflight.get(u.cluster_id)
            if inp.preflight_supported and (pre is None or inp.now - pre.at > PREFLIGHT_TTL):
                run.preflight_needed.append(u.cluster_id)
                budget -= cost
                for i in shared:
                    floor_budgets[i] -= cost
                in_flight += 1
                continue
            if pre is not None and pre.verdict == Verdict.REFUSED_NEVER:
                run.set(
                    u,
                    phase=U.BLOCKED,
                    reason="Refused",
                    message=f"the provider refuses this upgrade: {pre.reason}: {pre.message}",
                )
                continue
            if pre is not None and pre.verdict == Verdict.REFUSED_LATER:
                run.set(
                    u,
                    phase=U.BLOCKED,
                    reason="RefusedForNow",
                    message=f"the provider refuses this upgrade for now: {pre.reason}: "
                    f"{pre.message}",
                )
                run.wake(pre.retry_after or 30.0)
                continue
            budget -= cost
            for i in shared:
                floor_budgets[i] -= cost
            in_flight += 1
            started = True
            run.issue(u, OpKind.SERVICE_OUT)
        if waiting_budget and not blocked:
            blocked = (
                f"waiting for availability budget: {inp.spec.required_available_count} "
                "clusters must stay available and in service"
            )
            run.wake(POLL_SECONDS * 5)
        if started and not stage_status[active_index].start_time:
            stage_status[active_index] = stage_status[active_index].model_copy(
                update={"start_time": run.stamp}
            )
    return _summarise(run, stage_status, current, halted, blocked)


def _summarise(
    run: _Run, stages: list[api.StageStatus], current: str | None, halted: bool, blocked: str
) -> Decision:
    counts = {"pending": 0, "in_flight": 0, "upgraded": 0, "failed": 0, "blocked": 0, "skipped": 0}
    for st in run.status.values():
        key = {
            U.UPGRADED: "upgraded",
            U.FAILED: "failed",
            U.BLOCKED: "blocked",
            U.SKIPPED: "skipped",
            U.PENDING: "pending",
        }.get(st.phase, "in_flight")
        counts[key] += 1
    total = len(run.status)
    in_flight = counts["in_flight"]
    finished = all(s.phase == api.StagePhase.COMPLETED for s in stages)
    if run.stopping:
        phase = api.RunPhase.STOPPING if in_flight else api.RunPhase.STOPPED
        message = f"stopped by spec.state; {in_flight} cluster(s) finishing their step"
    elif finished and counts["failed"] + counts["blocked"] == 0 and in_flight == 0:
        phase = api.RunPhase.SUCCEEDED
        message = f"{counts['upgraded']} upgraded, {counts['skipped']} skipped of {total}"
    elif finished and in_flight == 0:
        phase = api.RunPhase.FAILED
        message = f"finished with {counts['failed']} failed and {counts['blocked']} blocked"
        why = sorted(
            (run.inp.upgrades[n].cluster_id, s.message or "")
            for n, s in run.status.items()
            if s.phase in (U.FAILED, U.BLOCKED)
        )
        if why:  # the run says why, not only how many
            message += f"; {why[0][0]}: {why[0][1]}"
    elif halted:
        phase = api.RunPhase.HALTED
        failed = sorted(
            (run.inp.upgrades[n].cluster_id, s.message or "")
            for n, s in run.status.items()
            if s.phase == U.FAILED
        )
        message = (
            f"halted: cluster {failed[0][0]} failed: {failed[0][1]}"
            if failed
            else f"halted: {blocked}"
        )
    else:
        phase = api.RunPhase.PROGRESSING
        message = blocked or (
            f"{counts['upgraded']}/{total} upgraded, {in_flight} in flight"
            + (f", stage {current}" if current else "")
        )
    return Decision(
        changed=run.changed,
        calls=run.calls,
        preflight_needed=run.preflight_needed,
        stages=stages,
        counts=api.RunCounts(total=total, **counts),
        phase=phase,
        message=message,
        current_stage=current,
        requeue_after=run.requeue,
        events=run.events,
        retried=run.retried,
        skipped=run.skipped,
    )


#: Codes after which asking again cannot help (the contract's error tables).
FATAL_CODES = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "UNIMPLEMENTED", "PERMISSION_DENIED", "UNAUTHENTICATED"}
)


def call_failed(
    status: api.ClusterUpgradeStatus,
    call: Call,
    code: str,
    retryable: bool,
    message: str,
    now: datetime,
) -> tuple[api.ClusterUpgradeStatus, float | None]:
    """The status after a mutating call failed, and when to look again (None: never).

    Fatal codes and non-retryable refusals fail (or, for a service-out that never happened,
    block) the cluster with the plugin's words; anything else keeps the intent (the same
    request id is asked again on the next reconcile, bounded by the step timeout).
    """
    stamp = format_time(now)
    text = f"{call.kind.value}: {code}: {message}"
    if code in FATAL_CODES or (code == "FAILED_PRECONDITION" and not retryable):
        if call.kind is OpKind.SERVICE_OUT and not call.reissue:
            update = {
                "phase": U.BLOCKED,
                "reason": "Refused",
                "step": None,
                "step_start_time": None,
                "message": f"refused before drain: {text}",
            }
        else:
            update = {"phase": U.FAILED, "reason": "Refused", "message": text, "end_time": stamp}
        return status.model_copy(update={**update, "last_transition_time": stamp}), None
    wait = 30.0 if code == "FAILED_PRECONDITION" else 2.0
    return status.model_copy(update={"message": f"will ask again: {text}"}), wait


def with_status(u: Upgrade, status: api.ClusterUpgradeStatus) -> Upgrade:
    """The upgrade with a new status (a helper for drivers and models)."""
    return replace(u, status=status)
