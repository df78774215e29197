"""The simulated world the real engine and driver run in: a model fleet behind the plugin
contract, a model apiserver with resourceVersions, a model health checker and a Lease.

Every rule here mirrors the contract in proto/fleetupgrade/plugin/v1/cluster.proto (request-id
idempotency, one operation per cluster → ABORTED, nothing-to-do → SUCCEEDED at once, the
PreflightUpgrade verdicts) and the sim plugin's refusal rules (plugins/sim/fleet.py `_check`:
one minor version at a time, no downgrade, node pools never ahead of the control plane). The
model keeps ground truth the product never sees (who took a cluster out, every evaluation a
check really returned), for tests/sim/invariants.py. Time is an integer count of seconds.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from orchestrator import api
from orchestrator.engine.conditions import parse_time
from orchestrator.engine.decide import ACTIVE, Call, Preflight, Upgrade, Verdict
from orchestrator.engine.observations import ClusterObs, OpKind, OpObs, OpState, PoolObs, Snapshot
from orchestrator.pipeline.driver import CallError, WriteConflict
from orchestrator.pipeline.lease import LeaseBelief, LeaseRecord, LeaseTiming, LeaseWrite
from plugins.sdk import versions

if TYPE_CHECKING:
    from tests.sim.adversary import Adversary
    from tests.sim.invariants import Monitor

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
#: The owner of operations, service-outs and outages the orchestrator did not cause.
ADVERSARY = "<adversary>"


def at(t: int) -> datetime:
    """The datetime of simulated second t."""
    return EPOCH + timedelta(seconds=t)


@lru_cache(maxsize=65536)
def seconds(stamp: str) -> int:
    """Simulated second of a metav1.Time / MicroTime string."""
    return int((parse_time(stamp) - EPOCH).total_seconds())


class Crash(Exception):
    """The orchestrator process dies here: the harness drops the replica's memory."""


class LostWrite(Exception):
    """A write whose answer never came back (it may or may not have been applied)."""


# -- the fleet -----------------------------------------------------------------------------


@dataclass
class MPool:
    name: str
    version: str
    ready: bool = True


@dataclass
class MCluster:
    id: str
    cp: str
    pools: dict[str, MPool]
    labels: dict[str, str]
    adv_down: bool = False
    down_reason: str = ""
    in_service: bool = True
    #: Who took it out of service: a run key, ADVERSARY, or None while in service.
    out_by: str | None = None
    op: str | None = None
    deleted: bool = False
    #: Simulated second of our last service-out call, and of the adversary's last service-in.
    last_so_call: int = -1
    adv_in_at: int = -1
    #: The observation, built once per change (any attribute set clears it; pool and
    #: operation changes call touch()).
    cache: ClusterObs | None = field(default=None, compare=False, repr=False)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name != "cache":
            object.__setattr__(self, "cache", None)

    def touch(self) -> None:
        self.cache = None


@dataclass
class MOp:
    id: str
    request_id: str
    owner: str
    replica: str
    kind: OpKind
    cluster_id: str
    pool: str
    target: str
    attempt: int
    state: OpState
    start: int
    end: int | None
    failure: tuple[str, str] | None = None
    #: False for a request with nothing to do (SUCCEEDED at once, changed nothing).
    effective: bool = True
    forgotten: bool = False
    #: Forgotten while in flight: the work died with the plugin's memory, no effect.
    abandoned: bool = False
    ended_at: int | None = None
    cache: OpObs | None = field(default=None, compare=False, repr=False)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name != "cache":
            object.__setattr__(self, "cache", None)

    def obs(self) -> OpObs:
        if self.cache is not None:
            return self.cache
        code, message = self.failure if self.failure and self.state == OpState.FAILED else ("", "")
        self.cache = OpObs(
            id=self.id,
            kind=self.kind,
            cluster_id=self.cluster_id,
            state=self.state,
            request_id=self.request_id,
            node_pool=self.pool,
            target_version=self.target,
            error_code=code,
            error_message=message,
        )
        return self.cache


class ModelFleet:
    """The provider's fleet: clusters, operations, the contract's rules, ground truth."""

    def __init__(self, clusters: Sequence[MCluster], offered: Sequence[str]) -> None:
        self.clusters: dict[str, MCluster] = {c.id: c for c in clusters}
        self.offered = set(offered)
        self.ops: dict[str, MOp] = {}
        self.by_rid: dict[str, str] = {}
        self.by_cluster: dict[str, list[str]] = {}
        self.now = 0
        self._seq = 0
        self.in_flight: set[str] = set()
        #: Clusters out of service (by anyone), kept for the never-stranded check.
        self.out_set: set[str] = set()
        #: Called right after an operation took effect (op, cluster) — for the floor check.
        self.on_effect: Callable[[MOp, MCluster], None] = lambda op, c: None
        #: Called when an operation ends (the watch event that wakes its run).
        self.on_end: Callable[[MOp], None] = lambda op: None
        #: Adversary hook: (duration or None to hang, failure) for a new operation.
        self.fate: Callable[[MOp], tuple[int | None, tuple[str, str] | None]] = lambda op: (
            10,
            None,
        )

    # -- observation -----------------------------------------------------------------------

    def cp_running(self, c: MCluster) -> bool:
        op = self.ops.get(c.op) if c.op else None
        return op is not None and op.kind is OpKind.CONTROL_PLANE and op.state == OpState.RUNNING

    def available(self, c: MCluster) -> bool:
        return not c.adv_down and not self.cp_running(c)

    def up(self, c: MCluster) -> bool:
        return not c.deleted and c.in_service and self.available(c)

    def obs(self, cid: str) -> ClusterObs | None:
        c = self.clusters.get(cid)
        if c is None or c.deleted:
            return None
        if c.cache is not None:
            return c.cache
        op = self.ops.get(c.op) if c.op else None
        reason = ""
        if c.adv_down:
            reason = c.down_reason or "unreachable"
        elif self.cp_running(c):
            reason = "control plane upgrading"
        c.cache = ClusterObs(
            id=c.id,
            control_plane_version=c.cp,
            node_pools=tuple(PoolObs(p.name, p.version, p.ready) for p in c.pools.values()),
            labels=dict(c.labels),
            available=self.available(c),
            unavailable_reason=reason,
            in_service=c.in_service,
            current_operation=op.obs() if op is not None else None,
        )
        return c.cache

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        clusters: dict[str, ClusterObs] = {}
        operations: dict[str, OpObs] = {}
        forgotten: set[str] = set()
        for cid in cluster_ids:
            o = self.obs(cid)
            if o is None:
                continue
            clusters[cid] = o
            for op_id in self.by_cluster.get(cid, ()):
                op = self.ops[op_id]
                if not op.forgotten:
                    operations[op.request_id] = op.obs()
                elif op.request_id not in self.by_rid:
                    # What orchestrator.adapters.provider learns from GetOperation → NOT_FOUND.
                    forgotten.add(op.request_id)
        return Snapshot(clusters, operations, frozenset(forgotten))

    def inventory(self) -> dict[str, ClusterObs]:
        out = {}
        for cid in sorted(self.clusters):
            o = self.obs(cid)
            if o is not None:
                out[cid] = o
        return out

    # -- the contract's rules ---------------------------------------------------------------

    def refusal(self, cid: str, version: str, pools: Mapping[str, str]) -> tuple[str, str] | None:
        """(reason code, message) when an upgrade to these versions will never be accepted."""
        c = self.clusters[cid]
        if version and versions.compare(version, c.cp) != 0:
            problem = self._cp_problem(c, version)
            if problem:
                return problem
        for name, target in pools.items():
            if versions.is_newer(target, version or c.cp):
                return (
                    "NODE_POOL_AHEAD",
                    f"cluster {cid}: node pool {name} cannot be newer than the control plane",
                )
        return None

    def _cp_problem(self, c: MCluster, version: str) -> tuple[str, str] | None:
        if versions.compare(version, c.cp) < 0:
            return (
                "DOWNGRADE",
                f"cluster {c.id}: control plane is at {c.cp}; downgrading it to {version} "
                "is not supported",
            )
        now, then = versions.parse(c.cp), versions.parse(version)
        if then.major != now.major or then.minor > now.minor + 1:
            return (
                "MINOR_SKIP",
                f"cluster {c.id}: control plane is at {c.cp}; upgrade one minor version at a "
                f"time (next: {now.major}.{now.minor + 1})",
            )
        if version not in self.offered:
            return ("VERSION_NOT_OFFERED", f"version {version} is not offered")
        return None

    def preflight(self, cid: str, version: str, pools: Mapping[str, str]) -> Preflight:
        c = self.clusters.get(cid)
        if c is None or c.deleted:
            raise CallError("NOT_FOUND", f"cluster {cid} not found", False)
        refused = self.refusal(cid, version, pools)
        if refused:
            return Preflight(Verdict.REFUSED_NEVER, at(self.now), refused[0], refused[1])
        if c.op is not None:
            return Preflight(
                Verdict.REFUSED_LATER,
                at(self.now),
                "BUSY",
                f"operation {c.op} is in flight",
                retry_after=10.0,
            )
        return Preflight(Verdict.ACCEPTED, at(self.now))

    def mutate(
        self,
        rid: str,
        owner: str,
        replica: str,
        kind: OpKind,
        cid: str,
        pool: str,
        target: str,
        attempt: int,
    ) -> MOp:
        """One mutating request by the contract's rules; raises CallError as the plugin would."""
        known = self.by_rid.get(rid)
        if known is not None:
            return self.ops[known]  # the same request again: the same operation
        c = self.clusters.get(cid)
        if c is None or c.deleted:
            raise CallError("NOT_FOUND", f"cluster {cid} not found", False)
        if c.op is not None:
            raise CallError("ABORTED", f"cluster {cid} runs operation {c.op}; one at a time", True)
        nothing = False
        if kind is OpKind.SERVICE_OUT:
            nothing = not c.in_service
        elif kind is OpKind.SERVICE_IN:
            nothing = c.in_service
        elif kind is OpKind.CONTROL_PLANE:
            if versions.compare(target, c.cp) == 0:
                nothing = True
            else:
                problem = self._cp_problem(c, target)
                if problem:
                    raise CallError("FAILED_PRECONDITION", problem[1], False)
        else:
            p = c.pools.get(pool)
            if p is None:
                raise CallError("NOT_FOUND", f"cluster {cid} has no node pool {pool!r}", False)
            if versions.is_newer(target, c.cp):
                raise CallError(
                    "FAILED_PRECONDITION",
                    f"cluster {cid}: node pool {pool} cannot be newer than the control plane",
                    False,
                )
            nothing = versions.compare(target, p.version) == 0
        self._seq += 1
        op = MOp(
            id=f"op-{self._seq}",
            request_id=rid,
            owner=owner,
            replica=replica,
            kind=kind,
            cluster_id=cid,
            pool=pool,
            target=target,
            attempt=attempt,
            state=OpState.SUCCEEDED if nothing else OpState.PENDING,
            start=self.now,
            end=self.now,
            effective=not nothing,
        )
        self.ops[op.id] = op
        self.by_rid[rid] = op.id
        self.by_cluster.setdefault(cid, []).append(op.id)
        if nothing:
            op.ended_at = self.now
            return op
        duration, failure = self.fate(op)
        op.end = None if duration is None else self.now + max(1, duration)
        op.failure = failure
        c.op = op.id
        self.in_flight.add(op.id)
        return op

    # -- time ------------------------------------------------------------------------------

    def next_event(self) -> int | None:
        times = []
        for op_id in self.in_flight:
            op = self.ops[op_id]
            if op.state == OpState.PENDING:
                times.append(op.start + 1)
            elif op.end is not None:
                times.append(op.end)
        return min(times) if times else None

    def tick(self, now: int) -> bool:
        """Advance every operation to `now`, in order of their end; True if any moved."""
        self.now = now
        moved = False
        for op_id in sorted(self.in_flight, key=lambda i: (self.ops[i].end or 0, i)):
            op = self.ops[op_id]
            c = self.clusters[op.cluster_id]
            if op.state == OpState.PENDING and now >= op.start + 1:
                op.state = OpState.RUNNING
                moved = True
                c.touch()
                if op.kind is OpKind.NODE_POOL and op.pool in c.pools:
                    c.pools[op.pool].ready = False
            if op.state == OpState.RUNNING and op.end is not None and now >= op.end:
                moved = True
                self._finish(op, c)
        return moved

    def _finish(self, op: MOp, c: MCluster) -> None:
        try:
            self._end(op, c)
        finally:
            self.on_end(op)  # WatchOperations sends the operation as it ended

    def _end(self, op: MOp, c: MCluster) -> None:
        c.touch()
        self.in_flight.discard(op.id)
        op.ended_at = self.now
        if c.op == op.id:
            c.op = None
        if op.kind is OpKind.NODE_POOL and op.pool in c.pools:
            c.pools[op.pool].ready = True
        if op.failure is not None:
            op.state = OpState.FAILED
            return
        op.state = OpState.SUCCEEDED
        if op.kind is OpKind.SERVICE_OUT:
            if c.in_service:
                c.in_service = False
                c.out_by = op.owner
                self.out_set.add(c.id)
        elif op.kind is OpKind.SERVICE_IN:
            c.in_service = True
            c.out_by = None
            self.out_set.discard(c.id)
            if op.owner == ADVERSARY:
                c.adv_in_at = self.now
        elif op.kind is OpKind.CONTROL_PLANE:
            c.cp = op.target
        elif op.pool in c.pools:
            c.pools[op.pool].version = op.target
        self.on_effect(op, c)

    def forget(self, op_id: str) -> None:
        """The plugin loses the record of an operation (a restart without durable state)."""
        op = self.ops[op_id]
        if op.forgotten:
            return
        op.forgotten = True
        if self.by_rid.get(op.request_id) == op.id:
            del self.by_rid[op.request_id]
        if op_id in self.in_flight:
            self.in_flight.discard(op_id)
            op.abandoned = True
            op.ended_at = self.now
            op.state = OpState.FAILED
            c = self.clusters[op.cluster_id]
            c.touch()
            if c.op == op_id:
                c.op = None
            if op.kind is OpKind.NODE_POOL and op.pool in c.pools:
                c.pools[op.pool].ready = True

    def foreign_op(self, cid: str, kind: OpKind, target: str, pool: str, duration: int) -> MOp:
        """An operation by someone else (a release channel, a person) on a free cluster."""
        self._seq += 1
        c = self.clusters[cid]
        op = MOp(
            id=f"op-{self._seq}",
            request_id=f"foreign-{self._seq}",
            owner=ADVERSARY,
            replica="",
            kind=kind,
            cluster_id=cid,
            pool=pool,
            target=target,
            attempt=0,
            state=OpState.PENDING,
            start=self.now,
            end=self.now + duration,
        )
        self.ops[op.id] = op
        self.by_rid[op.request_id] = op.id
        self.by_cluster.setdefault(cid, []).append(op.id)
        c.op = op.id
        self.in_flight.add(op.id)
        return op


# -- the plugin, as the driver sees it ----------------------------------------------------


class ModelProvider:
    """`orchestrator.pipeline.driver.Provider` over the model fleet, with the adversary's RPC
    faults."""

    def __init__(
        self,
        fleet: ModelFleet,
        adversary: Adversary,
        monitor: Monitor,
        replica: str,
        supports_preflight: bool,
    ) -> None:
        self.fleet = fleet
        self.adversary = adversary
        self.monitor = monitor
        self.replica = replica
        self._supports_preflight = supports_preflight
        #: The run whose reconcile is in progress (set by the harness before each step).
        self.run = ""
        #: Request id → the last terminal state this replica saw: like the product's
        #: OperationTracker, which keeps what WatchOperations showed and never asks the plugin
        #: again about an operation it saw end (orchestrator.adapters.provider.GrpcProvider.learn),
        #: so a plugin forgetting an ended operation matters only to a replica that restarted.
        self.ended: dict[str, OpObs] = {}
        #: Whether this replica follows the plugin's WatchOperations (it reconciled since it
        #: last started): then every operation's end reaches `ended` (World._watch_event).
        self.following = False

    @property
    def supports_preflight(self) -> bool:
        return self._supports_preflight

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        self.following = True
        self.adversary.rpc("ListClusters", "")
        self.monitor.inventory_read("")
        snap = self.fleet.snapshot(cluster_ids)
        operations = dict(snap.operations)
        for rid, op in operations.items():
            if op.state.terminal:
                self.ended[rid] = op
        forgotten = set(snap.forgotten)
        for rid in snap.forgotten:
            known = self.ended.get(rid)
            if known is not None:
                operations[rid] = known
                forgotten.discard(rid)
        return Snapshot(snap.clusters, operations, frozenset(forgotten))

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        self.monitor.on_preflight(self.replica, self.run, cluster_id)
        self.adversary.rpc("PreflightUpgrade", cluster_id)
        return self.fleet.preflight(cluster_id, version, pools)

    def call(self, call: Call) -> OpObs:
        attempt = self.monitor.on_call(self.replica, self.run, call)
        self.adversary.before_call(call)
        c = self.fleet.clusters.get(call.cluster_id)
        if c is not None and call.kind is OpKind.SERVICE_OUT:
            c.last_so_call = self.fleet.now
        target = call.version
        if call.kind in (OpKind.SERVICE_OUT, OpKind.SERVICE_IN):
            target = self.monitor.spec_version(self.run, call.upgrade)
        op = self.fleet.mutate(
            call.request_id,
            self.run,
            self.replica,
            call.kind,
            call.cluster_id,
            call.node_pool,
            target,
            attempt,
        )
        self.monitor.on_op(self.run, call.upgrade, call, op, attempt)
        self.adversary.after_call(call, op)
        seen = op.obs()
        if seen.state.terminal:  # the product tracks a call's answer at once
            self.ended[call.request_id] = seen
        return seen


# -- health ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evaluation:
    """One evaluation a check really returned (ground truth for the gate invariant)."""

    run: str
    stage: str
    clusters: tuple[str, ...]
    t: int
    passed: bool
    #: Who asked: the replica and its incarnation (a crash starts a new one).
    replica: str = ""
    epoch: int = 0
    #: "cluster" (one cluster's gate) or "stage" (the gate at a stage's end), as the driver
    #: asked: a one-member stage evaluates the same cluster in both.
    scope: str = "cluster"


class ModelChecker:
    """`orchestrator.pipeline.driver.Checker` for one run; results come from the adversary."""

    def __init__(
        self,
        fleet: ModelFleet,
        adversary: Adversary,
        sink: Callable[[Evaluation], None],
        run: str,
        replica: str = "",
        epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        self.fleet = fleet
        self.adversary = adversary
        self.sink = sink
        self.run = run
        self.replica = replica
        self.epoch = epoch
        #: Set by the sim's driver while it evaluates stage checks (see world.SimDriver).
        self.scope = "cluster"

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        ids = tuple(c.id for c in clusters)
        results = []
        for check in checks.checks:
            ok = self.adversary.check_passes(self.run, stage, ids, check.name)
            results.append(
                api.CheckResult(
                    name=check.name,
                    passed=ok,
                    value=1.0 if ok else 0.0,
                    message=None if ok else f"{check.name} unhealthy",
                )
            )
        self.sink(
            Evaluation(
                self.run,
                stage,
                ids,
                self.fleet.now,
                all(r.passed for r in results),
                self.replica,
                self.epoch(),
                self.scope,
            )
        )
        return results


# -- leadership --------------------------------------------------------------------------


#: The product's defaults (orchestrator.adapters.leader.LeaderElector): 15 s lease, 10 s renew
#: deadline, 2 s retry period.
LEASE_TIMING = LeaseTiming()


@dataclass
class ReplicaClock:
    """One replica's clocks: monotonic = offset + rate * true time; wall = true time + skew."""

    offset: float
    rate: float
    skew: float

    def mono(self, t: float) -> float:
        return self.offset + self.rate * t

    def wall(self, t: float) -> datetime:
        return EPOCH + timedelta(seconds=t + self.skew, microseconds=1)


class Elector:
    """One replica's LeaderElector loop over the model Lease: the product's LeaseBelief on the
    replica's own clocks, one attempt every retry period of its own monotonic clock; the read
    answers at once, the write lands up to 0.5 s later (another write in between: a conflict)."""

    def __init__(self, name: str, clock: ReplicaClock, first: float) -> None:
        self.name, self.clock = name, clock
        self.belief = LeaseBelief(name, LEASE_TIMING)
        self.next_try = first  # true time of the next attempt
        #: Its Lease requests fail (time out) until then; its process stalls until then.
        self.cut_off_until = -1.0
        self.stalled_until = -1.0
        #: An attempt's write in flight: (lands at, write, monotonic time the attempt began).
        self.in_flight: tuple[float, LeaseWrite, float] | None = None

    def restart(self) -> None:
        """A new process: a new belief (it waits a whole duration for another's Lease)."""
        self.belief = LeaseBelief(self.name, LEASE_TIMING)
        self.in_flight = None

    def next_event(self) -> float:
        if self.in_flight is not None:
            return self.in_flight[0]
        return max(self.next_try, self.stalled_until)


class Lease:
    """The model Lease object (a record with a resourceVersion; a stale write conflicts) and
    every replica's elector around it. Each replica has its own monotonic clock (offset and
    drift) and wall clock (skew) drawn from the seed; the adversary cuts a replica's Lease
    requests off for a while (it stops renewing) or stalls its whole process in the middle of
    a pass. `holder` is the record's holder: the truth invariant 8 is checked against."""

    def __init__(self, seed: int, names: Sequence[str]) -> None:
        rng = random.Random(seed * 104729 + 3)
        self.rng = rng
        self.record: LeaseRecord | None = None
        self.rv = 0
        self.now = 0.0  # true time the Lease's history has reached
        self.electors = {
            name: Elector(
                name,
                ReplicaClock(
                    rng.uniform(0, 1e6),
                    rng.uniform(0.99, 1.01),
                    rng.choice((-20.0, -8.0, 0.0, 8.0, 20.0)) + rng.uniform(-1, 1),
                ),
                0.0 if i == 0 else rng.uniform(0.1, LEASE_TIMING.retry_period),
            )
            for i, name in enumerate(names)
        }
        #: A stall armed by the adversary: (replica, fence checks before it, seconds).
        self.stall: tuple[str, int, float] | None = None
        self.on_flip: Callable[[str], None] = lambda holder: None
        self.on_lost: Callable[[str], None] = lambda name: None
        first = self.electors[names[0]]  # r0 starts first and creates the Lease at once
        self._attempt(first)
        self._land(first)

    @property
    def holder(self) -> str:
        return "" if self.record is None else self.record.holder or ""

    def describe(self) -> str:
        return ", ".join(
            f"{e.name}: skew {e.clock.skew:+.1f} s, drift {e.clock.rate - 1:+.3%}"
            for e in self.electors.values()
        )

    # -- time ------------------------------------------------------------------------------

    def advance(self, t: float, frozen: str = "") -> None:
        """Every elector's attempts and landing writes up to true time t, in order; `frozen`
        is a replica whose process is stalled (it attempts nothing meanwhile)."""
        electors = list(self.electors.values())
        while True:
            first: Elector | None = None
            when = t
            for e in electors:
                if e.in_flight is not None:
                    at_ = e.in_flight[0]
                elif e.name == frozen:
                    continue
                else:
                    at_ = max(e.next_try, e.stalled_until)
                if at_ <= when and (first is None or at_ < when):
                    first, when = e, at_
            if first is None:
                break
            self.now = max(self.now, when)
            if first.in_flight is not None:
                self._land(first)
            else:
                self._attempt(first)
        self.now = max(self.now, t)

    def _attempt(self, e: Elector) -> None:
        t = e.next_event()
        e.next_try = t + LEASE_TIMING.retry_period / e.clock.rate
        if t < e.cut_off_until:
            return  # the request timed out
        mono = e.clock.mono(t)
        e.belief.observe(self.record, mono)
        if e.belief.lost:
            self.on_lost(e.name)  # the product exits; its replica restarts
            return
        write = e.belief.attempt(mono, e.clock.wall(t))
        if write is not None:
            e.in_flight = (t + self.rng.uniform(0.0, 0.5), write, mono)

    def _land(self, e: Elector) -> None:
        assert e.in_flight is not None
        _, write, started = e.in_flight
        e.in_flight = None
        current = None if self.record is None else self.record.resource_version
        if write.resource_version != current:
            return  # 409: the attempt fails
        before = self.holder
        self.rv += 1
        self.record = LeaseRecord(
            write.holder, write.renew_time, write.duration_seconds, write.transitions, str(self.rv)
        )
        e.belief.renewed(started)
        if write.holder != before:
            self.on_flip(write.holder)

    # -- the fence -------------------------------------------------------------------------

    def held(self, me: str) -> bool:
        """`LeaderElector.held()` of replica me, now (a stall armed for me may happen first)."""
        if self.stall is not None and self.stall[0] == me:
            name, checks, seconds = self.stall
            if checks > 0:
                self.stall = (name, checks - 1, seconds)
            else:
                self.stall = None
                self.electors[me].stalled_until = self.now + seconds
                self.advance(self.now + seconds, frozen=me)
        held = [e.name for e in self.electors.values() if e.belief.held(e.clock.mono(self.now))]
        if len(held) > 1 or (held and held[0] != self.holder):
            from tests.sim.invariants import Violation  # here: a cycle at module level

            raise Violation(
                "8 fenced", f"{held} believe they hold the Lease, which {self.holder!r} holds"
            )
        return me in held

    # -- the adversary ---------------------------------------------------------------------

    def cut_off(self, name: str, seconds: float) -> None:
        self.electors[name].cut_off_until = self.now + seconds

    def arm_stall(self, name: str, checks: int, seconds: float) -> None:
        self.stall = (name, checks, seconds)

    def quiet(self) -> None:
        self.stall = None
        for e in self.electors.values():
            e.cut_off_until = -1.0


class ModelFence:
    """`orchestrator.pipeline.driver.Fence` of one replica: its LeaderElector's held()."""

    def __init__(self, lease: Lease, me: str) -> None:
        self.lease = lease
        self.me = me

    def held(self) -> bool:
        return self.lease.held(self.me)


# -- the apiserver -----------------------------------------------------------------------


@dataclass
class RunObj:
    """An UpdateRun as stored."""

    key: str
    namespace: str
    name: str
    uid: str
    spec: api.UpdateRunSpec
    status: api.UpdateRunStatus
    rv: int
    #: The ClusterVersion (key) that created it, and the spec it is pinned from.
    cv: str = ""
    source: api.ClusterVersionSpec | None = None
    retry: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()
    #: The skip-stages annotation (level-triggered, never consumed).
    skip_stages: frozenset[str] = frozenset()
    #: The spec changed since the last reconcile (the product's generation ahead of
    #: observedGeneration): a finished run is looked at once more (resume, retry, skip).
    edited: bool = False
    initialized: bool = False
    stage_names: list[str] = field(default_factory=list)
    #: metadata.deletionTimestamp is set: its finalizer holds it until its clusters are back.
    deleting: bool = False
    #: metadata.annotations other than the three kept as sets above: requested-by, reason and
    #: the admission webhook's stamp (tests/sim/people.py).
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class UpObj:
    """A ClusterUpgrade as stored."""

    key: str
    run: str
    upgrade: Upgrade
    rv: int


@dataclass
class CvObj:
    """A ClusterVersion as stored."""

    key: str
    namespace: str
    name: str
    spec: api.ClusterVersionSpec
    generation: int = 1
    #: metadata.deletionTimestamp is set: it goes once its runs have gone.
    deleting: bool = False
    #: metadata.annotations: requested-by, reason and the admission webhook's stamp.
    annotations: dict[str, str] = field(default_factory=dict)


class ModelApiServer:
    """Objects with resourceVersions; writes are conditional (409 → WriteConflict)."""

    def __init__(self) -> None:
        self.rv = 0
        self.runs: dict[str, RunObj] = {}
        self.upgrades: dict[str, UpObj] = {}
        self.by_run: dict[str, list[str]] = {}
        self.cvs: dict[str, CvObj] = {}
        #: cluster id → run keys whose ClusterUpgrade of it is in an active phase.
        self.active: dict[str, set[str]] = {}
        #: Called after every applied ClusterUpgrade write (key, old status, new status).
        self.on_write: Callable[[UpObj, api.ClusterUpgradeStatus], None] = lambda o, s: None
        #: Called after every applied UpdateRun status write (run key, new status).
        self.on_run_write: Callable[[str, api.UpdateRunStatus], None] = lambda k, s: None
        #: Watch events of UpdateRuns, in the order the apiserver applied them: (sequence, key,
        #: a copy of the run as written, or None once it is gone). The watch caches feed on it.
        self.events = 0
        self.on_run_event: Callable[[int, str, RunObj | None], None] = lambda n, k, o: None

    def bump(self) -> int:
        self.rv += 1
        return self.rv

    def create_run(self, obj: RunObj) -> None:
        obj.rv = self.bump()
        self.runs[obj.key] = obj
        self.by_run.setdefault(obj.key, [])
        self.changed(obj.key)

    def changed(self, key: str) -> None:
        """A run was written (created, edited, its status or metadata): its watch event."""
        self.events += 1
        obj = self.runs.get(key)
        self.on_run_event(self.events, key, copy.copy(obj) if obj is not None else None)

    def create_upgrades(self, run: RunObj, upgrades: Sequence[Upgrade]) -> None:
        for u in upgrades:
            key = f"{run.namespace}/{u.name}"
            if key in self.upgrades:
                continue  # deterministic names: a second create is a no-op (AlreadyExists)
            self.upgrades[key] = UpObj(key, run.key, u, self.bump())
            self.by_run[run.key].append(key)

    def collect(self, run: str) -> None:
        """The run's last finalizer is removed: the run and (the garbage collector) its
        ClusterUpgrades are gone."""
        for key in self.by_run.pop(run, []):
            obj = self.upgrades.pop(key)
            holders = self.active.get(obj.upgrade.cluster_id)
            if holders is not None:
                holders.discard(run)
        del self.runs[run]
        self.changed(run)

    def upgrades_of(self, run: str) -> list[UpObj]:
        return [self.upgrades[k] for k in self.by_run.get(run, ())]

    def write_upgrade(self, key: str, rv: int, status: api.ClusterUpgradeStatus) -> int:
        obj = self.upgrades[key]
        if obj.rv != rv:
            raise WriteConflict(f"{key}: resourceVersion {rv} is stale (now {obj.rv})")
        old = obj.upgrade.status
        obj.upgrade = Upgrade(obj.upgrade.name, obj.upgrade.spec, status)
        obj.rv = self.bump()
        cid = obj.upgrade.cluster_id
        holders = self.active.setdefault(cid, set())
        if status.phase in ACTIVE:
            holders.add(obj.run)
        else:
            holders.discard(obj.run)
        self.on_write(obj, old)
        return obj.rv

    def write_run_status(self, key: str, rv: int, status: api.UpdateRunStatus) -> int:
        obj = self.runs[key]
        if obj.rv != rv:
            raise WriteConflict(f"{key}: resourceVersion {rv} is stale (now {obj.rv})")
        obj.status = status
        obj.rv = self.bump()
        self.on_run_write(key, status)
        self.changed(key)
        return obj.rv

    def update_run(self, key: str, **changes: Any) -> None:
        """A spec/metadata edit by someone (a person, the ClusterVersion controller)."""
        obj = self.runs[key]
        for k, v in changes.items():
            setattr(obj, k, v)
        if "spec" in changes:
            obj.edited = True
        obj.rv = self.bump()
        self.changed(key)


class RunCache:
    """One replica's UpdateRun watch cache (orchestrator.adapters.cache.ObjectCache): what the
    replica's controllers know of runs other than the one they GET. Fed by the watch, each
    event some seconds after its write and in the apiserver's order (an event never overtakes
    an earlier one); the replica's own writes go in at once (write-through) and an older event
    never replaces a newer entry. A restarted replica lists afresh."""

    def __init__(self) -> None:
        #: run key → (event sequence, the run as of that event).
        self.entries: dict[str, tuple[int, RunObj]] = {}
        #: Events on their way: (delivery second, sequence, key, run or None: gone).
        self.pending: list[tuple[int, int, str, RunObj | None]] = []

    def get(self, key: str) -> RunObj | None:
        entry = self.entries.get(key)
        return entry[1] if entry is not None else None

    def runs(self) -> list[RunObj]:
        return [obj for _, obj in self.entries.values()]

    def put(self, seq: int, key: str, obj: RunObj | None) -> None:
        """An event (or a write's answer): applied unless the entry is newer already."""
        entry = self.entries.get(key)
        if entry is not None and entry[0] >= seq:
            return
        if obj is None:
            self.entries.pop(key, None)
        else:
            self.entries[key] = (seq, obj)

    def send(self, due: int, seq: int, key: str, obj: RunObj | None) -> None:
        """Queue an event; it arrives at due, or with the one before it if that is later."""
        if self.pending:
            due = max(due, self.pending[-1][0])
        self.pending.append((due, seq, key, obj))

    def deliver(self, now: int) -> list[str]:
        """The events due by now, applied in order; the keys they named."""
        keys = []
        while self.pending and self.pending[0][0] <= now:
            _, seq, key, obj = self.pending.pop(0)
            self.put(seq, key, obj)
            keys.append(key)
        return keys

    def next_delivery(self) -> int | None:
        return self.pending[0][0] if self.pending else None

    def relist(self, server: ModelApiServer) -> None:
        """A fresh LIST (a restart): every run as it is now, nothing pending."""
        self.pending.clear()
        self.entries = {k: (server.events, copy.copy(o)) for k, o in server.runs.items()}


class StoreClient:
    """One replica's client: remembers the resourceVersion it read each object at."""

    def __init__(self, server: ModelApiServer, adversary: Adversary) -> None:
        self.server = server
        self.adversary = adversary
        self.rvs: dict[str, int] = {}

    def read_upgrades(self, run: str) -> dict[str, Upgrade]:
        out = {}
        for obj in self.server.upgrades_of(run):
            self.rvs[obj.key] = obj.rv
            out[obj.upgrade.name] = obj.upgrade
        return out

    def read_run(self, key: str) -> RunObj:
        obj = self.server.runs[key]
        self.rvs[key] = obj.rv
        return obj

    def write_run_status(self, key: str, status: api.UpdateRunStatus) -> None:
        self.rvs[key] = self.server.write_run_status(key, self.rvs.get(key, -1), status)

    def view(self, namespace: str) -> NamespaceStore:
        return NamespaceStore(self, namespace)


class NamespaceStore:
    """`orchestrator.pipeline.driver.UpgradeStore` over one namespace, with lost and conflicting
    writes."""

    def __init__(self, client: StoreClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        key = f"{self.namespace}/{upgrade.name}"
        server = self.client.server
        fault = self.client.adversary.write_fault(key)
        if fault == "conflict":
            server.upgrades[key].rv = server.bump()  # another writer got there first
        elif fault == "lost-before":
            raise LostWrite(f"{key}: no answer (not applied)")
        elif fault == "crash-before":
            raise Crash(f"crash before writing {key}")
        rv = server.write_upgrade(key, self.client.rvs.get(key, -1), status)
        self.client.rvs[key] = rv
        if fault == "lost-after":
            raise LostWrite(f"{key}: no answer (applied)")
        if fault == "crash-after":
            raise Crash(f"crash after writing {key}")
