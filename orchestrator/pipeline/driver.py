"""One UpdateRun reconcile as a pipeline: observe → decide (pure) → record intents → act → record.

The driver knows the world only through four small protocols, so the product (kube + gRPC
adapters in orchestrator.runs) and the adversarial simulation (tests/sim) run this same code:

- `UpgradeStore`: conditional writes of ClusterUpgrade status (resourceVersion; a stale write
  raises `WriteConflict` and nothing after it happens in this pass).
- `Provider`: the plugin (inventory + operations snapshot, preflight, the four mutations).
- `Checker`: health-check evaluation for a set of clusters.
- `Fence`: whether this replica still holds the Lease; checked before every plugin call.
- `HookRunner` (optional): starts pre/post-upgrade hooks by their deterministic id and reports
  what it knows of them (orchestrator.hooks in the product); started, like calls, only after
  the intent (HookStatus Running) is on record.

`RunDriver.step` returns a `StepResult`: everything its caller records (the decision, from
which `StepResult.run_status` builds the run's status, and every ClusterUpgrade write that took
effect); data flows one way, nothing returned is edited afterwards.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol, TypeVar, runtime_checkable

from orchestrator import api
from orchestrator.engine.conditions import cause_first, format_time, parse_time
from orchestrator.engine.decide import (
    ACTIVE,
    POST_HOOK,
    Call,
    Decision,
    Floor,
    HookObs,
    HookState,
    Preflight,
    RunInput,
    Upgrade,
    awaits_checks,
    call_failed,
    checks_for,
    decide,
    service_in_on_record,
    short_of_target,
    with_status,
)
from orchestrator.engine.health import due_in, record
from orchestrator.engine.index import FULL_EVERY, FULL_SECONDS, RunIndex
from orchestrator.engine.observations import ClusterObs, OpObs, Snapshot, unreachable_snapshot
from orchestrator.engine.transitions import ClusterChange

__all__ = [
    "CallError",
    "Checker",
    "Fence",
    "HookRequest",
    "HookRunner",
    "Provider",
    "Question",
    "RunDriver",
    "StartsBatches",
    "StartsRequests",
    "StepResult",
    "UpgradeStore",
    "WriteConflict",
    "holdings",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class WriteConflict(Exception):
    """The object changed since it was read (HTTP 409): re-read, decide again."""


class CallError(Exception):
    """A plugin call failed: the gRPC code name, whether retrying can help, and the words.
    As text: the words first, the code said once (engine.conditions.cause_first)."""

    def __init__(self, code: str, message: str, retryable: bool, retry_after: float = 0.0):
        super().__init__(cause_first(code, message))
        self.code = code
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after


class UpgradeStore(Protocol):
    """Conditional status writes of ClusterUpgrades."""

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        """Write status if the object is unchanged since read; raise WriteConflict if not."""


class Provider(Protocol):
    """The plugin behind a run."""

    @property
    def supports_preflight(self) -> bool:
        """Whether PreflightUpgrade is declared."""

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        """Inventory and the latest known operations (by request id)."""

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        """Ask whether the upgrade would be accepted now (version "": the control plane stays;
        pools: only those that would change); raise CallError on failure."""

    def call(self, call: Call) -> OpObs:
        """Make one mutating call; raise CallError on failure."""


@runtime_checkable
class StartsRequests(Protocol):
    """A Provider that can start a preflight or a call without a thread waiting on it (the
    gRPC adapter): the driver starts a pass's from its own thread, at most `parallelism` at
    once, and takes their answers in order. Calling what a start returns waits for the
    answer, or raises CallError as the blocking method would."""

    def start_preflight(
        self, cluster_id: str, version: str, pools: Mapping[str, str]
    ) -> Callable[[], Preflight]:
        """Provider.preflight, started."""

    def start_call(self, call: Call) -> Callable[[], OpObs]:
        """Provider.call, started."""


#: A preflight question: start_preflight's arguments (cluster id, control-plane target, pool
#: targets).
Question = tuple[str, str, Mapping[str, str]]


@runtime_checkable
class StartsBatches(Protocol):
    """A StartsRequests provider that can also start many calls, or many preflights, as one
    request (the gRPC adapter: StartOperations, PreflightUpgrades): one start per BATCH_CALLS
    instead of one each. Either returns None when not offered (nothing started), and None
    for one item not started with the others (the driver starts it alone: a run over several
    providers, one of which does not batch)."""

    def start_calls(self, calls: Sequence[Call]) -> Sequence[Callable[[], OpObs] | None] | None:
        """start_call of each, started together."""

    def start_preflights(
        self, questions: Sequence[Question]
    ) -> Sequence[Callable[[], Preflight] | None] | None:
        """start_preflight of each, started together."""


#: The most calls started as one request (StartsBatches; the contract allows 1000).
BATCH_CALLS = 100


class Checker(Protocol):
    """Evaluates health checks."""

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        """One evaluation of every check over the clusters."""


class Fence(Protocol):
    """Leadership: a replica that lost the Lease issues nothing more."""

    def held(self) -> bool:
        """True while this replica may act."""


@dataclass(frozen=True)
class HookRequest:
    """Everything an executor needs to start or observe one hook (built by the driver)."""

    #: The run as "namespace/name" and its uid.
    run: str
    run_uid: str
    #: The ClusterUpgrade (its name) and the cluster.
    upgrade: str
    cluster_id: str
    kind: str
    #: The deterministic id (engine.hook_id): the Job name and the HTTP Idempotency-Key.
    id: str
    attempt: int
    hook: api.Hook
    current_version: str
    target_version: str
    #: When the intent was recorded: the hook's deadline is this + hook.timeout.
    start_time: datetime

    @property
    def namespace(self) -> str:
        """The run's namespace (the Job's, and where the hook's Secrets are read)."""
        return self.run.partition("/")[0]

    @property
    def run_name(self) -> str:
        """The run's name."""
        return self.run.partition("/")[2]


class HookRunner(Protocol):
    """Runs hooks; idempotent by request id (never runs one id twice)."""

    def start(self, request: HookRequest) -> None:
        """Start the hook (a Job: create it, or adopt the existing one); never blocks for
        its outcome. Failures are reported by `observe`."""

    def observe(self, request: HookRequest) -> HookObs:
        """What is known of the hook now (UNKNOWN: nothing, e.g. after a restart)."""


@dataclass
class StepResult:
    """Everything one pass of a run did: what its caller records, and nothing to patch after.

    The run's status is `run_status` (built from the decision); the ClusterUpgrade writes that
    took effect are `changes` (with the phases the decision took each through: what
    orchestrator.transitions turns into Events and notifications).
    """

    decision: Decision
    calls_made: int = 0
    conflicts: int = 0
    fenced: bool = False
    requeue_after: float | None = None
    #: The ClusterUpgrade status writes that took effect, in the order they did.
    changes: list[ClusterChange] = field(default_factory=list)
    #: Why the provider could not be asked for the inventory this pass (None: it answered).
    #: Its clusters were unknown (`unreachable_snapshot`): the run is Degraded meanwhile.
    unreachable: CallError | None = None

    @property
    def writes(self) -> int:
        """How many ClusterUpgrade status writes took effect."""
        return len(self.changes)

    def run_status(self, before: api.UpdateRunStatus, now: datetime) -> api.UpdateRunStatus:
        """The run's status after this pass, from the decision (the UpdateRun controller adds
        its conditions; the simulation writes it as is); endTime is stamped once, when the run
        finishes."""
        d = self.decision
        finished = d.phase in _FINAL
        return before.model_copy(
            update={
                "phase": d.phase,
                "message": d.message,
                "current_stage": d.current_stage,
                "counts": d.counts,
                "stages": d.stages,
                "failures": d.failures,
                "next_start_time": d.next_start_time,
                "waiting_reason": d.waiting_reason,
                "end_time": (before.end_time or format_time(now)) if finished else None,
            }
        )


#: The phases the decision took a ClusterUpgrade through in one pass, with their messages.
_Steps = tuple[tuple[api.UpgradePhase, str], ...]


@dataclass
class _Pass:
    """One pass's scope: its input, its decision, and what of it took effect so far."""

    inp: RunInput
    decision: Decision
    result: StepResult = field(init=False)
    #: ClusterUpgrades whose intent write took effect.
    written: set[str] = field(default_factory=set)
    _steps: dict[str, _Steps] = field(init=False)

    def __post_init__(self) -> None:
        self.result = StepResult(self.decision, requeue_after=self.decision.requeue_after)
        index = self.inp.index
        upgrade_of = index.name_of if index is not None else None
        self._steps = _steps_of(self.decision, self.inp.upgrades, upgrade_of)

    def on_record(self, name: str) -> bool:
        """Whether a call or hook for this ClusterUpgrade may go: its intent's write took
        effect, or it had nothing to write and no write of the pass conflicted."""
        return name in self.written or (
            name not in self.decision.changed and not self.result.conflicts
        )

    def took_effect(self, upgrade: Upgrade, new: api.ClusterUpgradeStatus) -> None:
        """A write of upgrade's status took effect (call under the driver's lock); the
        decision's own write carries the phases it went through."""
        mine = self.decision.changed.get(upgrade.name)
        decided = new is mine or new == mine
        self.result.changes.append(
            ClusterChange(
                upgrade.name,
                upgrade.cluster_id,
                upgrade.spec.stage,
                upgrade.status,
                new,
                self._steps.get(upgrade.name, ()) if decided else (),
            )
        )


def _steps_of(
    decision: Decision,
    upgrades: Mapping[str, Upgrade],
    upgrade_of: Mapping[str, str] | None = None,
) -> dict[str, _Steps]:
    """By ClusterUpgrade name, the phases the decision took each it changed through (its
    events: a retry goes Failed → Pending → on in one pass). upgrade_of: cluster id → name
    (the run's index has it), else made from upgrades."""
    if upgrade_of is None:
        upgrade_of = {u.cluster_id: u.name for u in upgrades.values()} if decision.events else {}
    out: dict[str, list[tuple[api.UpgradePhase, str]]] = {}
    for cid, phase, message, _ in decision.events:
        name = upgrade_of.get(cid)
        if name is not None and name in decision.changed:
            out.setdefault(name, []).append((api.UpgradePhase(phase), message))
    return {name: tuple(steps) for name, steps in out.items()}


@dataclass
class RunDriver:
    """Runs one reconcile of one run against the protocols."""

    provider: Provider
    store: UpgradeStore
    checker: Checker
    fence: Fence
    #: Preflight answers kept between passes (cluster id → answer), per driver.
    preflight_cache: dict[str, Preflight] = field(default_factory=dict)
    #: Writes and calls made at once (1: in order, stopping at the first conflict).
    parallelism: int = 1
    #: A long-lived pool of `parallelism` workers to make them on (None: one per pass).
    executor: Executor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Invariant 3: ClusterUpgrades whose failing evaluation could not be recorded (the write
    #: conflicted or got no answer); their next evaluation counts passes from zero. Keep it
    #: between passes like preflight_cache (the controller owns it).
    unrecorded_failures: set[str] = field(default_factory=set)
    #: The same for stage-level checks, whose health the run's status write records: (run,
    #: stage) → time of a failing evaluation; until the stored health shows it (or later),
    #: the next evaluation counts passes from zero.
    stage_failures: dict[tuple[str, str], datetime] = field(default_factory=dict)
    #: The hook executor (None: hooks fail, saying this orchestrator runs none).
    hooks: HookRunner | None = None
    #: The run's upgrades by phase and in order, kept between passes (engine.index) so that a
    #: pass looks at what changed; every FULL_EVERY passes it is rebuilt from scratch and
    #: compared. Keep it between passes like preflight_cache (the controller owns it).
    index: RunIndex = field(default_factory=RunIndex)
    #: Clusters whose provider did not answer, by the first pass since it last answered that
    #: found it so (RunInput.unknown_since). Keep it between passes like preflight_cache.
    unknown_since: dict[str, datetime] = field(default_factory=dict)

    def step(
        self,
        *,
        key: str,
        uid: str,
        spec: api.UpdateRunSpec,
        upgrades: Mapping[str, Upgrade],
        stages: Sequence[api.StageStatus],
        held_by: Mapping[str, str],
        now: datetime,
        approved: frozenset[str] = frozenset(),
        retry: frozenset[str] = frozenset(),
        skip: frozenset[str] = frozenset(),
        floors: Sequence[Floor] = (),
        skip_stages: frozenset[str] = frozenset(),
        requested_by: str = "",
        reason: str = "",
        changed: Collection[str] | None = None,
    ) -> StepResult:
        """Observe, decide, persist intents, then call; returns everything the pass did.

        floors: the other live runs on this provider sharing clusters with this one; their
        members are observed too, and held_by must name their holders.
        changed: the names of the upgrades whose objects may differ from those of the
        previous pass's `upgrades` (the caller's watch knows: a new resourceVersion); only
        these are looked at. None: unknown, every object is compared. What it misses, the
        full pass (FULL_EVERY) finds; no floor lets a cluster go on it unchecked (decide).
        """
        index = self._index(uid, upgrades, changed)
        ids: Sequence[str] = index.ids
        if floors:
            ids = [*ids, *sorted({cid for f in floors for cid in f.members} - index.members)]
        unreachable: CallError | None = None
        try:
            snapshot = self.provider.snapshot(ids)
        except CallError as err:
            # A provider that cannot be asked (a run's one plugin; a member of several is
            # answered for by orchestrator.pipeline.multi the same way) leaves the pass to go
            # on with its clusters unknown: nothing is decided on them, and a step in flight
            # fails at its bound (invariant 4; simulation seeds 81718, 85618: an aborted pass
            # left a cluster out of service past it for as long as the plugin was down).
            unreachable = err
            snapshot = unreachable_snapshot(ids, f"its plugin is unavailable ({err.code})")
        self._full_pass(index, uid, upgrades, snapshot, held_by, now)
        self._note_silence(snapshot, index, now)
        upgrades, health_changed = self._evaluate_clusters(spec, upgrades, snapshot, now)
        stages = self._evaluate_stages(key, spec, upgrades, stages, snapshot, now)
        hook_obs = self._observe_hooks(key, uid, spec, upgrades, snapshot)
        inp = RunInput(
            key=key,
            uid=uid,
            spec=spec,
            upgrades=upgrades,
            snapshot=snapshot,
            now=now,
            held_by=held_by,
            preflight=self.preflight_cache,
            preflight_supported=self.provider.supports_preflight,
            stages=stages,
            approved_stages=approved,
            retry_clusters=retry,
            skip_clusters=skip,
            skip_stages=skip_stages,
            requested_by=requested_by,
            reason=reason,
            floors=floors,
            hooks=hook_obs,
            index=index,
            index_stale=frozenset(health_changed),
            unknown_since=self.unknown_since,
        )
        # The index sees the health records' objects in this pass: the caller's, next time.
        index.lent = set(health_changed)
        p = _Pass(inp, self._decide(inp))
        # Record intents (and health progress) before any call: a crash after this write
        # resumes with the same request ids; a crash before it never called.
        # In the decision's order (it writes new service-outs last), health-only writes first.
        to_write = {k: v for k, v in health_changed.items() if k not in p.decision.changed}
        to_write.update(p.decision.changed)
        self._write_all(p, to_write)
        self.unrecorded_failures -= p.written & health_changed.keys()
        self._act(p)
        self._start_hooks(p)
        p.result.unreachable = unreachable
        return self._settle(p)

    def _note_silence(self, snapshot: Snapshot, index: RunIndex, now: datetime) -> None:
        """Bring `unknown_since` up to date: a cluster unknown now keeps the pass that first
        found it so; one whose provider answered (seen, or this run's and gone) is dropped.
        Costs what is unknown, not the fleet."""
        silent = self.unknown_since
        for cid in [c for c in silent if c not in snapshot.unknown]:
            if cid in snapshot.clusters or cid in index.members:
                del silent[cid]
        for cid in snapshot.unknown:
            silent.setdefault(cid, now)

    def _index(
        self, uid: str, upgrades: Mapping[str, Upgrade], changed: Collection[str] | None
    ) -> RunIndex:
        """The run's index brought up to date with this pass's upgrades."""
        index = self.index
        index.observe(uid, upgrades, changed)
        index.passes += 1
        return index

    @staticmethod
    def _full_pass(
        index: RunIndex,
        uid: str,
        upgrades: Mapping[str, Upgrade],
        snapshot: Snapshot,
        held_by: Mapping[str, str],
        now: datetime,
    ) -> None:
        """Every FULL_EVERY passes, and at least every FULL_SECONDS while the index rests on
        what callers said changed, the index is also made from scratch: the two must agree
        (if they do not, it is rebuilt and the difference logged: a bug, never a decision on a
        stale count)."""
        overdue = index.told and (
            index.full_at is None or (now - index.full_at).total_seconds() >= FULL_SECONDS
        )
        if index.passes % FULL_EVERY and not overdue:
            return
        index.full_at = now
        index.observe_world(snapshot.clusters, held_by)
        fresh = RunIndex.build(uid, upgrades, snapshot.clusters, held_by)
        differences = index.differences(fresh)
        if differences:
            log.error(
                "run %s: the kept index disagreed with a full pass on %s; rebuilt",
                uid,
                ", ".join(differences),
            )
            index.rebuild(uid, upgrades)
            index.observe_world(snapshot.clusters, held_by)

    def _decide(self, inp: RunInput) -> Decision:
        """The decision; when it needs the provider's preflight verdict on clusters, they are
        asked about (at once, bounded like the writes) and it is taken again."""
        decision = decide(inp)
        if not decision.preflight_needed or not self.fence.held():
            return decision
        by_cluster = {u.cluster_id: u for u in inp.upgrades.values()}

        def question(cid: str) -> tuple[str, Mapping[str, str]] | None:
            obs = inp.snapshot.clusters.get(cid)
            if obs is None:
                return None  # gone: the next decision records it
            # Only what is still short of target (invariant 7): a control plane at or past
            # it is not asked for (that would be a downgrade), its pools are judged
            # against the version it has.
            control_plane, pools = short_of_target(obs, by_cluster[cid].spec)
            if not control_plane and not pools:
                return None  # at target: the next decision records it, nothing to ask
            return control_plane, pools

        def answered(cid: str, answer: Callable[[], Preflight]) -> None:
            try:
                found = answer()
            except CallError as err:
                log.info("preflight of %s failed: %s", cid, err)
                return
            with self._lock:
                self.preflight_cache[cid] = replace(found, version=by_cluster[cid].spec.version)

        # A wave of admissions asks about each cluster at once (bounded, like the writes).
        asked = list(decision.preflight_needed)
        starter = self._starter()
        if starter is not None:
            questions = [(cid, *q) for cid in asked if (q := question(cid)) is not None]

            def done(q: Question, answer: Callable[[], Preflight]) -> None:
                answered(q[0], answer)

            if isinstance(starter, StartsBatches):
                questions, _ = self._batched(starter.start_preflights, questions, done)
            self._pipelined(lambda q: starter.start_preflight(*q), done, questions)
        else:
            provider = self.provider

            def ask(cid: str) -> None:
                q = question(cid)
                if q is not None:
                    answered(cid, lambda: provider.preflight(cid, *q))

            self._each(ask, asked)
        return decide(inp)

    def _act(self, p: _Pass) -> None:
        """Make the decision's calls whose intent is on record, while the Lease is held; a
        failed call is recorded on its ClusterUpgrade (engine.call_failed)."""
        decision, upgrades, now = p.decision, p.inp.upgrades, p.inp.now
        result = p.result

        def failed(call: Call, err: CallError) -> None:
            u = upgrades[call.upgrade]
            status = decision.changed.get(call.upgrade, u.status)
            new, wait = call_failed(status, call, err.code, err.retryable, err.message, now)
            if err.retry_after:
                wait = err.retry_after
            conflicted = False
            try:
                self.store.write_upgrade_status(with_status(u, status), new)
            except WriteConflict:
                conflicted = True
            with self._lock:
                if not conflicted:
                    p.took_effect(with_status(u, status), new)
                result.conflicts += conflicted
                result.requeue_after = _min(result.requeue_after, wait if wait is not None else 0.0)

        calls = [c for c in decision.calls if p.on_record(c.upgrade)]
        starter = self._starter()
        if starter is not None:
            failures: list[tuple[Call, CallError]] = []

            def start(call: Call) -> Callable[[], OpObs] | None:
                if not self.fence.held():
                    result.fenced = True
                    return None
                return starter.start_call(call)

            def collect(call: Call, operation: Callable[[], OpObs]) -> None:
                try:
                    operation()
                    result.calls_made += 1  # only this thread counts here
                except CallError as err:
                    failures.append((call, err))

            # The calls from this thread; the writes that record failures on the workers.
            if isinstance(starter, StartsBatches):
                calls, fenced = self._batched(starter.start_calls, calls, collect)
                result.fenced = result.fenced or fenced
            self._pipelined(start, collect, calls)
            self._each(lambda f: failed(*f), failures)
            return
        provider = self.provider

        def act(call: Call) -> None:
            if not self.fence.held():
                result.fenced = True
                return
            try:
                provider.call(call)
                with self._lock:
                    result.calls_made += 1
            except CallError as err:
                failed(call, err)

        self._each(act, calls)

    def _start_hooks(self, p: _Pass) -> None:
        """Start the decision's hooks whose intent is on record, while the Lease is held."""
        decision, inp = p.decision, p.inp
        hook_calls = [c for c in decision.hook_calls if p.on_record(c.upgrade)]
        if hook_calls and self.fence.held():
            for hc in hook_calls:
                u = inp.upgrades[hc.upgrade]
                request = self._hook_request(
                    inp.key,
                    inp.uid,
                    inp.spec,
                    u,
                    decision.changed.get(hc.upgrade, u.status),
                    inp.snapshot,
                )
                if request is not None and self.hooks is not None:
                    self.hooks.start(request)
        elif hook_calls:
            p.result.fenced = True

    @staticmethod
    def _settle(p: _Pass) -> StepResult:
        """When to look again; a decision not wholly on record does not finish the run."""
        decision, result = p.decision, p.result
        if decision.calls and result.calls_made:
            result.requeue_after = _min(result.requeue_after, 1.0)
        if result.conflicts and decision.phase in _FINAL:
            # Invariant 4: a decision not wholly on record cannot finish the run (a cluster
            # whose write conflicted may still be out of service); look again at once.
            result.decision = replace(
                decision,
                phase=api.RunPhase.STOPPING
                if decision.phase == api.RunPhase.STOPPED
                else api.RunPhase.PROGRESSING,
                message=f"{decision.message} (a write conflicted; looking again)",
            )
            result.requeue_after = 0.0
        return result

    def _write_all(self, p: _Pass, to_write: Mapping[str, api.ClusterUpgradeStatus]) -> None:
        """Write every changed status; those that took effect go into `p.written`."""
        result, upgrades = p.result, p.inp.upgrades

        def write(name: str) -> None:
            if self.parallelism == 1 and result.conflicts:
                return  # sequential: stop at the first conflict (the rest waits a pass)
            try:
                self.store.write_upgrade_status(upgrades[name], to_write[name])
            except WriteConflict:
                with self._lock:
                    result.conflicts += 1
                    result.requeue_after = 0.0
                return
            with self._lock:
                p.written.add(name)
                p.took_effect(upgrades[name], to_write[name])

        # The decision's admissions rest on every other write (Decision.admissions): they go
        # once those all took effect, never beside them (several writes at once do not stop
        # at a conflict; simulation seeds 819, 1132: a stage's completion and a retry
        # conflicted while the next admissions beside them were written and called).
        admissions = p.decision.admissions
        self._each(write, [n for n in to_write if n not in admissions])
        if admissions and not result.conflicts:
            self._each(write, [n for n in to_write if n in admissions])

    def _starter(self) -> StartsRequests | None:
        """The provider, when it starts requests itself and the pass is not made in order."""
        provider = self.provider
        if self.parallelism > 1 and isinstance(provider, StartsRequests):
            return provider
        return None

    def _batched(
        self,
        start: Callable[[Sequence[T]], Sequence[Callable[[], R] | None] | None],
        items: list[T],
        done: Callable[[T, Callable[[], R]], None],
    ) -> tuple[list[T], bool]:
        """Start the items (a StartsBatches method) BATCH_CALLS at a time, each batch only
        while the Lease is held, and hand each to done in order (done waits for its answer).
        Returns the items left to make one by one (all of them when the provider does not
        offer batches; those a batch did not start), and whether the Lease was lost."""
        started: list[tuple[T, Callable[[], R]]] = []
        left: list[T] = []
        fenced = False
        try:
            for at in range(0, len(items), BATCH_CALLS):
                chunk = items[at : at + BATCH_CALLS]
                if not self.fence.held():
                    fenced = True
                    break
                answers = start(chunk)
                if answers is None:
                    left.extend(items[at:])
                    break
                for item, answer in zip(chunk, answers, strict=True):
                    if answer is None:
                        left.append(item)
                    else:
                        started.append((item, answer))
        finally:
            for item, answer in started:
                done(item, answer)
        return left, fenced

    def _pipelined(
        self,
        start: Callable[[T], Callable[[], R] | None],
        done: Callable[[T, Callable[[], R]], None],
        items: Sequence[T],
    ) -> None:
        """Start each item's request from this thread (start: None when there is none to
        make), at most `parallelism` in flight, and hand each to done in the order started
        (done waits for its answer). A request started is always handed to done, even when
        another's raised: its answer is taken before the error goes on."""
        window: deque[tuple[T, Callable[[], R]]] = deque()
        try:
            for item in items:
                if len(window) >= self.parallelism:
                    done(*window.popleft())
                started = start(item)
                if started is not None:
                    window.append((item, started))
        finally:
            while window:
                done(*window.popleft())

    def _each(self, fn: Callable[[T], None], items: Sequence[T]) -> None:
        """fn over items: in order, or shared by at most `parallelism` workers (the product's
        API latency), each taking the next item in order when it is free.

        The workers are the caller and one pool task each (the controller's long-lived pool;
        else threads for this call), not one task per item: a Future per write or call cost
        the reconcile thread a submit, a Future and its Condition per item, and woke a worker
        per item. Each item's outcome is fn's own, as before. The first exception fn raises
        stops the items not yet started (as Executor.map cancelled them) and is raised here
        once every worker has stopped.
        """
        workers = min(self.parallelism, len(items))
        if workers <= 1:
            for item in items:
                fn(item)
            return
        taken = threading.Lock()
        position = 0
        failed: list[BaseException] = []

        def work() -> None:
            nonlocal position
            while True:
                with taken:
                    if failed or position >= len(items):
                        return
                    item = items[position]
                    position += 1
                try:
                    fn(item)
                except BaseException as exc:
                    with taken:
                        failed.append(exc)
                    return

        with ExitStack() as scope:
            # The controller's long-lived pool (no threads per pass), else threads for this call.
            pool = self.executor or scope.enter_context(ThreadPoolExecutor(workers - 1))
            helpers = [pool.submit(work) for _ in range(workers - 1)]
            work()
            for helper in helpers:
                helper.result()
        if failed:
            raise failed[0]

    def _observe_hooks(
        self,
        key: str,
        uid: str,
        spec: api.UpdateRunSpec,
        upgrades: Mapping[str, Upgrade],
        snapshot: Snapshot,
    ) -> dict[str, HookObs]:
        """What the executor knows of every hook recorded Running (by hook id)."""
        hooked = self.index.names_in(api.UpgradePhase.PRE_HOOK, api.UpgradePhase.POST_HOOK)
        requests = [
            r
            for u in (upgrades[n] for n in hooked)
            if u.status.hook is not None
            and u.status.hook.phase == api.HookPhase.RUNNING
            and u.status.phase in (api.UpgradePhase.PRE_HOOK, api.UpgradePhase.POST_HOOK)
            and (r := self._hook_request(key, uid, spec, u, u.status, snapshot)) is not None
        ]
        out: dict[str, HookObs] = {}

        def observe(request: HookRequest) -> None:
            if self.hooks is None:
                seen = HookObs(HookState.FAILED, "this orchestrator was started without hooks")
            else:
                seen = self.hooks.observe(request)
            with self._lock:
                out[request.id] = seen

        self._each(observe, requests)
        return out

    @staticmethod
    def _hook_request(
        key: str,
        uid: str,
        spec: api.UpdateRunSpec,
        u: Upgrade,
        status: api.ClusterUpgradeStatus,
        snapshot: Snapshot,
    ) -> HookRequest | None:
        """The request for the hook recorded on status (None when the spec has none)."""
        hook = status.hook
        hooks = spec.strategy.hooks if spec.strategy is not None else None
        if hook is None or hooks is None:
            return None
        which = hooks.post_upgrade if hook.kind == POST_HOOK else hooks.pre_upgrade
        if which is None:
            return None
        obs = snapshot.clusters.get(u.cluster_id)
        return HookRequest(
            run=key,
            run_uid=uid,
            upgrade=u.name,
            cluster_id=u.cluster_id,
            kind=hook.kind,
            id=hook.id,
            attempt=status.attempt,
            hook=which,
            current_version=obs.control_plane_version if obs is not None else "",
            target_version=u.spec.version,
            start_time=parse_time(hook.start_time),
        )

    def _evaluate_clusters(
        self,
        spec: api.UpdateRunSpec,
        upgrades: Mapping[str, Upgrade],
        snapshot: Snapshot,
        now: datetime,
    ) -> tuple[Mapping[str, Upgrade], dict[str, api.ClusterUpgradeStatus]]:
        """Run the checks that are due for clusters in Verifying; health lives on the upgrade.

        A failing evaluation of ours that no write recorded (unrecorded_failures) breaks the
        passes on record: the next evaluation counts from zero, and a service-in that another
        replica decided on those passes gets them reset on record before it is asked again.
        """
        changed: dict[str, api.ClusterUpgradeStatus] = {}
        # Those awaiting checks (Verifying; Failed, recovering) or with a failure unrecorded;
        # the others would be passed over below.
        looked = self.index.names_in(api.UpgradePhase.VERIFYING, api.UpgradePhase.FAILED)
        looked += [n for n in self.unrecorded_failures if n in upgrades]
        for name in sorted(set(looked), key=self.index.in_rank.__getitem__):
            u = upgrades[name]
            st = u.status
            base = st.health
            if base is not None and base.passes and name in self.unrecorded_failures:
                base = base.model_copy(update={"passes": 0})
                if service_in_on_record(st):
                    changed[name] = st.model_copy(update={"health": base})
                    continue
            checks = checks_for(spec, u.spec.stage)
            obs = snapshot.clusters.get(u.cluster_id)
            if (
                not awaits_checks(st)
                or base is None
                or checks is None
                or obs is None
                or not obs.available
                or due_in(base, checks, now) > 0
            ):
                continue
            results = self.checker.evaluate(checks, [obs], u.spec.stage)
            if not all(r.passed for r in results):
                self.unrecorded_failures.add(name)  # until the write below takes effect
            changed[name] = st.model_copy(update={"health": record(base, results, now)})
        if not changed:
            return upgrades, changed  # the caller's, not a copy per pass
        out = dict(upgrades)
        for name, new in changed.items():
            out[name] = with_status(upgrades[name], new)
        return out, changed

    def _evaluate_stages(
        self,
        key: str,
        spec: api.UpdateRunSpec,
        upgrades: Mapping[str, Upgrade],
        stages: Sequence[api.StageStatus],
        snapshot: Snapshot,
        now: datetime,
    ) -> list[api.StageStatus]:
        out = list(stages)
        for i, st in enumerate(out):
            checks = checks_for(spec, st.name)
            if (
                st.phase != api.StagePhase.VERIFYING
                or st.health is None
                or checks is None
                or due_in(st.health, checks, now) > 0
            ):
                continue
            if any(
                u.spec.stage == st.name and u.cluster_id in snapshot.unknown
                for u in upgrades.values()
            ):
                continue  # a member's provider cannot be asked: no pass counts without it
            members = [
                snapshot.clusters[u.cluster_id]
                for u in upgrades.values()
                if u.spec.stage == st.name and u.cluster_id in snapshot.clusters
            ]
            base = st.health
            lost = self.stage_failures.get((key, st.name))
            seen = base.last_check_time
            if lost is not None and seen is not None and parse_time(seen) >= lost:
                del self.stage_failures[(key, st.name)]  # recorded (or something after it)
            elif lost is not None:
                base = base.model_copy(update={"passes": 0})  # that failure was never recorded
            results = self.checker.evaluate(checks, members, st.name)
            if not all(r.passed for r in results):
                self.stage_failures[(key, st.name)] = now
            out[i] = st.model_copy(update={"health": record(base, results, now)})
        return out


_FINAL = api.FINISHED_PHASES


def _min(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def holdings(upgrades: Sequence[tuple[str, Upgrade]]) -> dict[str, str]:
    """cluster id → holder run key, over (run key, upgrade) pairs in active phases."""
    return {u.cluster_id: run for run, u in upgrades if u.status.phase in ACTIVE}
