"""The pure decision of one UpdateRun step: pinned intents, fleet, holdings → new states, calls.

No I/O. The driver (orchestrator.driver) observes, calls `decide`, writes every changed
ClusterUpgrade (intent before call) and only then makes the calls. The same function runs in the
product and inside the adversarial simulation (tests/sim), so what the simulation proves is what
ships. Each safety invariant of DESIGN.md has one place here:

1. Floor: `_Run.may_service_out` (the one predicate every service-out passes: at admission,
   after a preUpgrade hook, and re-issued) keeps every floor that applies (`floor_allows`),
   counting as down every cluster held by any run on the provider, every cluster with another
   caller's operation in flight, and every cluster unavailable or out of service (`down`).
2. One owner: a cluster held by another run is never taken out (`may_service_out`, `held_by`).
3. Gate: service-in only from `_verify` after every applicable check passed successThreshold
   times (health state lives on the ClusterUpgrade); a stage completes only after its checks.
4. Never stranded: every active step has a start stamp and a bound (`StepTimeouts`); an
   operation the plugin forgot fails its step (never asked again: invariant 6).
5. Refused before drained: a cluster is taken out only with a fresh ACCEPTED preflight
   (`may_service_out`, also when the service-out comes later than its admission).
6. No duplicate mutation: request ids are deterministic; the driver persists before calling.
   Hooks likewise: a HookStatus Running with a deterministic id (`hook_id`) is persisted before
   the hook starts; an HTTP hook whose outcome a restart lost fails instead of being resent.
7. Drift is local: a vanished, already-upgraded or busy cluster is recorded on its own upgrade.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from orchestrator import api
from orchestrator.engine import windows
from orchestrator.engine.conditions import (
    PROVIDER_UNAVAILABLE,
    cause_first,
    format_time,
    get_condition,
    parse_time,
    set_condition,
)
from orchestrator.engine.health import judge
from orchestrator.engine.index import (
    ACTIVE,
    KEEPING,
    RETRY_WAITS,
    Quiet,
    RunIndex,
    Waiting,
    keeps_cluster,
    up_by_observation,
)
from orchestrator.engine.observations import (
    ClusterObs,
    OpKind,
    OpObs,
    OpState,
    Snapshot,
    apply_succeeded,
)
from orchestrator.engine.requester import retyped
from orchestrator.engine.transitions import PEOPLES_WORDS
from plugins.sdk import versions

__all__ = [
    "ACTIVE",
    "CONTROL_PLANE_PAST_TARGET",
    "FATAL_CODES",
    "HOOK_POLL_SECONDS",
    "KEEP_WATCH_SECONDS",
    "POST_HOOK",
    "PREFLIGHT_TTL",
    "PRE_HOOK",
    "PROVIDER_UNAVAILABLE",
    "RECOVER_GAVE_UP",
    "RECOVER_STEP",
    "SKIPPED_BY_PEOPLE",
    "UNREACHABLE_GRACE",
    "Call",
    "Decision",
    "Floor",
    "HookCall",
    "HookObs",
    "HookState",
    "Preflight",
    "RunInput",
    "Upgrade",
    "Verdict",
    "at_chained",
    "attempt_of",
    "awaits_checks",
    "brought_back",
    "call_failed",
    "chain_of",
    "checks_for",
    "cluster_set_digest",
    "control_plane_past_target",
    "counts_as_failure",
    "decide",
    "hook_id",
    "needs_upgrade",
    "request_id",
    "rests",
    "service_in_on_record",
    "short_of_target",
    "step_of",
    "target_of",
    "with_status",
]

U = api.UpgradePhase
#: The step timeouts of a run that sets none (one object: a memo compares it by identity).
_DEFAULT_TIMEOUTS = api.StepTimeouts()
_STEP_PHASE = {
    OpKind.SERVICE_OUT: U.SERVICING_OUT,
    OpKind.CONTROL_PLANE: U.UPGRADING_CONTROL_PLANE,
    OpKind.NODE_POOL: U.UPGRADING_NODE_POOLS,
    OpKind.SERVICE_IN: U.SERVICING_IN,
}
#: The step kinds by the name a status's `step` begins with.
_KIND_OF = {k.value: k for k in OpKind}
#: Phases in which an attempt has ended (`end_time` set).
ENDED = frozenset({U.UPGRADED, U.FAILED, U.SKIPPED})
#: Reasons of a Pending cluster that waits for the world to let it go (held elsewhere): the
#: run names one when nothing of it moves (invariant 4: it says what it waits for).
_HELD_ELSEWHERE = frozenset({"HeldByAnotherRun", "ForeignOperation", "OutOfService"})
#: What a Pending cluster can wait for that only the world ends: held elsewhere, or its
#: provider not answering (a run over several providers); an idle run names it (invariant 4).
_WORLD_WAITS = _HELD_ELSEWHERE | {PROVIDER_UNAVAILABLE}
#: How long an ACCEPTED preflight verdict stands.
PREFLIGHT_TTL = timedelta(seconds=60)
#: How often a step in flight is looked at again even without news from the watch.
STEP_POLL_SECONDS = 10.0
#: How often to look again at a cluster waiting for availability or readiness.
POLL_SECONDS = 2.0
#: How often a finished run that keeps clusters looks at them (`rests`).
KEEP_WATCH_SECONDS = 30.0
#: How often a running hook is looked at again even without news (a Job's status is polled).
HOOK_POLL_SECONDS = 5.0
#: The two hook kinds, as HookStatus.kind spells them.
PRE_HOOK = "preUpgrade"
POST_HOOK = "postUpgrade"
#: Hook messages kept in status and events (the hook's own words, cut).
HOOK_MESSAGE_MAX = 300
#: The ClusterUpgrade condition recording a control plane found past the pinned target
#: (invariant 7: upgraded outside the run, left there, done; never a failure).
CONTROL_PLANE_PAST_TARGET = "ControlPlanePastTarget"
#: The reason of a service-out held back by the floor (invariant 1).
WAITING_FOR_BUDGET = "WaitingForBudget"
#: What `_Run.may_service_out` answers while the provider is asked (nothing recorded).
PREFLIGHT_ASKED = "PreflightAsked"


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
    #: The run's control-plane target it was asked about ("": any; the request itself held only
    #: what was short of it: `short_of_target`): a verdict answers one target, so a cache
    #: shared by runs with other targets never lends one run another's answer.
    version: str = ""


class HookState(StrEnum):
    """What the hook executor knows of one hook id."""

    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    #: Nothing: a Job not created (yet), or an HTTP call whose outcome died with a process.
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class HookObs:
    """One hook's outcome as the executor observed it (by hook id)."""

    state: HookState
    message: str = ""


@dataclass(frozen=True)
class HookCall:
    """Start (or adopt, for a Job) one hook; made only after its intent was persisted."""

    kind: str
    upgrade: str
    cluster_id: str
    hook_id: str
    attempt: int


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
    #: Stage names of the skip-stages annotation (level-triggered, like approved_stages).
    skip_stages: frozenset[str] = frozenset()
    #: Who asked and why (the requested-by and reason annotations), recorded with skips.
    requested_by: str = ""
    reason: str = ""
    #: Invariant 1 across runs: a service-out of a cluster shared with another live run keeps
    #: that run's floor too. The snapshot and held_by must cover the members of these runs.
    floors: Sequence[Floor] = ()
    #: What the hook executor knows of the hooks recorded Running: hook id → outcome.
    hooks: Mapping[str, HookObs] = field(default_factory=dict)
    #: Clusters of `snapshot.unknown` by when their provider was first found not answering in
    #: the run's passes since it last answered (the driver's memory): a step in flight fails
    #: ProviderUnavailable only once that silence lasted UNREACHABLE_GRACE. Absent: no memory
    #: of it, only the step's bound counts.
    unknown_since: Mapping[str, datetime] = field(default_factory=dict)
    #: What the run's passes keep between them (engine.index; the driver's): the upgrades
    #: by phase and in order, brought up to date here. None: made from scratch (a full pass).
    index: RunIndex | None = field(default=None, compare=False)
    #: The names of `upgrades` that are not the very objects `index` last saw (the driver's:
    #: those whose health it recorded in this pass); only these are looked at. None: every
    #: object is compared.
    index_stale: frozenset[str] | None = field(default=None, compare=False)


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
    #: Hooks to start (after their HookStatus Running is on record), like `calls`.
    hook_calls: list[HookCall] = field(default_factory=list)
    #: Failures against the run's budget (None: no failure and no budget set).
    failures: api.FailureSummary | None = None
    #: When the next cluster may start, if clusters wait for time (notBefore, windows).
    next_start_time: str | None = None
    #: Why no cluster starts now, in a word: Paused, Stopped, Halted, AwaitingApproval,
    #: Soaking, Verifying, AvailabilityBudget, NotBefore, MaintenanceWindow (None: not waiting).
    waiting_reason: str | None = None
    #: For a finished phase, how many of the run's clusters its ended attempts keep
    #: (`keeps_cluster`; 0 while the run is live, when `rests` does not read it): a finished
    #: run that keeps one does not rest.
    keeping: int = 0
    #: The names in `changed` that are new service-outs (last in its order): each was decided
    #: on every other write of the decision (a failure, skip or retry on record, a cluster
    #: done, a stage complete), so none is written until those all took effect; one that
    #: conflicted leaves them for the next pass (the driver's `_write_all`).
    admissions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _NotNow:
    """Why a service-out is not asked for now (`_Run.may_service_out`): a ClusterUpgrade
    reason and its message."""

    reason: str
    message: str


def attempt_end(old: api.ClusterUpgradeStatus, now: str) -> str:
    """The endTime of an attempt that ends (or is recorded again) now: when its work ended. A
    cluster that had already ended keeps it (a person skipping it after it failed, or a refused
    service-in of a failed one under failedClusterPolicy), so a stage verified after that end
    stays verified."""
    return old.end_time if old.phase in ENDED and old.end_time else now


def _ended_since(
    members: Sequence[Upgrade], status: Mapping[str, api.ClusterUpgradeStatus], since: str
) -> bool:
    """Whether a member of a stage ended later than `since` (a stage analysis's start)."""
    start = parse_time(since)
    return any(
        (end := status[u.name].end_time) is not None and parse_time(end) > start for u in members
    )


def verdict_for(inp: RunInput, u: Upgrade) -> Preflight | None:
    """The provider's verdict on this upgrade if one stands: fresh (PREFLIGHT_TTL) and asked
    for this upgrade's target; None: ask again before anything is drained (invariant 5)."""
    pre = inp.preflight.get(u.cluster_id)
    if pre is None or inp.now - pre.at > PREFLIGHT_TTL:
        return None
    if pre.version and pre.version != u.spec.version:
        return None
    return pre


def request_id(uid: str, cluster_id: str, step: str, target: str, attempt: int) -> str:
    """The deterministic request id of one step of one attempt: never started twice."""
    return f"{uid}:{cluster_id}:{step}:{target}:{attempt}"


def _request_parts(request_id_: str) -> list[str] | None:
    """A request id (`request_id`) read back: [uid:cluster, step, target, attempt], or None
    when it is not one of ours."""
    parts = request_id_.rsplit(":", 3)
    return parts if len(parts) == 4 else None


def step_of(request_id_: str) -> str:
    """The step a request id (`request_id`) was made for: "serviceOut", "controlPlane",
    "nodePool/POOL", "recover" (a service-in after a failure)..."""
    parts = _request_parts(request_id_)
    return parts[1] if parts is not None else ""


def target_of(request_id_: str) -> str:
    """The target version a request id (`request_id`) was made for ("" when it is not one
    of ours)."""
    parts = _request_parts(request_id_)
    return parts[2] if parts is not None else ""


def attempt_of(request_id_: str) -> int | None:
    """The attempt a request id (`request_id`) was made for; None when it is not one of ours.
    An attempt may adopt an earlier attempt's request (a retry of a Failed cluster whose
    service-in back was asked: `_retry`), so this can be below the status's attempt."""
    parts = _request_parts(request_id_)
    return int(parts[3]) if parts is not None and parts[3].isdigit() else None


def hook_id(uid: str, cluster_id: str, kind: str, attempt: int) -> str:
    """The deterministic id of one hook of one attempt: the Job's name and the HTTP call's
    Idempotency-Key (a DNS label: at most 63 characters, readable, hashed for uniqueness)."""
    digest = hashlib.sha256(f"{uid}\0{cluster_id}\0{kind}\0{attempt}".encode()).hexdigest()
    base = re.sub(r"[^a-z0-9]+", "-", cluster_id.lower())[:28].strip("-") or "cluster"
    short = "pre" if kind == PRE_HOOK else "post"
    return f"{base}-{short}-{attempt % 10000}-{digest[:16]}"


def cluster_set_digest(items: Iterable[tuple[str, str, str]]) -> str:
    """sha256 over sorted (cluster id, control-plane target, node target) triples."""
    h = hashlib.sha256()
    for cid, cp, node in sorted(items):
        h.update(f"{cid}\0{cp}\0{node}\n".encode())
    return h.hexdigest()


def short_of_target(obs: ClusterObs, spec: api.ClusterUpgradeSpec) -> tuple[str, dict[str, str]]:
    """What of the cluster is still short of its pinned targets, as (control-plane target,
    node pool name → target): the control plane's target, or "" when it is at or past it (done:
    invariant 7, a control plane someone else upgraded past the target is never asked to go
    back), and each node pool below its target, in the plugin's order. This is what a
    preflight asks about and what the steps upgrade; with no control-plane target, the pools
    are judged against the version the control plane has (the pinned target is at most that)."""
    control_plane = "" if versions.meets(obs.control_plane_version, spec.version) else spec.version
    pools = {
        pool.name: target
        for pool in obs.node_pools
        if not versions.meets(pool.version, target := spec.pool_target(pool.name))
    }
    return control_plane, pools


def chain_of(uid: str, u: Upgrade) -> tuple[str, ...]:
    """The node-pool steps persisted to follow the one on record (status.nextRequestIds),
    each a request id this attempt makes itself for a pool of its spec; () when there are
    none, or when any is not (then the chain is not followed: each pool after the one on
    record gets an intent of its own)."""
    st = u.status
    chained = st.next_request_ids
    if not chained or not (st.step or "").startswith(f"{OpKind.NODE_POOL.value}/"):
        return ()
    for rid in chained:
        kind, _, pool = step_of(rid).partition("/")
        if kind != OpKind.NODE_POOL.value or rid != request_id(
            uid, u.cluster_id, f"{kind}/{pool}", u.spec.pool_target(pool), st.attempt
        ):
            return ()
    return tuple(chained)


def at_chained(status: api.ClusterUpgradeStatus, rid: str) -> dict[str, object]:
    """The status changes that put a chained node-pool step (`chain_of`) on record as the
    step in flight, the ones before it done; {} when rid is not chained. The engine writes
    them only with something else to write (a failure, a timeout): a step that starts from
    the chain costs no write."""
    chained = status.next_request_ids or []
    if rid not in chained:
        return {}
    rest = chained[chained.index(rid) + 1 :]
    return {
        "step": step_of(rid),
        "request_id": rid,
        "next_request_ids": rest or None,
        "operation_id": None,
    }


def needs_upgrade(obs: ClusterObs, spec: api.ClusterUpgradeSpec) -> bool:
    """Whether the cluster is short of its pinned targets (at or past target is done)."""
    control_plane, pools = short_of_target(obs, spec)
    return bool(control_plane or pools)


def control_plane_past_target(obs: ClusterObs, spec: api.ClusterUpgradeSpec) -> bool:
    """Whether the control plane is past the pinned target (someone else upgraded it: a
    release channel, a person); going to the target would be a downgrade."""
    return versions.is_downgrade(obs.control_plane_version, spec.version)


def _achieved(kind: OpKind, pool: str, version: str, obs: ClusterObs) -> bool:
    if kind is OpKind.SERVICE_OUT:
        return not obs.in_service
    if kind is OpKind.SERVICE_IN:
        return obs.in_service
    if kind is OpKind.CONTROL_PLANE:
        return versions.meets(obs.control_plane_version, version)
    found = next((p for p in obs.node_pools if p.name == pool), None)
    return found is None or versions.meets(found.version, version)


def _updated(
    old: api.ClusterUpgradeStatus, changes: Mapping[str, object]
) -> api.ClusterUpgradeStatus:
    """`old.model_copy(update=changes)`, made directly: what pydantic's shallow copy does for a
    model without private attributes or extra fields (checked below), without its generic
    dispatch; a pass makes one per status it changes. old itself when no field changes (what
    the models' own equality finds of the copy, by one comparison of the field values in C,
    without making the copy). tests/engine/test_index.py checks it against model_copy."""
    fields = old.__dict__
    values = fields.copy()
    values.update(changes)
    if values == fields:
        return old
    new = _new_model(api.ClusterUpgradeStatus)
    _set_slot(new, "__dict__", values)
    _set_slot(new, "__pydantic_fields_set__", old.__pydantic_fields_set__ | changes.keys())
    _set_slot(new, "__pydantic_extra__", None)
    _set_slot(new, "__pydantic_private__", None)
    return new


_new_model = object.__new__
_set_slot = object.__setattr__
if api.ClusterUpgradeStatus.__private_attributes__ or (
    api.ClusterUpgradeStatus.model_config.get("extra") != "forbid"
):  # `_updated` copies what a status has: its fields, nothing else
    raise TypeError("ClusterUpgradeStatus grew private attributes or extra fields: see _updated")


class _Statuses(dict[str, api.ClusterUpgradeStatus]):
    """The statuses as one decision changes them: those it set, else the input's (looked up
    when asked for, not copied per pass)."""

    def __init__(self, upgrades: Mapping[str, Upgrade]) -> None:
        super().__init__()
        self.upgrades = upgrades

    def __missing__(self, name: str) -> api.ClusterUpgradeStatus:
        status = self[name] = self.upgrades[name].status  # looked at again: kept
        return status


class _Run:
    """One decision in progress (private: `decide` is the public surface)."""

    def __init__(self, inp: RunInput, compare_all: bool = False) -> None:
        self.inp = inp
        self.now = inp.now
        self.stamp = format_time(inp.now)
        self.strategy = inp.spec.strategy or api.Strategy()
        self.timeouts = inp.spec.timeouts or _DEFAULT_TIMEOUTS
        #: The step bounds, parsed once per decision (`timeout_of`).
        self._bounds: dict[OpKind | None, timedelta] | None = None
        if inp.index is None:
            self.index = RunIndex.build(inp.uid, inp.upgrades, inp.snapshot.clusters, inp.held_by)
        else:
            # compare_all: every object, whatever the callers said changed (`decide`).
            snap = inp.snapshot
            self.index = inp.index
            stale = None if compare_all else inp.index_stale
            self.index.observe(inp.uid, inp.upgrades, stale, said=False)
            self.index.observe_world(
                snap.clusters,
                inp.held_by,
                snap.operations,
                self.timeouts,
                snap.token,
                None if compare_all else snap.changes,
            )
        #: The statuses by phase as this decision changes them (`set` keeps them): the index's
        #: own accounts, every move journaled and undone when the decision is taken (`decide`).
        self.phases = self.index.phases
        self.phases.journal = []
        #: How many were offered (Pending or Blocked) as the index last saw them (`_offer`).
        self.offered_before = self.phases.count(U.PENDING, U.BLOCKED)
        self.status = _Statuses(inp.upgrades)
        self.changed: dict[str, api.ClusterUpgradeStatus] = {}
        self.calls: list[Call] = []
        self.events: list[tuple[str, str, str, bool]] = []
        self.preflight_needed: list[str] = []
        self.requeue: float | None = None
        #: The earliest deadline of a step in flight this pass looked at (`wake_for_step`),
        #: taken into `requeue` when the decision is summed up (`woken`).
        self.step_due: datetime | None = None
        #: The observations this pass changed (`follow`: an operation that succeeded), by
        #: cluster id; `observed` reads them over the snapshot's.
        self.effective: dict[str, ClusterObs] = {}
        #: Clusters whose effective observation is not the snapshot's (`follow`).
        self.effective_changed: set[str] = set()
        self.stopping = inp.spec.state == api.RunState.STOP
        #: The run is past a failure budget as the statuses stood before this decision's
        #: follow-ups: a pre-hook that passes now does not lead to a drain (decide sets it).
        self.halted_hint = False
        self.retried: set[str] = set()
        self.skipped: set[str] = set()
        self.hook_calls: list[HookCall] = []
        #: The floors a service-out keeps (invariant 1): this run's, then each other live
        #: run's that shares clusters with it.
        self.floors: list[Floor] = [
            Floor(inp.key, self.index.members, inp.spec.required_available_count),
            *inp.floors,
        ]

    # -- bookkeeping -----------------------------------------------------------------------

    def wake(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def observed(self, cid: str) -> ClusterObs | None:
        """The cluster as this pass sees it: the snapshot's, or what an operation that
        succeeded in this pass made of it (None: not in the inventory)."""
        if cid in self.effective:
            return self.effective[cid]
        return self.inp.snapshot.clusters.get(cid)

    def set(self, u: Upgrade, **changes: object) -> None:
        old = self.status[u.name]
        if ("step" in changes or "request_id" in changes) and "next_request_ids" not in changes:
            changes["next_request_ids"] = None  # a step of its own: no chain follows it
        phase = changes.get("phase", old.phase)
        if phase != old.phase:
            changes.setdefault("last_transition_time", self.stamp)
            if phase in ENDED:
                changes.setdefault("end_time", attempt_end(old, self.stamp))
            if old.phase == U.PENDING and phase in ACTIVE:
                changes.setdefault("start_time", old.start_time or self.stamp)
            msg = str(changes.get("message") or f"{old.phase.value} → {phase}")
            self.events.append((u.cluster_id, str(phase), msg, phase == U.FAILED))
        # A status is built once, and only when it differs.
        new = _updated(old, changes)
        if new is old:
            return
        self.status[u.name] = new
        self.changed[u.name] = new
        self.phases.move(u, old, new)

    def lingering(self) -> list[Upgrade]:
        """The ended attempts that keep their cluster or whose retry waits (index.lingers),
        in the input's order."""
        return self.index.in_order(self.phases.lingering)

    def having(self, *phases: api.UpgradePhase) -> list[Upgrade]:
        """The upgrades in these phases now, in the input's order (what a walk over every
        upgrade that skips the others would visit)."""
        return self.index.in_order(self.phases.names(*phases))

    def timeout_of(self, kind: OpKind | None) -> timedelta:
        bounds = self._bounds
        if bounds is None:
            t = self.timeouts
            bounds = self._bounds = {
                OpKind.SERVICE_OUT: api.parse_duration(t.service_out),
                OpKind.CONTROL_PLANE: api.parse_duration(t.control_plane),
                OpKind.NODE_POOL: api.parse_duration(t.node_pool),
                OpKind.SERVICE_IN: api.parse_duration(t.service_in),
                None: api.parse_duration(t.ready),
            }
        return bounds[kind]

    def soak_of(self, u: Upgrade, step: str) -> timedelta:
        """The soak the provider reports for the pool of a node-pool step (a blue-green
        upgrade waits that long by its own settings): the step's bound grows by it."""
        obs = self.observed(u.cluster_id)
        pool = step.partition("/")[2]
        seconds = next(
            (p.soak_seconds for p in (obs.node_pools if obs is not None else ()) if p.name == pool),
            0,
        )
        return timedelta(seconds=seconds)

    def checks_for(self, stage: str) -> api.HealthChecks | None:
        return checks_for(self.inp.spec, stage)

    # -- steps -------------------------------------------------------------------------------

    def record_op(self, u: Upgrade, op_id: str | None) -> None:
        """Record the id of the operation that just succeeded (`advance`), if any."""
        if op_id is not None:
            self.set(u, operation_id=op_id)

    def issue(
        self,
        u: Upgrade,
        kind: OpKind,
        pool: str = "",
        reissue: bool = False,
        op_id: str | None = None,
        then: Sequence[str] = (),
    ) -> None:
        """Set the step of kind in flight and make its call. op_id: as for `advance` (kept
        only when the step is asked again with the same request id); then: the node pools to
        upgrade after this one, whose request ids this intent persists too (`chain_of`)."""
        st, cid = self.status[u.name], u.cluster_id
        version = ""
        target = u.spec.version
        if kind is OpKind.CONTROL_PLANE:
            version = u.spec.version
        elif kind is OpKind.NODE_POOL:
            version = target = u.spec.pool_target(pool)
        step = f"{kind.value}/{pool}" if pool else kind.value
        rid = request_id(self.inp.uid, cid, step, target, st.attempt)
        if kind is OpKind.NODE_POOL and rid in chain_of(self.inp.uid, with_status(u, st)):
            # Its turn in a chain of node pools: its intent is on record (invariant 6) with
            # the pool before it, whose success is all this pass would write; it is not
            # written (the step on record stays the chain's first: `chain_of`).
            self.calls.append(Call(kind, cid, rid, u.name, version, pool, reissue))
            return
        same = st.request_id == rid
        if same and op_id is not None:
            self.record_op(u, op_id)
            st = self.status[u.name]
        chained = [
            request_id(self.inp.uid, cid, f"{kind.value}/{p}", u.spec.pool_target(p), st.attempt)
            for p in then
        ]
        self.set(
            u,
            phase=_STEP_PHASE[kind],
            step=step,
            request_id=rid,
            next_request_ids=st.next_request_ids if same else chained or None,
            operation_id=st.operation_id if same else None,
            step_start_time=st.step_start_time if same and st.step_start_time else self.stamp,
            reason=None,
            message=None if not same else st.message,
        )
        self.calls.append(Call(kind, cid, rid, u.name, version, pool, reissue))

    def start_over(self, u: Upgrade, reason: str, message: str) -> None:
        """Pending again, as a new attempt, nothing of this one on record: its service-out
        request id is spent (invariant 6: asked again, the plugin would answer with the old,
        succeeded operation and the next step would run in service)."""
        self.set(
            u,
            phase=U.PENDING,
            attempt=self.status[u.name].attempt + 1,
            health=None,
            step=None,
            request_id=None,
            operation_id=None,
            step_start_time=None,
            reason=reason,
            message=message,
        )

    def fail(self, u: Upgrade, reason: str, message: str) -> None:
        self.set(u, phase=U.FAILED, reason=reason, message=message)

    def advance(self, u: Upgrade, obs: ClusterObs, op_id: str | None = None) -> None:
        """The next step of a cluster that has no operation in flight: only what is still short
        of target is upgraded (a control plane at or past it has no step). op_id: the operation
        that just succeeded, recorded on the status before the next step is set (a new step
        of another request id clears it: then it is not recorded at all, and no status is
        built only to be replaced)."""
        spec = u.spec
        self.note_drift(u, obs)
        if self.stopping and (not obs.in_service or needs_upgrade(obs, spec)):
            self.record_op(u, op_id)
            if not obs.in_service:
                self.verify(u, obs)
            else:
                # A resumed run starts it over as a new attempt.
                self.start_over(u, "RunStopped", "run stopped; back in service")
            return
        if obs.in_service and needs_upgrade(obs, spec):
            # Back in service yet short of target (someone serviced it in): start over.
            self.record_op(u, op_id)
            self.start_over(
                u,
                "ServicedInElsewhere",
                "serviced in outside this run before finishing; queued again",
            )
        elif not versions.meets(obs.control_plane_version, spec.version):
            self.issue(u, OpKind.CONTROL_PLANE, op_id=op_id)
        elif pools := list(short_of_target(obs, spec)[1]):
            # Every pool short of target in one intent (invariant 6): the ones after the
            # first start as the one before succeeds, without a write of their own.
            self.issue(u, OpKind.NODE_POOL, pools[0], op_id=op_id, then=pools[1:])
        elif not obs.in_service:
            self.record_op(u, op_id)
            self.verify(u, obs)
        else:
            self.record_op(u, op_id)
            drift = (
                f" (control plane found past the target {spec.version}; left there)"
                if control_plane_past_target(obs, spec)
                else ""
            )
            self.set(
                u,
                phase=U.UPGRADED,
                step=None,
                reason="Upgraded",
                operation_id=None,
                message=f"runs {obs.control_plane_version}{drift}",
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
        # The postUpgrade hook runs after the checks passed, before the service-in; only for a
        # cluster at its targets (a stopped run services in a half-done cluster without it).
        if not needs_upgrade(obs, u.spec) and self.start_hook(u, POST_HOOK):
            return
        if not self.service_in(u):
            self.verify_again(u, "health on record lacks successThreshold passes; verifying")

    def follow(self, u: Upgrade) -> None:
        """Carry one in-flight upgrade forward from what its operation did."""
        st, cid = self.status[u.name], u.cluster_id
        obs = self.observed(cid)
        if st.phase in (U.PRE_HOOK, U.POST_HOOK):
            self.follow_hook(u)
            return
        if obs is None and cid in self.inp.snapshot.unknown:
            kind_text = (st.step or "").partition("/")[0]
            self.unreachable(u, None if st.phase == U.VERIFYING else _KIND_OF.get(kind_text))
            return
        if st.phase == U.VERIFYING:
            if obs is None:
                self.gone(u, None)
                return
            self.verify(u, obs)
            return
        kind_text, _, pool = (st.step or "").partition("/")
        kind = _KIND_OF.get(kind_text) or OpKind(kind_text)
        rid, index = st.request_id or "", 0
        if obs is not None:
            rid, index, obs = self._in_chain(u, kind, obs)
            if index:
                pool = step_of(rid).partition("/")[2]
        version = u.spec.version if kind is OpKind.CONTROL_PLANE else u.spec.pool_target(pool)
        op = self._find_op(rid, obs)
        if obs is None:
            self.gone(u, kind)
            return
        if op is None and _achieved(kind, pool, version, obs):
            self.advance(u, obs)
            return
        if op is None:
            self._unseen_op(
                u,
                kind,
                rid,
                not index,
                obs,
                Call(kind, cid, rid, u.name, version, pool, reissue=True),
            )
            return
        record = (
            not index and op.id != st.operation_id and (u.name in self.changed or op.state.terminal)
        )
        if record and op.state != OpState.SUCCEEDED:
            # Recorded along with a write that happens anyway: progress alone costs no write
            # (at most two API writes per cluster step). One that succeeded is recorded by
            # `advance`, with the next step's write (dropped there by a step that clears it).
            self.set(u, operation_id=op.id)
        if not op.state.terminal:
            limits = self._limits(u, kind, rid)
            if (
                not self._past(u, limits, rid)
                and u.name not in self.changed
                and cid not in self.effective_changed
            ):
                # Nothing but time moves it on: later passes skip it while this holds.
                deadline = limits[0] if limits is not None else None
                memo = Quiet(st, obs, op, self.timeouts, deadline, rid)
                self.index.remember_quiet(u.name, memo)
            return
        if op.state == OpState.FAILED:
            self.set(u, **at_chained(st, rid))
            st = self.status[u.name]
            self.fail(
                u,
                "OperationFailed",
                f"{st.step} failed: {op.error_code}: {op.error_message}".rstrip(": "),
            )
            return
        obs = apply_succeeded(obs, op)
        self.effective[cid] = obs
        self.effective_changed.add(cid)
        self.advance(u, obs, op.id if record else None)

    def _in_chain(self, u: Upgrade, kind: OpKind, obs: ClusterObs) -> tuple[str, int, ClusterObs]:
        """Where the step on record stands when it heads a chain of node pools (`chain_of`):
        the request id to follow, its index in the chain (0: the step on record) and the
        observation with what the pools before it did applied. The last one started is
        followed (an operation known, or one the plugin forgot: never asked again), once every
        one before it is done; the next one starts from `advance`, as any step does (`issue`)."""
        st = self.status[u.name]
        rid = st.request_id or ""
        chained = chain_of(self.inp.uid, u)
        if not chained:
            return rid, 0, obs
        rids, index, done = (rid, *chained), 0, obs
        forgotten = self.inp.snapshot.forgotten
        while index + 1 < len(rids) and (
            rids[index + 1] in forgotten or self._find_op(rids[index + 1], done) is not None
        ):
            pool = step_of(rids[index]).partition("/")[2]
            at = self._find_op(rids[index], done)
            if at is not None and at.state == OpState.SUCCEEDED:
                done = apply_succeeded(done, at)
            elif at is not None or not _achieved(kind, pool, u.spec.pool_target(pool), done):
                break
            index += 1
        if not index:
            return rid, 0, obs
        if done is not obs:
            self.effective[u.cluster_id] = done
            self.effective_changed.add(u.cluster_id)
        return rids[index], index, done

    def _unseen_op(
        self, u: Upgrade, kind: OpKind, rid: str, on_record: bool, obs: ClusterObs, again: Call
    ) -> None:
        """A step in flight whose operation the plugin does not show: timed out, lost (the
        plugin forgot it: never asked again), or asked again (`again`; a service-out or a
        service-in through its gate once more). on_record: the step is the one on record, not
        a chained pool after it."""
        st = self.status[u.name]
        if self.timed_out(u, kind, rid):
            return
        if rid in self.inp.snapshot.forgotten or (on_record and st.operation_id):
            self.set(u, **at_chained(st, rid))
            st = self.status[u.name]
            # Seen, now unknown to the plugin (it restarted without durable operations):
            # it may have ended, failed or still run in the provider. Asking again would
            # start the step a second time (invariant 6); a person retries it instead.
            self.fail(
                u,
                "OperationLost",
                f"{st.step}: the plugin no longer knows operation "
                f"{st.operation_id or rid} (it restarted without durable "
                "operations); whether it ran is unknown, so it is not asked again. Check "
                "the cluster, then retry it with the annotation "
                "multicluster-ops.io/retry-clusters",
            )
            return
        if kind is OpKind.SERVICE_OUT and not needs_upgrade(obs, u.spec):
            # Invariants 5 and 7: upgraded elsewhere before our service-out took effect.
            self.at_target(u, obs)
            return
        if kind is OpKind.SERVICE_OUT:
            # Invariants 1, 2 and 5: a service-out asked again passes `may_service_out`
            # again (the world may have changed since it was decided: another run or
            # caller, the floor, what the provider says of what is short of target).
            self.service_out(u, obs, reissue=True, context="service-out not confirmed; ")
            return
        if kind is OpKind.SERVICE_IN:
            # Invariant 3: a service-in asked again passes the gate again (a failing
            # evaluation may have come after the passes it was decided on).
            if not self.service_in(u, reissue=True):
                self.verify_again(
                    u,
                    "service-in not confirmed and a health evaluation failed since it was "
                    "decided; verifying again",
                )
            return
        self.calls.append(again)

    def _find_op(self, rid: str, obs: ClusterObs | None) -> OpObs | None:
        op = self.inp.snapshot.operations.get(rid)
        if op is not None:
            return op
        cur = obs.current_operation if obs is not None else None
        return cur if cur is not None and cur.request_id == rid else None

    def bound_on_record(self, st: api.ClusterUpgradeStatus, kind: OpKind | None) -> timedelta:
        """The bound of the step on record when what is in flight cannot be told (its cluster
        or its provider unseen): a chain of node pools (`chain_of`) is bounded by the step
        timeout once for each pool of it, from the first one's start."""
        bound = self.timeout_of(kind)
        if kind is OpKind.NODE_POOL and st.next_request_ids:
            bound *= 1 + len(st.next_request_ids)
        return bound

    def _limits(
        self, u: Upgrade, kind: OpKind, rid: str = ""
    ) -> tuple[datetime, timedelta, timedelta] | None:
        """When the step on record times out, its bound and the provider's soak the bound grows
        by (None: the step's start is not on record, so it never times out). rid: a chained
        node pool's (`chain_of`): the chain started when the first pool did, so the bound
        and the soak count once for each pool up to this one."""
        st = self.status[u.name]
        if not st.step_start_time:
            return None
        steps = [st.step or ""]
        if rid and rid != st.request_id and rid in (chained := st.next_request_ids or []):
            steps += [step_of(r) for r in chained[: chained.index(rid) + 1]]
        bound = self.timeout_of(kind) * len(steps)
        soak = timedelta(0)
        if kind is OpKind.NODE_POOL:
            soak = sum((self.soak_of(u, step) for step in steps), timedelta(0))
        return parse_time(st.step_start_time) + bound + soak, bound, soak

    def wake_for_step(self, deadline: datetime) -> None:
        """Look again at a step in flight in time for its deadline (at most STEP_POLL_SECONDS;
        only the earliest counts, and it is counted once: `woken`)."""
        if self.step_due is None or deadline < self.step_due:
            self.step_due = deadline

    def woken(self) -> float | None:
        """When to look again: `requeue`, and the earliest step deadline (`wake_for_step`)."""
        if self.step_due is not None:
            left = self.step_due - self.now
            self.wake(max(1.0, min(left.total_seconds(), STEP_POLL_SECONDS)))
            self.step_due = None
        return self.requeue

    def timed_out(self, u: Upgrade, kind: OpKind, rid: str = "") -> bool:
        """Whether the step in flight (rid: as for `_limits`) is past its deadline: then it
        fails; else the pass looks again in time for the deadline."""
        return self._past(u, self._limits(u, kind, rid), rid)

    def _past(
        self, u: Upgrade, limits: tuple[datetime, timedelta, timedelta] | None, rid: str
    ) -> bool:
        """`timed_out` on the step's `_limits` already at hand (`follow` keeps the deadline
        for its memo)."""
        if limits is None:
            return False
        deadline, bound, soak = limits
        st = self.status[u.name]
        if deadline - self.now < timedelta(0):
            self.set(u, **at_chained(st, rid))
            st = self.status[u.name]
            within = (
                f"{bound + soak} ({bound} + {soak} of the provider's own soak)"
                if soak
                else f"{bound}"
            )
            self.fail(u, "StepTimedOut", f"{st.step} did not finish within {within}")
            return True
        self.wake_for_step(deadline)
        return False

    def silent(self, cid: str) -> bool:
        """Whether the provider of a cluster of `snapshot.unknown` has answered none of the
        run's reads for UNREACHABLE_GRACE (True without the driver's memory of since when):
        only then is it down. Before, a read it failed is one of several (a flapping plugin:
        simulation seeds 137463, 1121), and what is known of the cluster stands."""
        since = self.inp.unknown_since.get(cid)
        return since is None or self.now - since >= UNREACHABLE_GRACE

    def unseen_health(self, u: Upgrade) -> dict[str, None]:
        """While a cluster awaiting its checks cannot be seen (it left the inventory, or its
        provider does not answer), its health is dropped, as while it is unavailable: the checks
        count anew once it is seen, and never fail on the window its absence spent (invariant 7:
        drift is recorded as drift; simulation seed 92214). A provider that failed a read but has
        not been silent for UNREACHABLE_GRACE (`silent`) keeps it: no evaluation was missed."""
        st = self.status[u.name]
        if not awaits_checks(st) or st.health is None:
            return {}
        if u.cluster_id in self.inp.snapshot.unknown and not self.silent(u.cluster_id):
            return {}
        return {"health": None}

    def unreachable(self, u: Upgrade, kind: OpKind | None) -> None:
        """A cluster in flight whose provider cannot be asked now (Snapshot.unknown): nothing
        is decided on it (what its operation did is unknown) until the provider answers; it
        waits within its step's bound and UNREACHABLE_GRACE past it (invariant 4), then fails
        with the reason. It is never taken for gone: it did not leave the inventory."""
        st = self.status[u.name]
        why = self.inp.snapshot.unknown[u.cluster_id]
        start = st.step_start_time or self.stamp
        what = st.step or (st.phase.value if st.phase else "step")
        silent = self.silent(u.cluster_id)
        if (
            silent
            and self.now - parse_time(start) > self.bound_on_record(st, kind) + UNREACHABLE_GRACE
        ):
            self.fail(
                u,
                PROVIDER_UNAVAILABLE,
                f"{what}: its provider did not answer within the step's bound: {why}",
            )
            return
        self.set(
            u,
            step_start_time=start,
            message=f"{what}: waiting for its provider (counted as unavailable): {why}",
            **self.unseen_health(u),
        )
        self.wake(POLL_SECONDS)

    def to_follow(self) -> list[Upgrade]:
        """The clusters in flight to follow in this pass, in the input's order: all but those
        a `quiet` memo stands for (following them would only wait for their operations:
        engine.index drops a memo when its status, observation, operation or the timeouts
        change, and this pass drops those it changed and those whose step timed out). They
        wait here, as `timed_out` would have each: until the earliest deadline."""
        index = self.index
        for name in self.changed:
            index.drop_quiet(name)
        while (due := index.next_deadline()) is not None and due[0] - self.now < timedelta(0):
            index.drop_quiet(due[1])  # timed out: followed, it fails
        if due is not None:
            self.wake_for_step(due[0])
        return index.in_order(index.loud())

    def gone(self, u: Upgrade, kind: OpKind | None) -> None:
        st = self.status[u.name]
        start = st.step_start_time or self.stamp
        if self.now - parse_time(start) > self.bound_on_record(st, kind):
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
            **self.unseen_health(u),
        )
        self.wake(POLL_SECONDS)

    # -- hooks -------------------------------------------------------------------------------

    def hook_spec(self, kind: str) -> api.Hook | None:
        """The run's hook of a kind, if any."""
        hooks = self.strategy.hooks
        if hooks is None:
            return None
        return hooks.pre_upgrade if kind == PRE_HOOK else hooks.post_upgrade

    def start_hook(self, u: Upgrade, kind: str) -> bool:
        """Enter the hook phase of `kind`: record the intent (HookStatus Running, id of this
        attempt) and ask for the hook to start, or resume the one this attempt recorded. False
        when the run has no such hook or this attempt's already succeeded (go on without it).

        Invariant 6 for hooks: an HTTP hook is started only when its intent is new; a Job is
        asked for again by its deterministic name (created, or adopted if it exists)."""
        spec = self.hook_spec(kind)
        st = self.status[u.name]
        hid = hook_id(self.inp.uid, u.cluster_id, kind, st.attempt)
        recorded = st.hook if st.hook is not None and st.hook.id == hid else None
        if spec is None or (recorded is not None and recorded.phase == api.HookPhase.SUCCEEDED):
            return False
        hook = recorded or api.HookStatus(kind=kind, id=hid, start_time=self.stamp)
        self.set(
            u,
            phase=U.PRE_HOOK if kind == PRE_HOOK else U.POST_HOOK,
            step=kind,
            request_id=None,
            operation_id=None,
            step_start_time=hook.start_time,
            reason=None,
            message=f"{kind} hook {hid} running",
            hook=hook,
        )
        if recorded is None or spec.job is not None:
            self.hook_calls.append(HookCall(kind, u.name, u.cluster_id, hid, st.attempt))
        self.wake(HOOK_POLL_SECONDS)
        return True

    def follow_hook(self, u: Upgrade) -> None:
        """Carry a cluster in a hook phase on from what the executor observed (bounded by
        Hook.timeout: invariant 4)."""
        st = self.status[u.name]
        kind = PRE_HOOK if st.phase == U.PRE_HOOK else POST_HOOK
        spec = self.hook_spec(kind)
        hook = st.hook
        if spec is None or hook is None or hook.kind != kind:
            self.after_hook(u, kind)  # the hook is configured no more: go on without it
            return
        if hook.phase == api.HookPhase.SUCCEEDED:
            self.after_hook(u, kind)
            return
        seen = self.inp.hooks.get(hook.id, HookObs(HookState.UNKNOWN))
        if seen.state == HookState.SUCCEEDED:
            done = hook.model_copy(
                update={"phase": api.HookPhase.SUCCEEDED, "message": _cut(seen.message) or None}
            )
            self.set(u, hook=done, message=f"{kind} hook {hook.id} succeeded")
            self.after_hook(u, kind)
            return
        if seen.state == HookState.FAILED:
            self.hook_failed(u, kind, seen.message or "failed")
            return
        bound = api.parse_duration(spec.timeout)
        left = parse_time(hook.start_time) + bound - self.now
        if left < timedelta(0):
            self.hook_failed(u, kind, f"did not finish within {spec.timeout}")
            return
        if seen.state == HookState.UNKNOWN:
            if spec.job is None:
                # Sent before a restart, or not: sending it again could run it twice.
                self.hook_failed(
                    u,
                    kind,
                    "hook outcome unknown after a restart; retry the cluster to run it again",
                )
                return
            # A Job not created yet (a crash between intent and create): create or adopt it.
            self.hook_calls.append(HookCall(kind, u.name, u.cluster_id, hook.id, st.attempt))
        self.wake(max(1.0, min(left.total_seconds(), HOOK_POLL_SECONDS)))

    def note_drift(self, u: Upgrade, obs: ClusterObs) -> None:
        """Invariant 7: a control plane found past the pinned target (upgraded outside this
        run) is recorded on the cluster's ClusterUpgrade as a condition; it is done, not a
        failure, and nothing asks it to go back."""
        if not control_plane_past_target(obs, u.spec):
            return
        st = self.status[u.name]
        message = (
            f"control plane found at {obs.control_plane_version}, past the target "
            f"{u.spec.version}: upgraded outside this run (a release channel or a person); "
            "left there and counted as done, not as a failure; node pools below their targets "
            "are still upgraded to them"
        )
        old = get_condition(st.conditions, CONTROL_PLANE_PAST_TARGET)
        if old is not None and old.status == "True" and old.message == message:
            return
        conds = list(st.conditions or [])
        conds = set_condition(
            conds, CONTROL_PLANE_PAST_TARGET, True, "UpgradedOutsideRun", message, None, self.now
        )
        self.set(u, conditions=conds)

    def at_target(self, u: Upgrade, obs: ClusterObs) -> None:
        """Invariant 7: already at or past its target (upgraded elsewhere): Skipped, no step."""
        self.note_drift(u, obs)
        self.set(
            u,
            phase=U.SKIPPED,
            step=None,
            step_start_time=None,
            reason="AtTarget",
            message=f"already at or past target ({obs.control_plane_version})",
        )

    def hook_failed(self, u: Upgrade, kind: str, message: str) -> None:
        """The hook failed or timed out: the cluster fails with the hook's own words."""
        hook = self.status[u.name].hook
        assert hook is not None  # only called for a recorded hook
        text = _cut(message)
        self.set(u, hook=hook.model_copy(update={"phase": api.HookPhase.FAILED, "message": text}))
        if kind == PRE_HOOK:
            # Never taken out by this attempt: no step on record, so neither a retry nor the
            # failed-cluster policy takes it for one of ours that is out of service.
            self.set(u, step=None, step_start_time=None)
        reason = "PreUpgradeHookFailed" if kind == PRE_HOOK else "PostUpgradeHookFailed"
        self.fail(u, reason, f"{kind} hook {hook.id}: {text}")

    def after_hook(self, u: Upgrade, kind: str) -> None:
        """The step after a hook: the service-out (pre) or the service-in (post)."""
        obs = self.observed(u.cluster_id)
        if obs is None and u.cluster_id in self.inp.snapshot.unknown:
            self.unreachable(u, None)
            return
        if obs is None:
            self.gone(u, None)
            return
        if kind == POST_HOOK:
            if not self.service_in(u):
                self.verify_again(u, "health changed during the postUpgrade hook; verifying")
            return
        wait = ""
        reason = ""
        if self.stopping:
            reason, wait = "RunStopped", "run stopped; still in service"
        elif self.halted_hint:
            reason, wait = "RunHalted", "the run halted on its failure budget; still in service"
        elif self.strategy.paused:
            reason, wait = "Paused", "the run is paused; still in service"
        elif not needs_upgrade(obs, u.spec):
            self.at_target(u, obs)
            return
        if wait:
            self.set(
                u,
                phase=U.PENDING,
                step=None,
                step_start_time=None,
                reason=reason,
                message=f"{kind} hook passed; {wait}",
            )
            self.wake(POLL_SECONDS)
            return
        # A hook may take minutes: owner, floor and a fresh verdict are asked again at the drain.
        self.service_out(u, obs, context=f"{kind} hook passed; ")

    def may_service_in(self, u: Upgrade) -> bool:
        """Invariant 3's one home: a cluster may be serviced in only while the health on record
        has successThreshold passes in a row of every check that applies to it (True without
        checks, and without a health record: nothing was decided on one). Every service-in, a
        first ask or a re-ask, of an attempt or of a failed cluster's recovery, goes through
        `service_in`, which asks this."""
        checks = self.checks_for(u.spec.stage)
        health = self.status[u.name].health
        return checks is None or health is None or health.passes >= checks.success_threshold

    def service_in(self, u: Upgrade, request: str | None = None, reissue: bool = False) -> bool:
        """The one place a service-in is asked for, and only if `may_service_in`; False (nothing
        asked) otherwise. request: the request id of a failed cluster's recovery
        (failedClusterPolicy); reissue: the attempt's own service-in, asked again."""
        if not self.may_service_in(u):
            return False
        if request is None and not reissue:
            self.issue(u, OpKind.SERVICE_IN)
            return True
        rid = request if request is not None else self.status[u.name].request_id or ""
        self.calls.append(Call(OpKind.SERVICE_IN, u.cluster_id, rid, u.name, reissue=reissue))
        return True

    def verify_again(self, u: Upgrade, message: str) -> None:
        """Back to Verifying: the service-in was not asked (`may_service_in` failed)."""
        self.set(
            u,
            phase=U.VERIFYING,
            step="verify",
            request_id=None,
            operation_id=None,
            step_start_time=self.stamp,
            message=message,
        )
        self.wake(POLL_SECONDS)

    # -- service-out -----------------------------------------------------------------------

    def may_service_out(
        self, u: Upgrade, obs: ClusterObs, *, counted: list[int] | None = None, context: str = ""
    ) -> _NotNow | None:
        """Invariants 1, 2 and 5's one home: whether this run may take the cluster out of
        service now. None: it may (the floor's cost is taken from `counted`); otherwise the wait
        or refusal, recorded on the ClusterUpgrade. Every service-out, a first ask at admission,
        the drain after a preUpgrade hook, or a re-ask after a call that did not take effect,
        goes through `service_out`, which asks this.

        One order of checks, each one only for a cluster the ones before it let through:
        1. owner (invariant 2): another run holds it (`HeldByAnotherRun`, naming the holder);
        2. another operation in flight on it (`ForeignOperation`): someone is acting on it;
        3. out of service outside this run (`OutOfService`): someone else took it out.
           These three say whose the cluster is, whatever the counts: a cluster that is not
           ours to touch costs no budget, no provider call and no refusal on record, and its
           wait names what it waits for (invariant 4).
        4. floor (invariant 1, `floor_allows`): no availability budget (`WaitingForBudget`),
           before the preflight so that no provider call is spent, and no verdict ages, on a
           cluster the floor would not let go, and so that an admission pass reserves budget
           for the clusters it asks about;
        5. preflight (invariant 5): a fresh ACCEPTED verdict on what is short of target; last,
           as it is the only check that asks the world (the driver asks, then decides again
           with the answer: `PreflightAsked`, nothing recorded), and the verdict must be fresh
           at the drain; REFUSED_NEVER → Blocked `Refused`, REFUSED_LATER → Blocked
           `RefusedForNow`.

        counted: an admission pass's running room per floor (`room`, counted once per pass and
        taken from as clusters go: O(1) a candidate at 10,000 clusters); its floor waits are
        not recorded on each cluster (the run's message says it: no write per waiting
        cluster). None: counted afresh now (a service-out decided later than its admission),
        and a wait is looked at again in POLL_SECONDS. context: what the recorded message
        begins with (where the service-out was decided)."""
        why = self._held_elsewhere(u, obs)
        if why is None and not obs.in_service:
            why = _NotNow(
                "OutOfService", "out of service outside this run; waiting for it to return"
            )
        if why is None and not self.floor_allows(u, counted):
            why = _NotNow(WAITING_FOR_BUDGET, "no availability budget left now")
            if counted is not None:
                return why
        if why is not None:
            self.set(
                u,
                phase=U.PENDING,
                step=None,
                step_start_time=None,
                reason=why.reason,
                message=context + why.message,
            )
            if counted is None:
                self.wake(POLL_SECONDS)
            return why
        pre = verdict_for(self.inp, u)
        if self.inp.preflight_supported and pre is None:
            self.preflight_needed.append(u.cluster_id)
            self.wake(1.0)
            self._take(u, counted)  # an admission holds budget for what it asks about
            return _NotNow(PREFLIGHT_ASKED, "the provider is asked first (PreflightUpgrade)")
        if pre is not None and pre.verdict != Verdict.ACCEPTED:
            never = pre.verdict == Verdict.REFUSED_NEVER
            why = _NotNow(
                "Refused" if never else "RefusedForNow",
                f"the provider refuses this upgrade{'' if never else ' for now'}: "
                f"{pre.reason}: {pre.message}",
            )
            self.set(
                u,
                phase=U.BLOCKED,
                step=None,
                step_start_time=None,
                reason=why.reason,
                message=why.message,
            )
            if not never:
                self.wake(pre.retry_after or 30.0)
            return why
        self._take(u, counted)
        return None

    def _held_elsewhere(self, u: Upgrade, obs: ClusterObs) -> _NotNow | None:
        """The first two checks of `may_service_out`: another run holds the cluster, or an
        operation is in flight on it (any: one of this run's own earlier steps still acting on
        it would collide as much as another caller's)."""
        holder = self.holder(u.cluster_id)
        if holder is not None:
            return _NotNow(
                "HeldByAnotherRun", f"held by UpdateRun {holder}; waiting for it to let go"
            )
        cur = obs.current_operation
        if cur is not None and not cur.state.terminal:
            who = "of an earlier step of this run" if self._ours(cur) else "from another caller"
            return _NotNow("ForeignOperation", f"operation {cur.id} {who} is in flight")
        return None

    def ours_out(self, u: Upgrade, obs: ClusterObs) -> bool:
        """The one exception to `may_service_out`: the cluster is out of service by this
        attempt's own service-out, whose taking effect was never confirmed (it waited for the
        floor or the world after the call was made, and the call took effect later), and no
        other run or operation is on it. Resuming it lowers no availability (it is down
        already) and asks the provider nothing (the drain is done); holding it back for the
        floor or a preflight would only strand it out of service (invariant 4)."""
        st = self.status[u.name]
        return (
            not obs.in_service
            and st.request_id is not None
            and st.request_id
            == request_id(
                self.inp.uid, u.cluster_id, OpKind.SERVICE_OUT.value, u.spec.version, st.attempt
            )
            and self._held_elsewhere(u, obs) is None
        )

    def service_out(
        self,
        u: Upgrade,
        obs: ClusterObs,
        *,
        counted: list[int] | None = None,
        context: str = "",
        reissue: bool = False,
        pre_hook: bool = False,
    ) -> _NotNow | None:
        """The one place a service-out is asked for, and only if `may_service_out` (or, the one
        exception, to resume one of ours: `ours_out`); returns what held it back (None: asked
        for, or its preUpgrade hook started). pre_hook: an admission, whose preUpgrade hook
        runs first (the service-out then comes from `after_hook`, through here again);
        reissue: this attempt's own service-out, asked again with its request id."""
        if not self.ours_out(u, obs):
            why = self.may_service_out(u, obs, counted=counted, context=context)
            if why is not None:
                return why
            if pre_hook and self.start_hook(u, PRE_HOOK):
                return None
        if reissue:
            rid = self.status[u.name].request_id or ""
            self.calls.append(Call(OpKind.SERVICE_OUT, u.cluster_id, rid, u.name, reissue=True))
        else:
            self.issue(u, OpKind.SERVICE_OUT)
            pre = self.inp.preflight.get(u.cluster_id)
            if pre is not None and pre.verdict == Verdict.ACCEPTED and pre.reason:
                # Accepted with a notice (e.g. GKE's BLUE_GREEN_UPGRADE: the soak the
                # node-pool step will take): said where people look while it drains.
                self.set(u, message=f"preflight: {pre.reason}: {pre.message}")
        return None

    # -- the floor ---------------------------------------------------------------------------

    def holder(self, cid: str) -> str | None:
        return self.inp.held_by.get(cid)

    def room(self) -> list[int]:
        """How many more clusters each floor of `floors` lets go now: its members up, less
        what it requires (negative: broken already by the world).

        Invariant 1's rule of what counts as up: in the inventory, available, in service, with
        no other caller's operation in flight (`index.up_by_observation`, over the effective
        observations: the snapshot's, kept by the index, and those this pass changed), and held
        by no run on the provider (this one: its clusters in an ACTIVE phase; another:
        `holder`). Everything else is down. Counted from this pass's accounts, never a count
        of its own: the index's members up by observation (brought up to date from this
        pass's snapshot), less those held now, corrected for the observations this pass
        changed; O(clusters held), not O(fleet)."""
        up, held_by, changed = self.index.up, self.inp.held_by, self.effective_changed
        held = self.phases.held
        # Another run's holdings among those up by the snapshot's observation (this run's own
        # are counted as they change: `Phases.held_up`).
        others_up = {c for c in held_by if c in up and c not in held}
        # What this pass changed: up by its effective observation now, or not any more.
        gained: set[str] = set()
        lost: set[str] = set()
        for cid in changed:
            was = cid in up and cid not in held and cid not in held_by
            now = (
                cid not in held
                and cid not in held_by
                and up_by_observation(self.observed(cid), self.inp.uid)
            )
            if now and not was:
                gained.add(cid)
            elif was and not now:
                lost.add(cid)
        out = []
        for i, f in enumerate(self.floors):
            members = f.members
            if i == 0:  # this run's floor: every cluster it holds is a member
                base = self.index.up_members - self.phases.held_up
            else:
                base = len(members & up) - len(held & up & members)
            base -= len(others_up & members)
            out.append(base + len(gained & members) - len(lost & members) - f.required)
        return out

    def floor_allows(self, u: Upgrade, counted: list[int] | None = None) -> bool:
        """Invariant 1's rule of which floors apply and what a service-out costs: every floor
        with the cluster among its members (this run's, and each other live run's sharing it)
        must keep its room. A cluster this run holds is counted down already; any other costs
        one, an unavailable one too (once taken out it stays down when it recovers, and then
        the floor must still hold). counted: an admission pass's running room; else counted
        afresh. On an index that rests on what callers said changed, a floor that would let the
        cluster go is counted again after comparing every object (`_CompareAll`)."""
        left = self.room() if counted is None else counted
        cost = self._cost(u)
        allows = all(left[i] >= cost for i in self._binding(u.cluster_id))
        if allows and cost and self.index.told:
            raise _CompareAll
        return allows

    def _take(self, u: Upgrade, counted: list[int] | None) -> None:
        if counted is not None:
            cost = self._cost(u)
            for i in self._binding(u.cluster_id):
                counted[i] -= cost

    def _cost(self, u: Upgrade) -> int:
        return 0 if self.status[u.name].phase in ACTIVE else 1

    def _binding(self, cid: str) -> list[int]:
        return [i for i, f in enumerate(self.floors) if cid in f.members]

    # -- ownership -----------------------------------------------------------------------

    def busy_ours(self, obs: ClusterObs, st: api.ClusterUpgradeStatus) -> bool:
        """Whether an operation of this run may still act on the cluster."""
        cur = obs.current_operation
        if cur is not None and not cur.state.terminal and self._ours(cur):
            return True
        op = self.inp.snapshot.operations.get(st.request_id or "")
        return op is not None and not op.state.terminal

    def _ours(self, op: OpObs) -> bool:
        return op.request_id.startswith(f"{self.inp.uid}:")


def _cut(text: str) -> str:
    """A hook's message for status: one line, at most HOOK_MESSAGE_MAX characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= HOOK_MESSAGE_MAX else flat[: HOOK_MESSAGE_MAX - 1] + "…"


def checks_for(spec: api.UpdateRunSpec, stage: str) -> api.HealthChecks | None:
    """The health checks that apply to a stage's clusters: the stage's own, else the run's."""
    for st in (spec.strategy.stages if spec.strategy else None) or []:
        if st.name == stage and st.health_checks is not None:
            return st.health_checks
    return spec.health_checks


def _limit(value: int | str | None, members: int) -> int:
    return members if value is None else api.parse_max_concurrency(value, members)


#: Reasons of a Skipped cluster that a person asked for (a retry may undo them).
SKIPPED_BY_PEOPLE = frozenset({"SkippedByUser", "StageSkipped"})
#: How long past its step's bound a cluster in flight waits for a provider that does not answer
#: before it fails ProviderUnavailable: one read that failed as the bound passed never decides
#: for the read a poll later (which may find the operation ended, or the cluster gone:
#: simulation seed 99711, where one failed read failed a step, and halted its run, that the
#: next recorded as drift). The provider must also have answered none of the run's reads for
#: that long (RunInput.unknown_since): a provider that fails one read in several is not down
#: (simulation seed 137463, where a flapping plugin failed a cluster mid-verify).
UNREACHABLE_GRACE = timedelta(seconds=STEP_POLL_SECONDS)
#: The step of a Failed cluster that failedClusterPolicy ServiceInIfHealthy may service back in.
RECOVER_STEP = "recover"
#: The step of a Failed cluster that stays out: its recovery's checks or readiness failed.
RECOVER_GAVE_UP = "recover/gaveUp"


def counts_as_failure(st: api.ClusterUpgradeStatus) -> bool:
    """Whether a cluster counts against the failure budgets: Failed, or Blocked because the
    provider will never accept its target (reason Refused)."""
    return st.phase == U.FAILED or (st.phase == U.BLOCKED and st.reason == "Refused")


def awaits_checks(st: api.ClusterUpgradeStatus) -> bool:
    """Whether the driver evaluates the cluster's checks: Verifying, or a Failed cluster that
    failedClusterPolicy ServiceInIfHealthy may service back in."""
    return st.phase == U.VERIFYING or (
        # Until its service-in back is asked for (then, as for Servicing-in, the intent
        # stands on the evaluations before it).
        st.phase == U.FAILED and st.step == RECOVER_STEP and st.request_id is None
    )


def service_in_on_record(st: api.ClusterUpgradeStatus) -> bool:
    """Whether a service-in is on record for the cluster, decided on the evaluations before it:
    Servicing-in, or a Failed cluster's recovery asked for (step RECOVER_STEP with its request
    id). A failing evaluation no write recorded resets those passes on record before the
    service-in is asked again (the driver's unrecorded failures; simulation seed 137037)."""
    return st.phase == U.SERVICING_IN or (
        st.phase == U.FAILED and st.step == RECOVER_STEP and st.request_id is not None
    )


def brought_back(st: api.ClusterUpgradeStatus, policy: api.FailedClusterPolicy) -> bool:
    """Whether failedClusterPolicy still brings this Failed cluster back into service: it is
    being serviced back in (step RECOVER_STEP), or, under ServiceInIfHealthy, it keeps the
    step of the attempt that may have left it out and its recovery has not given up (it
    failed this pass, its provider does not answer, or another run holds it: `_recover` acts
    once it can). The run is not finished and its deletion waits while any is (a run that
    ended, or went, with one left it out for good: simulation seed 86310)."""
    if st.phase != U.FAILED or not st.step:
        return False
    if st.step == RECOVER_STEP:
        return True
    return policy == api.FailedClusterPolicy.SERVICE_IN_IF_HEALTHY and st.step != RECOVER_GAVE_UP


def _retriable(st: api.ClusterUpgradeStatus) -> bool:
    return st.phase in (U.FAILED, U.BLOCKED) or (
        st.phase == U.SKIPPED and st.reason in SKIPPED_BY_PEOPLE
    )


def _short(text: str, most: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= most else flat[: most - 1] + "…"


def _said(by: str | None, reason: str | None) -> str:
    return f"{by or 'unknown'}: {reason or 'no reason given'}"


def _people(run: _Run) -> None:
    """Skips (annotation: once; spec.skip.clusters: while listed), then retries (annotation:
    once; spec.retry: once per round and cluster, recorded as retry_round)."""
    inp = run.inp
    skip = inp.spec.skip or api.SkipSpec()
    spec_skip = frozenset(skip.clusters or ())
    retry = inp.spec.retry
    if not (spec_skip or retry or inp.skip_clusters or inp.retry_clusters):
        return
    for u in inp.upgrades.values():
        st = run.status[u.name]
        cid = u.cluster_id
        said = None
        if cid in inp.skip_clusters:
            said = _said(inp.requested_by, inp.reason)
        elif cid in spec_skip:
            said = _said(retyped(inp.requested_by, skip.requested_by), skip.reason)
        if said is not None and st.phase in (U.PENDING, U.BLOCKED, U.FAILED):
            run.set(u, phase=U.SKIPPED, reason="SkippedByUser", message=f"{PEOPLES_WORDS[1]}{said}")
            run.skipped.add(cid)
            continue
        due = retry is not None and cid in retry.clusters and st.retry_round < retry.round
        if due and retry is not None:
            # The round is spent by every listed cluster the first time a decision sees it
            # (idempotent under re-apply); only those that can retry get a fresh attempt.
            run.set(u, retry_round=retry.round)
            who = _said(retyped(inp.requested_by, retry.requested_by), retry.reason)
        else:
            who = _said(inp.requested_by, inp.reason)
        if (due or cid in inp.retry_clusters) and _retriable(st):
            _retry(run, u, st, f"{PEOPLES_WORDS[0]}{who} (attempt {st.attempt + 2})")


def _retry_at_rest(run: _Run) -> None:
    """A retry that waited (`retry_waits`) applies once its cluster is at rest."""
    for u in run.lingering():
        st = run.status[u.name]
        if st.message is not None and retry_waits(st):
            _retry(run, u, st, retry_words(st.message))


def _returned(run: _Run) -> None:
    """Invariant 4 for drift: a cluster recorded Skipped (ClusterGone) after it left the
    inventory mid-upgrade, back now and still out of service, is this run's to bring back:
    a fresh attempt carries it on from where it stands (no new service-out, no budget)."""
    for u in run.having(U.SKIPPED):
        st = run.status[u.name]
        if st.phase != U.SKIPPED or st.reason != "ClusterGone" or not st.step:
            continue
        obs = run.inp.snapshot.clusters.get(u.cluster_id)
        if obs is None or obs.in_service or run.holder(u.cluster_id):
            continue
        cur = obs.current_operation
        if cur is not None and not cur.state.terminal and not run._ours(cur):
            continue  # someone else is acting on it: wait for them
        _retry(run, u, st, "the cluster's return")
        run.set(
            u,
            reason="ClusterReturned",
            message=f"back in the inventory out of service after {st.step}: carrying it on "
            f"(attempt {st.attempt + 2})",
        )


def _released(run: _Run) -> None:
    """Invariant 4 across runs. An ended attempt that keeps its `step` may still have its
    cluster out of service: a retry carries it on from there, failedClusterPolicy brings it
    back, a return resumes it. Once the cluster is seen in service with no operation of this
    run in flight on it, the attempt keeps nothing out (its service-out failed, or someone
    serviced it back in) and its step is cleared, so that a later retry never adopts a
    cluster that another run has taken out since."""
    for u in run.lingering():
        st = run.status[u.name]
        if not keeps_cluster(st.phase, st.step):
            continue
        obs = run.inp.snapshot.clusters.get(u.cluster_id)
        if obs is None or not obs.in_service or run.busy_ours(obs, st):
            continue
        message = st.message
        if st.step == RECOVER_STEP:
            message = (
                "serviced back in (failedClusterPolicy ServiceInIfHealthy) after it failed: "
                f"{st.message or st.reason}"
            )
        run.set(
            u,
            step=None,
            request_id=None,
            operation_id=None,
            step_start_time=None,
            message=message,
        )


def retry_waits(st: api.ClusterUpgradeStatus) -> bool:
    """Whether a person's retry of this ended attempt waits for its cluster to be at rest."""
    return st.phase in KEEPING and RETRY_WAITS in (st.message or "")


def retry_words(message: str) -> str:
    """A message's own words: for a waiting retry, the asker's words it was recorded with
    (who asked stays theirs while it waits and when it applies), without what it waits for."""
    return message.split(RETRY_WAITS, 1)[0]


def _retry(run: _Run, u: Upgrade, st: api.ClusterUpgradeStatus, said: str) -> None:
    """A fresh attempt with the run's pinned targets: new request ids, fresh health. An
    attempt that holds its cluster (`step`) begins only once the cluster is at rest, since
    where it stands decides how the new attempt goes on (out of service: ours to carry on, no
    new service-out; in service: a new one, through the gates and the floor).
    Not at rest: not in the inventory, or in service with an operation of this run still in
    flight on it (a service-out that may yet take it out). Until then the retry waits, its
    phase and reason kept, its message saying so (`retry_waits`, `_retry_at_rest`): a claim
    re-made on a cluster not seen asked for a service-out no gate or floor admitted (seed
    40704)."""
    inp = run.inp
    obs = inp.snapshot.clusters.get(u.cluster_id)
    adopts = st.step == RECOVER_STEP and st.request_id is not None and obs is not None
    if st.step and not adopts and (obs is None or (obs.in_service and run.busy_ours(obs, st))):
        why = "the cluster is seen again" if obs is None else "this run's operation on it ends"
        message = f"{said}{RETRY_WAITS}{why}"
        if st.message != message:
            run.set(u, message=message)
        return
    run.set(
        u,
        phase=U.PENDING,
        attempt=st.attempt + 1,
        step=None,
        request_id=None,
        operation_id=None,
        health=None,
        step_start_time=None,
        reason="Retry",
        message=said,
    )
    run.retried.add(u.cluster_id)
    if adopts:
        # Its service-in back (failedClusterPolicy) was asked for: the new attempt adopts
        # that operation (the same request id) and goes on from its outcome, so no other
        # step of ours can run on the cluster while it is in flight.
        run.set(
            u,
            phase=U.SERVICING_IN,
            step=OpKind.SERVICE_IN.value,
            request_id=st.request_id,
            step_start_time=run.stamp,
        )
        return
    if st.step and obs is not None and not obs.in_service and not run.holder(u.cluster_id):
        # Invariant 4: the failed attempt took it out; the retry keeps it (no new
        # service-out, no budget) and `follow` carries it on from where it stands. (A
        # cluster away from the inventory waited above: it may come back out of service,
        # ours to bring back; a retry that dropped the claim left it out for ever,
        # simulation seed 577.)
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


def _recover(run: _Run, u: Upgrade) -> None:
    """failedClusterPolicy ServiceInIfHealthy: a Failed cluster this run took out of service is
    serviced back in once it is available, its pools ready, no operation in flight on it and
    every applicable check passed successThreshold times (invariant 3 holds for it too). It
    stays Failed (reason kept); the message says it was serviced back in. Bounded: checks that
    fail, or readiness past timeouts.ready, leave it out (step RECOVER_GAVE_UP)."""
    st = run.status[u.name]
    obs = run.observed(u.cluster_id)
    if obs is None:
        run.set(u, **run.unseen_health(u))  # awaiting its checks (step RECOVER_STEP) only
    if not st.step or st.step == RECOVER_GAVE_UP or obs is None:
        return
    if run.holder(u.cluster_id) is not None:
        return
    if obs.in_service:
        return  # serviced back in: `_released` clears the step
    inp = run.inp
    rid = request_id(inp.uid, u.cluster_id, RECOVER_STEP, u.spec.version, st.attempt)
    if st.step == RECOVER_STEP and st.request_id == rid:
        op = run._find_op(rid, obs)
        if (op is not None and op.state == OpState.FAILED) or rid in inp.snapshot.forgotten:
            # Failed, or forgotten by the plugin (never asked again: invariant 6).
            run.set(u, step=RECOVER_GAVE_UP, request_id=None, operation_id=None)
            return
        if op is None or op.state != OpState.SUCCEEDED:
            asked = st.step_start_time
            if asked and run.now - parse_time(asked) > run.timeout_of(OpKind.SERVICE_IN):
                # Invariant 4: the way back in is bounded like any service-in.
                run.set(u, step=RECOVER_GAVE_UP, request_id=None, operation_id=None)
                return
            if op is None and not run.service_in(u, request=rid):
                # Not seen yet: asked again with the same request id, and only
                # while the health on record still passes (invariant 3); else it verifies again.
                run.set(u, step=RECOVER_STEP, step_start_time=run.stamp, request_id=None)
                run.wake(POLL_SECONDS)
                return
            run.wake(STEP_POLL_SECONDS)
            return
        run.wake(POLL_SECONDS)  # succeeded; the inventory shows it in service on the next look
        return
    entering = st.step != RECOVER_STEP
    since = run.stamp if entering or not st.step_start_time else st.step_start_time
    cur = obs.current_operation
    busy = cur is not None and not cur.state.terminal
    ready = obs.available and all(p.ready for p in obs.node_pools) and not busy
    if not ready:
        if not entering and run.now - parse_time(since) > run.timeout_of(None):
            run.set(u, step=RECOVER_GAVE_UP, health=None, step_start_time=None)
            return
        run.set(u, step=RECOVER_STEP, step_start_time=since, health=None, request_id=None)
        run.wake(POLL_SECONDS * 5)
        return
    checks = run.checks_for(u.spec.stage)
    if checks is not None:
        health = None if entering else st.health
        if health is None:
            health = api.HealthState(since=run.stamp)
        verdict = judge(health, checks, run.now)
        if verdict.failed:
            run.set(u, step=RECOVER_GAVE_UP, health=health, step_start_time=None)
            return
        if not verdict.passed:
            run.set(u, step=RECOVER_STEP, step_start_time=since, health=health, request_id=None)
            run.wake(max(verdict.wait_seconds, 0.0))
            return
    if run.service_in(u, request=rid):
        # Asked now: the service-in's own bound (timeouts.serviceIn) runs from here.
        run.set(u, step=RECOVER_STEP, step_start_time=run.stamp, request_id=rid, operation_id=None)


def _skip_stages(
    run: _Run, names: Sequence[str], by_stage: Mapping[int, Sequence[Upgrade]]
) -> frozenset[str]:
    """Stages a person skipped (spec.skip.stages, the skip-stages annotation; both level-
    triggered): members not started are Skipped, members in flight go on."""
    inp = run.inp
    spec = inp.spec.skip or api.SkipSpec()
    in_spec = frozenset(spec.stages or ())
    skipped = (in_spec | inp.skip_stages) & frozenset(names)
    for index, name in enumerate(names):
        if name not in skipped:
            continue
        if name in in_spec:
            said = _said(retyped(inp.requested_by, spec.requested_by), spec.reason)
        else:
            said = _said(inp.requested_by, inp.reason)
        for u in by_stage.get(index, []):
            if run.status[u.name].phase in (U.PENDING, U.BLOCKED, U.FAILED):
                run.set(
                    u,
                    phase=U.SKIPPED,
                    reason="StageSkipped",
                    message=f"{PEOPLES_WORDS[1]}{said} (stage {name})",
                )
    return skipped


@dataclass(frozen=True)
class _StageTally:
    """A stage's clusters by outcome: what its status reports (upgraded and skipped apart;
    failed counts Failed and Refused clusters, as the budget does) and whether it settled."""

    upgraded: int
    skipped: int
    #: Failed clusters.
    failed: int
    #: Blocked clusters whose target the provider refuses (reason Refused).
    refused: int
    #: Nothing pending or in flight.
    settled: bool


@dataclass
class _Budgets:
    """The failure budgets of one decision: per stage and for the run."""

    stats: list[_StageTally]
    #: Per stage: its failures are past its own budget or take the run past the run's.
    over: list[bool]
    stage_budgets: list[int | None]
    run_budget: int | None
    #: The failures counted, in stage order: (cluster id, reason, message).
    counted: list[tuple[str, str, str]]
    halted: bool


def _budgets(
    run: _Run,
    names: Sequence[str],
    by_stage: Mapping[int, Sequence[Upgrade]],
    skipped: frozenset[str],
) -> _Budgets:
    """Failed clusters count at once; clusters Blocked because the provider refuses their
    target count once the rest of their stage is settled (a refusal takes nothing out, and
    the stage's other clusters may still go). Past a stage's or the run's budget, the run
    halts."""
    strategy = run.strategy
    total = len(run.inp.upgrades)
    run_budget: int | None
    if strategy.max_failures is not None:
        run_budget = api.parse_max_failures(strategy.max_failures, total)
    else:
        run_budget = 0 if strategy.on_failure == api.OnFailure.HALT else None
    stages_spec = strategy.stages or []
    out = _Budgets([], [], [], run_budget, [], False)
    phases, rank = run.phases, run.index.rank
    # The failed and refused members by stage, in the engine's order.
    failing: dict[int, list[tuple[int, Upgrade, api.ClusterUpgradeStatus, bool]]] = {}
    for name in phases.by_phase[U.FAILED] | phases.refused:
        u = run.index.seen[name]
        st = run.status[name]
        failing.setdefault(u.spec.stage_index, []).append((rank[name], u, st, st.phase == U.FAILED))
    for index, name in enumerate(names):
        members = by_stage.get(index, [])
        n_upgraded = phases.per_stage[(index, U.UPGRADED)]
        n_skipped = phases.per_stage[(index, U.SKIPPED)]
        ordered = sorted(failing.get(index, []), key=lambda x: x[0])
        failed = [(u, st) for _, u, st, is_failed in ordered if is_failed]
        refused = [(u, st) for _, u, st, is_failed in ordered if not is_failed]
        settled = n_upgraded + n_skipped + len(failed) + len(refused) == len(members)
        counted = failed + (refused if settled else [])
        spec_stage = stages_spec[index] if stages_spec else None
        own = (
            api.parse_max_failures(spec_stage.max_failures, len(members))
            if spec_stage is not None and spec_stage.max_failures is not None
            else None
        )
        before = len(out.counted)
        out.counted += [(u.cluster_id, st.reason or "", st.message or "") for u, st in counted]
        past_stage = own is not None and len(counted) > own
        past_run = run_budget is not None and len(out.counted) > max(run_budget, before)
        out.stats.append(_StageTally(n_upgraded, n_skipped, len(failed), len(refused), settled))
        out.over.append(name not in skipped and (past_stage or past_run))
        out.stage_budgets.append(own)
    out.halted = any(out.over) or (run_budget is not None and len(out.counted) > run_budget)
    return out


@dataclass(frozen=True)
class _TimeGate:
    """Whether a cluster may start now as far as time goes (notBefore, windows)."""

    may_start: bool
    next_start: datetime | None = None
    #: The Pending reason while closed: NotBefore or MaintenanceWindow.
    word: str = ""
    message: str = ""


_OPEN = _TimeGate(True)


def _minor_changes(current: str, target: str) -> bool:
    a, b = versions.parse(current), versions.parse(target)
    return (a.major, a.minor) != (b.major, b.minor)


def _time_gate(run: _Run, stage: api.Stage | None, u: Upgrade) -> _TimeGate:
    """The time gate of one cluster (orchestrator.windows): the run's notBefore, and the
    maintenance of its stage (else the run's) with the provider's windows of the cluster."""
    maintenance = (
        stage.maintenance
        if stage is not None and stage.maintenance is not None
        else run.strategy.maintenance
    )
    text = run.strategy.not_before
    if maintenance is None and not text:
        return _OPEN
    not_before = windows.parse_time(text) if text else None
    obs = run.observed(u.cluster_id)
    provider = obs.maintenance_windows if obs is not None else ()
    minor = obs is None or _minor_changes(obs.control_plane_version, u.spec.version)
    gate = windows.gate(maintenance, provider, run.now, not_before=not_before, minor=minor)
    if gate.may_start:
        return _OPEN
    word = "NotBefore" if not_before is not None and run.now < not_before else "MaintenanceWindow"
    when = (
        f"may start at {format_time(gate.next_start)}"
        if gate.next_start is not None
        else "no start within the windows' horizon"
    )
    return _TimeGate(False, gate.next_start, word, f"{gate.reason}; {when}")


def decide(inp: RunInput) -> Decision:
    """One step of a run: a visible sequence of phases over one working copy of the run (in
    the manner of Cluster API's doReconcile). Pure: the caller persists `changed` before making
    `calls`."""
    try:
        return _decide(inp)
    except _CompareAll:
        # Invariant 1 never rests on what callers said changed: a floor that would let a
        # cluster go on an index brought up to date by their word (`RunIndex.told`) is
        # counted again after comparing every object, in a decision taken again.
        return _decide(inp, compare_all=True)


class _CompareAll(Exception):
    """A floor would let a cluster go on an index that rests on what callers said changed
    (`_Run.floor_allows`): `decide` decides again, comparing every object."""


def _decide(inp: RunInput, compare_all: bool = False) -> Decision:
    """One decision (`decide`); compare_all: whatever the callers said changed."""
    run = _Run(inp, compare_all)
    try:
        by_stage = run.index.by_stage
        names, skipped_stages = _people_first(run, by_stage)
        _carry_in_flight(run)
        budgets = _budgets(run, names, by_stage, skipped_stages)
        walk = _walk_stages(run, names, by_stage, skipped_stages, budgets)
        if _admits(run, walk):
            _admit(run, walk, by_stage)
        return _summarise(
            run,
            walk.stages,
            walk.current,
            walk.halted,
            walk.blocked,
            budgets,
            next_start=format_time(walk.next_start) if walk.next_start is not None else None,
            waiting=walk.waiting or None,
        )
    finally:
        # The index keeps what was last seen, not what this decision would make of it.
        run.phases.undo()


def _people_first(
    run: _Run, by_stage: Mapping[int, Sequence[Upgrade]]
) -> tuple[list[str], frozenset[str]]:
    """Phase 1, people first: skips, then retries (annotations are consumed by the
    controller; spec fields are level-triggered, a retry round applies once per cluster), and
    stages a person skipped. Returns the stage names and the skipped ones."""
    _retry_at_rest(run)
    _released(run)
    _people(run)
    stages_spec = run.strategy.stages or []
    names = [s.name for s in stages_spec] or ["default"]
    # Before anything issues calls: a skipped stage's members not started never are.
    skipped_stages = _skip_stages(run, names, by_stage)
    _returned(run)
    run.halted_hint = _budgets(run, names, by_stage, skipped_stages).halted
    return names, skipped_stages


def _carry_in_flight(run: _Run) -> None:
    """Phase 2: every cluster in flight is carried forward from what its operation did; failed
    clusters are serviced back in where the policy says so (failedClusterPolicy)."""
    for u in run.to_follow():
        if run.status[u.name].phase in ACTIVE:
            run.follow(u)
    if run.strategy.failed_cluster_policy == api.FailedClusterPolicy.SERVICE_IN_IF_HEALTHY:
        for u in run.having(U.FAILED):
            if run.status[u.name].phase == U.FAILED:
                _recover(run, u)
    _released(run)  # an attempt that ended in this pass with its cluster still in service


@dataclass
class _Walk:
    """The run-level view of one pass: the stage walk's findings, which admission adds to."""

    names: list[str]
    stages: list[api.StageStatus]
    #: The stage admitting clusters; -1: a stage verifying, soaking or failed holds the run;
    #: None: every stage is done.
    active: int | None
    halted: bool
    waiting: str
    blocked: str
    next_start: datetime | None = None

    @property
    def current(self) -> str | None:
        """The name of the stage admitting clusters, if any."""
        return self.names[self.active] if self.active is not None and self.active >= 0 else None


def _walk_stages(
    run: _Run,
    names: list[str],
    by_stage: Mapping[int, Sequence[Upgrade]],
    skipped_stages: frozenset[str],
    budgets: _Budgets,
) -> _Walk:
    """Phase 3: each stage's phase, in order (skipped, completed, verifying its checks,
    soaking, failed, awaiting approval, progressing); the first incomplete one is active."""
    prev = {s.name: s for s in run.inp.stages}
    walk = _Walk(names, [], None, budgets.halted, "Halted" if budgets.halted else "", "")
    for index, name in enumerate(names):
        members = by_stage.get(index, [])
        tally = budgets.stats[index]
        old = prev.get(name)
        start = old.start_time if old else None
        completion = old.completion_time if old else None
        health = old.health if old else None
        phase = api.StagePhase.PENDING
        if name in skipped_stages:
            # Skipped by a person: its checks are not evaluated and the run moves on.
            phase = api.StagePhase.SKIPPED
            health = None
        elif walk.active is None and tally.settled and not budgets.over[index]:
            phase, health, completion = _settled_stage(
                run, walk, index, members, health, completion
            )
        elif walk.active is None:
            walk.active = index
            # Invariant 3: a stage that is incomplete again (a member retried) verifies anew.
            health = None
            phase = _open_stage(run, walk, index, budgets, start)
        walk.stages.append(
            api.StageStatus(
                name=name,
                phase=phase,
                total=len(members),
                upgraded=tally.upgraded,
                skipped=tally.skipped,
                failed=tally.failed + tally.refused,
                max_failures=budgets.stage_budgets[index],
                start_time=start,
                completion_time=completion
                if phase in (api.StagePhase.COMPLETED, api.StagePhase.SOAKING)
                else None,
                health=health,
            )
        )
    if run.stopping:
        walk.waiting = "Stopped"
    elif run.strategy.paused and not walk.halted:
        walk.waiting = "Paused"
    return walk


def _stage_spec(run: _Run, index: int) -> api.Stage | None:
    """The spec of the stage at index (None: the run has no stages, only "default")."""
    stages_spec = run.strategy.stages or []
    return stages_spec[index] if stages_spec else None


def _settled_stage(
    run: _Run,
    walk: _Walk,
    index: int,
    members: Sequence[Upgrade],
    health: api.HealthState | None,
    completion: str | None,
) -> tuple[api.StagePhase, api.HealthState | None, str | None]:
    """A stage whose members are all settled, within its budget: it verifies its checks (and
    holds the run while they run or after they failed), soaks, or is complete. Returns its
    phase, health and completion time."""
    inp = run.inp
    name = walk.names[index]
    last = index + 1 == len(walk.names)
    checks = None if last else run.checks_for(name)
    if health is not None and _ended_since(members, run.status, health.since):
        # Invariant 3: a member ended after this analysis began (it was retried and the
        # stage's reopening never reached the run's status): verify the stage anew.
        health, completion = None, None
    verdict = judge(health, checks, inp.now) if checks is not None else None
    if verdict is not None and not verdict.passed:
        if health is None:
            health = api.HealthState(since=run.stamp)
            verdict = judge(health, checks, inp.now) if checks else verdict
        walk.active = -1
        walk.blocked = f"stage {name}: {verdict.message}"
        if verdict.failed:
            walk.halted = True
            walk.waiting = "Halted"
            return api.StagePhase.FAILED, health, completion
        walk.waiting = walk.waiting or "StageVerifying"
        run.wake(max(verdict.wait_seconds, 0.5))
        return api.StagePhase.VERIFYING, health, completion
    completion = completion or run.stamp
    spec_stage = _stage_spec(run, index)
    soak = spec_stage.soak_time if spec_stage else None
    if soak and not last:
        left = parse_time(completion) + api.parse_duration(soak) - inp.now
        if left > timedelta(0):
            walk.active = -1
            walk.waiting = walk.waiting or "Soaking"
            walk.blocked = f"stage {name} soaking for {int(left.total_seconds())}s more"
            run.wake(left.total_seconds())
            return api.StagePhase.SOAKING, health, completion
    return api.StagePhase.COMPLETED, health, completion


def _open_stage(
    run: _Run, walk: _Walk, index: int, budgets: _Budgets, start: str | None
) -> api.StagePhase:
    """The first stage not yet settled (the active one): failed past its budget, awaiting a
    person's approval, or progressing."""
    name = walk.names[index]
    spec_stage = _stage_spec(run, index)
    if budgets.over[index] or (walk.halted and budgets.stats[index].failed):
        return api.StagePhase.FAILED
    if (
        spec_stage is not None
        and spec_stage.approval == api.Approval.MANUAL
        and name not in run.inp.approved_stages
        and not start
    ):
        walk.waiting = walk.waiting or "AwaitingApproval"
        walk.blocked = (
            f"stage {name} awaits approval: add it to the "
            f"{api.ANNOTATION_APPROVE_STAGES} annotation"
        )
        return api.StagePhase.AWAITING_APPROVAL
    return api.StagePhase.PROGRESSING


def _admits(run: _Run, walk: _Walk) -> bool:
    """Whether this pass admits clusters: a stage is progressing and nothing holds the run
    (halted on its budget, stopped, paused)."""
    return (
        walk.active is not None
        and walk.active >= 0
        and walk.stages[walk.active].phase == api.StagePhase.PROGRESSING
        and not walk.halted
        and not run.stopping
        and not run.strategy.paused
    )


@dataclass
class _Admission:
    """One pass's admission into the active stage: its members in the order they are offered,
    their time gates, and what offering them found."""

    index: int
    spec_stage: api.Stage | None
    #: The stage's members (the index's list: never changed in place).
    members: Sequence[Upgrade]
    #: The stage's concurrency limit and the clusters in flight now (across the run).
    limit: int
    in_flight: int
    #: The floor's budget, counted over this pass (`_Run.room`).
    room: list[int]
    gates: dict[str, _TimeGate] = field(default_factory=dict)
    #: The closed gates, and the earliest time one opens.
    waits: list[_TimeGate] = field(default_factory=list)
    next_start: datetime | None = None
    #: The words of the closed gates clusters wait on (NotBefore, MaintenanceWindow).
    time_waits: set[str] = field(default_factory=set)
    started: bool = False
    waiting_budget: bool = False


def _admit(run: _Run, walk: _Walk, by_stage: Mapping[int, Sequence[Upgrade]]) -> None:
    """Phase 4, admission into the active stage: in stable order, each cluster whose turn
    came is skipped (gone, at target), resumed (our own service-out took effect unconfirmed:
    `_Run.ours_out`), waits for its time gate or the concurrency limit, and is then offered to
    `_Run.service_out`: it waits (held by another run, another operation, out of service, the
    floor's budget: `_Run.may_service_out`, counted over this pass), is asked about
    (preflight), is refused (Blocked), or is taken out (its preUpgrade hook first)."""
    adm = _admission(run, walk, by_stage)
    _time_gates(run, adm)
    _offer(run, adm)
    _why_waiting(run, walk, adm)
    stage = walk.stages[adm.index]
    if adm.started and not stage.start_time:
        walk.stages[adm.index] = stage.model_copy(update={"start_time": run.stamp})
    walk.next_start = adm.next_start


def _admission(run: _Run, walk: _Walk, by_stage: Mapping[int, Sequence[Upgrade]]) -> _Admission:
    """The active stage's members, its concurrency limit, what is in flight and the room the
    floor leaves, before any cluster is offered."""
    index = walk.active
    assert index is not None
    members = by_stage.get(index, [])
    spec_stage = _stage_spec(run, index)
    value = (
        spec_stage.max_concurrency
        if spec_stage is not None and spec_stage.max_concurrency is not None
        else run.strategy.max_concurrency
    )
    return _Admission(
        index=index,
        spec_stage=spec_stage,
        members=members,
        limit=_limit(value, len(members)),
        in_flight=run.phases.count(*ACTIVE),
        room=run.room(),
    )


def _time_gates(run: _Run, adm: _Admission) -> None:
    """Time (notBefore, windows): each waiting member's gate; clusters whose gate is open go
    first, in stable order, and a member whose time came no longer shows a stale wait."""
    spec_stage = adm.spec_stage
    timed = (
        run.strategy.not_before
        or run.strategy.maintenance
        or (spec_stage is not None and spec_stage.maintenance)
    )
    adm.gates = {
        u.name: _time_gate(run, spec_stage, u)
        for u in (adm.members if timed else ())
        if run.status[u.name].phase in (U.PENDING, U.BLOCKED)
    }
    adm.waits = [g for g in adm.gates.values() if not g.may_start]
    if adm.waits:
        nexts = [g.next_start for g in adm.waits if g.next_start is not None]
        if nexts:
            adm.next_start = min(nexts)
            run.wake(max((adm.next_start - run.inp.now).total_seconds(), 1.0))
        adm.members = sorted(adm.members, key=lambda x: not adm.gates.get(x.name, _OPEN).may_start)
    stale = run.phases.waiting_for("NotBefore", "MaintenanceWindow")
    for u in adm.members if stale else ():  # their time came: no stale wait shown
        st = run.status[u.name]
        if (
            st.phase == U.PENDING
            and st.reason in ("NotBefore", "MaintenanceWindow")
            and adm.gates.get(u.name, _OPEN).may_start
        ):
            run.set(u, reason=None, message=None)


def _offer(run: _Run, adm: _Admission) -> None:
    """Each member whose turn came, in order, until the concurrency limit is reached.

    A member that waited for the availability budget when last offered, on exactly the same
    status, observation and holder (engine.index's `waiting`), waits again without being
    looked into, but only while no member can start at all: the run's own floor has no room
    (every member's service-out costs one there), no time gate applies, and the concurrency
    limit cannot be reached in this pass."""
    stage = run.index.stage_names.get(adm.index, frozenset())
    for u in run.index.by_rank(run.phases.waiting_for(PROVIDER_UNAVAILABLE) & stage):
        # Waited for its provider, which answers again: that wait is over (not left on
        # record while it waits for its turn, the budget or a window).
        if u.cluster_id not in run.inp.snapshot.unknown:
            run.set(u, reason=None, message=None)
    members = _to_offer(run, adm, stage)
    for u in members:
        st = run.status[u.name]
        if st.phase not in (U.PENDING, U.BLOCKED):
            continue
        if st.phase == U.BLOCKED and st.reason == "Refused":
            continue
        if u.cluster_id in run.retried:
            # Retried in this pass: admitted from the next one, once every retry of the
            # pass is on record (a pass cut short, or writes made in parallel, must not
            # leave a new service-out on record beside failures it was decided without).
            run.wake(0.0)
            continue
        obs = run.observed(u.cluster_id)
        unknown = run.inp.snapshot.unknown.get(u.cluster_id)
        if obs is None and unknown is not None:
            # Its provider cannot be asked (a run over several providers): not gone, and
            # not started until it answers; counted as unavailable meanwhile.
            run.set(
                u,
                phase=U.PENDING,
                step=None,
                step_start_time=None,
                reason=PROVIDER_UNAVAILABLE,
                message=f"waiting for its provider: {unknown}",
            )
            run.wake(POLL_SECONDS)
            continue
        if obs is None:
            run.set(
                u,
                phase=U.SKIPPED,
                reason="ClusterGone",
                message="not in the plugin's inventory when its turn came",
            )
            continue
        if not needs_upgrade(obs, u.spec):
            run.at_target(u, obs)
            continue
        gate = adm.gates.get(u.name, _OPEN)
        if run.ours_out(u, obs) and gate.may_start:  # a start, so within its window too
            # Ours already (our service-out took effect unconfirmed): resumed, the one
            # exception to `may_service_out` (`_Run.ours_out` says why), and no new start.
            run.service_out(u, obs)
            adm.in_flight += 1
            continue
        if not gate.may_start:
            run.set(u, phase=U.PENDING, reason=gate.word, message=gate.message)
            adm.time_waits.add(gate.word)
            continue
        if adm.in_flight >= adm.limit:
            break
        # Owner, another operation, out of service, floor (this pass's room), preflight; the
        # preUpgrade hook runs first, the cluster held and still in service.
        why = run.service_out(u, obs, counted=adm.room, pre_hook=True)
        if why is None:
            adm.in_flight += 1
            adm.started = True
            run.note_drift(u, obs)
        elif why.reason == WAITING_FOR_BUDGET:
            adm.waiting_budget = True
            if not _moved(run, u):
                run.index.waiting[u.name] = Waiting(
                    run.status[u.name], obs, run.holder(u.cluster_id)
                )
        elif why.reason == PREFLIGHT_ASKED:
            adm.in_flight += 1


def _to_offer(run: _Run, adm: _Admission, stage: frozenset[str]) -> Sequence[Upgrade]:
    """The stage's members to offer in this pass, in order: all those Pending or Blocked; or,
    when no member can start at all (`_offer`: no gate, no room, the limit out of reach),
    only those the budget memo cannot stand for (then adm.waiting_budget says the others
    wait)."""
    memo = run.index.waiting
    per_stage = run.phases.per_stage
    n_offered = per_stage[(adm.index, U.PENDING)] + per_stage[(adm.index, U.BLOCKED)]
    stuck = not adm.gates and adm.room[0] < 1 and adm.in_flight + n_offered <= adm.limit
    if stuck:
        # In the engine's order (no gate reorders it), only those the memo cannot stand for.
        name_of = run.index.name_of
        moved = {name_of[c] for c in run.effective_changed | run.retried if c in name_of}
        touched = moved | run.changed.keys()
        if len(memo) == run.offered_before:
            # A memo is kept only for a cluster offered (Pending or Blocked) as the index last
            # saw it, and dropped when that changes: here every such cluster has one, so
            # only those this pass moved need a look (O(changed), not O(fleet)).
            by_phase = run.phases.by_phase
            pending, blocked = by_phase[U.PENDING], by_phase[U.BLOCKED]
            todo = {n for n in touched if n in stage and (n in pending or n in blocked)}
        else:
            offered = run.phases.names(U.PENDING, U.BLOCKED) & stage
            todo = offered.difference(memo) | (offered & touched)
        adm.waiting_budget = len(todo) < n_offered
        return run.index.by_rank(todo)
    offered = run.phases.names(U.PENDING, U.BLOCKED) & stage
    return [u for u in adm.members if u.name in offered]


def _moved(run: _Run, u: Upgrade) -> bool:
    """Whether this pass moved the upgrade off what the index last saw of it (its status
    changed, its cluster's effective observation, or a retry): a `Waiting` memo is recorded,
    and stands in for an offer, only while nothing did (engine.index drops it when what it
    saw changes)."""
    return (
        u.name in run.changed
        or u.cluster_id in run.effective_changed
        or u.cluster_id in run.retried
    )


def _why_waiting(run: _Run, walk: _Walk, adm: _Admission) -> None:
    """Invariant 4: when no cluster starts, the run says what it waits for (the floor's
    budget, a time gate, the provider's preflight verdict, a cluster held elsewhere)."""
    if adm.waiting_budget and not walk.blocked:
        walk.blocked = (
            f"waiting for availability budget: {run.inp.spec.required_available_count} "
            "clusters must stay available and in service"
        )
        walk.waiting = walk.waiting or "AvailabilityBudget"
        run.wake(POLL_SECONDS * 5)
    if adm.time_waits and not adm.started:
        word = "NotBefore" if "NotBefore" in adm.time_waits else "MaintenanceWindow"
        walk.waiting = walk.waiting or word
        if not walk.blocked:
            first = next(g for g in adm.waits if g.word == word)
            walk.blocked = f"waiting: {first.message}"
    if run.preflight_needed and not adm.started and not walk.blocked:
        # Invariant 4: a run that waits for the provider's verdict says so. The driver asks at
        # once and decides again, so this stays on record only while the ask fails (simulation
        # seed 7490: a failed PreflightUpgrade left the run saying only a count).
        asked = sorted(set(run.preflight_needed))
        walk.blocked = f"waiting: the provider's preflight verdict on {asked[0]}"
        walk.blocked += f" (and {len(asked) - 1} more)" if len(asked) > 1 else ""
        walk.waiting = walk.waiting or "Preflight"
    waiting = run.phases.waiting_for(*_WORLD_WAITS)
    held = [(u.cluster_id, run.status[u.name]) for u in (adm.members if waiting else ())]
    held = [(c, s) for c, s in held if s.phase == U.PENDING and s.reason in _WORLD_WAITS]
    if held and adm.in_flight == 0 and not walk.blocked:
        # Invariant 4: nothing moves until the world lets a cluster go; the run names it
        # (a person can act on that), never only a count.
        cid, st = held[0]
        walk.blocked = f"waiting: {cid}: {st.message}"
        walk.blocked += f" (and {len(held) - 1} more)" if len(held) > 1 else ""
        walk.waiting = walk.waiting or st.reason or ""


def _outs_last(run: _Run) -> tuple[dict[str, api.ClusterUpgradeStatus], frozenset[str]]:
    """The changed statuses, new service-outs last, and the names of those (Decision.admissions):
    a pass cut short (crash, conflict) has recorded the failures, skips, retries and
    completions its admissions were decided on."""
    fresh = frozenset(
        n
        for n, st in run.changed.items()
        if st.phase == U.SERVICING_OUT and run.inp.upgrades[n].status.phase not in ACTIVE
    )
    if not fresh:
        return run.changed, fresh
    out = {n: st for n, st in run.changed.items() if n not in fresh}
    out.update((n, run.changed[n]) for n in run.changed if n in fresh)
    return out, fresh


def _summarise(
    run: _Run,
    stages: list[api.StageStatus],
    current: str | None,
    halted: bool,
    blocked: str,
    budgets: _Budgets,
    next_start: str | None = None,
    waiting: str | None = None,
) -> Decision:
    """Phase 5: the decision, with the run's counts, failures, phase and message."""
    counts = _counts(run)
    phase, message, waiting = _run_phase(
        run, stages, current, halted, blocked, budgets, counts, waiting
    )
    keeping = 0
    if phase in api.FINISHED_PHASES:  # only `rests` reads it: no walk on a live run's pass
        keeping = sum(
            keeps_cluster(run.status[u.name].phase, run.status[u.name].step)
            for u in run.having(*KEEPING)
        )
        if keeping:
            run.wake(KEEP_WATCH_SECONDS)
    failures = None
    if budgets.counted or run.strategy.max_failures is not None:
        failures = api.FailureSummary(
            count=len(budgets.counted),
            max_failures=budgets.run_budget,
            clusters=[cid for cid, _, _ in budgets.counted[:20]] or None,
        )
    changed, admissions = _outs_last(run)
    return Decision(
        changed=changed,
        admissions=admissions,
        calls=run.calls,
        preflight_needed=run.preflight_needed,
        stages=stages,
        counts=api.RunCounts(total=len(run.inp.upgrades), **counts),
        phase=phase,
        message=message,
        current_stage=current,
        requeue_after=run.woken(),
        events=run.events,
        retried=run.retried,
        skipped=run.skipped,
        hook_calls=run.hook_calls,
        failures=failures,
        next_start_time=next_start,
        waiting_reason=waiting,
        keeping=keeping,
    )


def rests(phase: api.RunPhase | str | None, holding: int) -> bool:
    """Whether a run needs no pass until it is edited (resumed, retried, skipped, deleted):
    its phase is finished and none of its ClusterUpgrades holds its cluster (holding: how many
    do, `index.holds_cluster`; the Decision's `keeping` after a pass). A finished run whose
    ended attempts keep clusters is looked at every KEEP_WATCH_SECONDS: it holds them against
    every other run until it lets them go, which it does once it sees them in service
    (`_released`), so a finished run that never looked again would hold them for ever; and a
    retry a person asked while its cluster was not at rest applies once it is
    (`_retry_at_rest`). A cluster held active under a finished phase (the run's status write
    lost after its ClusterUpgrade's: simulation seed 498) is looked at too. The controller and
    the simulation decide by this."""
    return phase in api.FINISHED_PHASES and not holding


def _counts(run: _Run) -> dict[str, int]:
    """How many of the run's clusters are in each phase (every active phase is in flight)."""
    counts = {"pending": 0, "in_flight": 0, "upgraded": 0, "failed": 0, "blocked": 0, "skipped": 0}
    for phase, names in run.phases.by_phase.items():
        key = {
            U.UPGRADED: "upgraded",
            U.FAILED: "failed",
            U.BLOCKED: "blocked",
            U.SKIPPED: "skipped",
            U.PENDING: "pending",
        }.get(phase, "in_flight")
        counts[key] += len(names)
    return counts


def _run_phase(
    run: _Run,
    stages: Sequence[api.StageStatus],
    current: str | None,
    halted: bool,
    blocked: str,
    budgets: _Budgets,
    counts: Mapping[str, int],
    waiting: str | None,
) -> tuple[api.RunPhase, str, str | None]:
    """The run's phase, its message and why it waits: stopping or stopped, succeeded, failed,
    halted (past the budget, or a failed cluster), else progressing."""
    total = len(run.inp.upgrades)
    in_flight = counts["in_flight"]
    # A failed cluster being serviced back in (failedClusterPolicy) keeps the run going.
    policy = run.strategy.failed_cluster_policy
    recovering = sorted(
        u.cluster_id for u in run.having(U.FAILED) if brought_back(run.status[u.name], policy)
    )
    finished = (
        all(s.phase in (api.StagePhase.COMPLETED, api.StagePhase.SKIPPED) for s in stages)
        and not recovering
    )
    if run.stopping:
        phase = api.RunPhase.STOPPING if in_flight else api.RunPhase.STOPPED
        return phase, f"stopped by spec.state; {in_flight} cluster(s) finishing their step", waiting
    if finished and counts["failed"] + counts["blocked"] == 0 and in_flight == 0:
        message = f"{counts['upgraded']} upgraded, {counts['skipped']} skipped of {total}"
        return api.RunPhase.SUCCEEDED, message, waiting
    if finished and in_flight == 0:
        message = f"finished with {counts['failed']} failed and {counts['blocked']} blocked"
        why = sorted(
            (u.cluster_id, run.status[u.name].message or "")
            for u in run.having(U.FAILED, U.BLOCKED)
        )
        if why:  # the run says why, not only how many
            message += f"; {why[0][0]}: {why[0][1]}"
        return api.RunPhase.FAILED, message, waiting
    if halted and budgets.counted:
        return api.RunPhase.HALTED, _past_budget(stages, budgets), waiting
    if halted:
        failed = sorted(
            (u.cluster_id, run.status[u.name].message or "") for u in run.having(U.FAILED)
        )
        message = (
            f"halted: cluster {failed[0][0]} failed: {failed[0][1]}"
            if failed
            else f"halted: {blocked}"
        )
        return api.RunPhase.HALTED, message, waiting
    if recovering and not in_flight and not blocked:
        # Invariant 4: only a failed cluster's way back in keeps the run going; say so.
        blocked = (
            f"waiting: {recovering[0]} failed and is serviced back in once healthy "
            "(failedClusterPolicy ServiceInIfHealthy)"
        )
        waiting = waiting or "Recovering"
    message = blocked or (
        f"{counts['upgraded']}/{total} upgraded, {in_flight} in flight"
        + (f", stage {current}" if current else "")
    )
    return api.RunPhase.PROGRESSING, message, waiting


def _past_budget(stages: Sequence[api.StageStatus], budgets: _Budgets) -> str:
    """The message of a run halted past its failure budget: the budgets, the stages past their
    own, and the first failures counted."""
    limit = "unlimited" if budgets.run_budget is None else str(budgets.run_budget)
    past = [
        f"stage {s.name} ({s.failed} failed, maxFailures {s.max_failures})"
        for s, over in zip(stages, budgets.over, strict=True)
        if over and s.max_failures is not None and s.phase != api.StagePhase.SKIPPED
    ]
    message = (
        f"halted: {len(budgets.counted)} failure(s) past the budget (run maxFailures "
        f"{limit}{'; ' + ', '.join(past) if past else ''}): "
        + "; ".join(
            f"{cid} ({reason}): {_short(text)}" for cid, reason, text in budgets.counted[:3]
        )
    )
    if len(budgets.counted) > 3:
        message += f"; and {len(budgets.counted) - 3} more"
    return message


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
    text = f"{call.kind.value}: {cause_first(code, message)}"
    if chained := at_chained(status, call.request_id):
        status = status.model_copy(update=chained)  # what failed is on record as in flight
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
            update = {
                "phase": U.FAILED,
                "reason": "Refused",
                "message": text,
                "end_time": attempt_end(status, stamp),
            }
        return status.model_copy(update={**update, "last_transition_time": stamp}), None
    wait = 30.0 if code == "FAILED_PRECONDITION" else 2.0
    return status.model_copy(update={"message": f"will ask again: {text}"}), wait


def with_status(u: Upgrade, status: api.ClusterUpgradeStatus) -> Upgrade:
    """The upgrade with a new status (a helper for drivers and models)."""
    return Upgrade(u.name, u.spec, status)
