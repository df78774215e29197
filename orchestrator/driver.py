"""One UpdateRun reconcile as a pipeline: observe → decide (pure) → record intents → act → record.

The driver knows the world only through four small protocols, so the product (kube + gRPC
adapters in orchestrator.runs) and the adversarial simulation (tests/sim) run this same code:

- `UpgradeStore`: conditional writes of ClusterUpgrade status (resourceVersion; a stale write
  raises `WriteConflict` and nothing after it happens in this pass).
- `Provider`: the plugin (inventory + operations snapshot, preflight, the four mutations).
- `Checker`: health-check evaluation for a set of clusters.
- `Fence`: whether this replica still holds the Lease; checked before every plugin call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol, TypeVar

from orchestrator import api
from orchestrator.conditions import parse_time
from orchestrator.engine import (
    ACTIVE,
    Call,
    Decision,
    Floor,
    Preflight,
    RunInput,
    Upgrade,
    call_failed,
    checks_for,
    decide,
    with_status,
)
from orchestrator.fleet import ClusterObs, OpObs, PoolObs, Snapshot
from orchestrator.health import due_in, record

__all__ = [
    "CallError",
    "Checker",
    "Fence",
    "Provider",
    "RunDriver",
    "StepResult",
    "UpgradeStore",
    "WriteConflict",
    "holdings",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class WriteConflict(Exception):
    """The object changed since it was read (HTTP 409): re-read, decide again."""


class CallError(Exception):
    """A plugin call failed: the gRPC code name, whether retrying can help, and the words."""

    def __init__(self, code: str, message: str, retryable: bool, retry_after: float = 0.0):
        super().__init__(f"{code}: {message}")
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
        """Ask whether the upgrade would be accepted now; raise CallError on failure."""

    def call(self, call: Call) -> OpObs:
        """Make one mutating call; raise CallError on failure."""


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


@dataclass
class StepResult:
    """What a reconcile of one run did, for the run's status write."""

    decision: Decision
    calls_made: int = 0
    conflicts: int = 0
    fenced: bool = False
    requeue_after: float | None = None


@dataclass
class RunDriver:
    """Runs one reconcile of one run against the protocols."""

    provider: Provider
    store: UpgradeStore
    checker: Checker
    fence: Fence
    #: Preflight answers kept between passes (cluster id → answer), per driver.
    preflight_cache: dict[str, Preflight] = field(default_factory=dict)
    #: Writes and calls made at once (1: in order, as the simulation replays them).
    parallelism: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Invariant 3: ClusterUpgrades whose failing evaluation could not be recorded (the write
    #: conflicted or got no answer); their next evaluation counts passes from zero. Keep it
    #: between passes like preflight_cache (the controller owns it).
    unrecorded_failures: set[str] = field(default_factory=set)
    #: The same for stage-level checks, whose health the run's status write records: (run,
    #: stage) → time of a failing evaluation; until the stored health shows it (or later),
    #: the next evaluation counts passes from zero.
    stage_failures: dict[tuple[str, str], datetime] = field(default_factory=dict)

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
    ) -> StepResult:
        """Observe, decide, persist intents, then call; returns the decision taken.

        floors: the other live runs on this provider sharing clusters with this one; their
        members are observed too, and held_by must name their holders.
        """
        ids = [u.cluster_id for u in upgrades.values()]
        own = set(ids)
        ids += sorted({cid for f in floors for cid in f.members} - own)
        snapshot = self.provider.snapshot(ids)
        upgrades, health_changed = self._evaluate_clusters(spec, upgrades, snapshot, now)
        stages = self._evaluate_stages(key, spec, upgrades, stages, snapshot, now)
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
            floors=floors,
        )
        decision = decide(inp)
        if decision.preflight_needed and self.fence.held():
            for cid in decision.preflight_needed:
                u = next(x for x in upgrades.values() if x.cluster_id == cid)
                pools = {p.name: u.spec.pool_target(p.name) for p in self._pools(snapshot, cid)}
                try:
                    self.preflight_cache[cid] = self.provider.preflight(cid, u.spec.version, pools)
                except CallError as err:
                    log.info("preflight of %s failed: %s", cid, err)
            decision = decide(inp)
        result = StepResult(decision, requeue_after=decision.requeue_after)
        # Record intents (and health progress) before any call: a crash after this write
        # resumes with the same request ids; a crash before it never called.
        to_write = dict(health_changed)
        to_write.update(decision.changed)
        written = self._write_all(upgrades, to_write, result)
        self.unrecorded_failures -= written & health_changed.keys()
        calls = [
            c
            for c in decision.calls
            # A call whose intent is not on record is not made.
            if c.upgrade in written or (c.upgrade not in decision.changed and not result.conflicts)
        ]

        def act(call: Call) -> None:
            if not self.fence.held():
                result.fenced = True
                return
            u = upgrades[call.upgrade]
            status = decision.changed.get(call.upgrade, u.status)
            try:
                self.provider.call(call)
                with self._lock:
                    result.calls_made += 1
            except CallError as err:
                new, wait = call_failed(status, call, err.code, err.retryable, err.message, now)
                if err.retry_after:
                    wait = err.retry_after
                conflicted = False
                try:
                    self.store.write_upgrade_status(with_status(u, status), new)
                except WriteConflict:
                    conflicted = True
                with self._lock:
                    result.conflicts += conflicted
                    result.requeue_after = _min(
                        result.requeue_after, wait if wait is not None else 0.0
                    )

        self._each(act, calls)
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

    def _write_all(
        self,
        upgrades: Mapping[str, Upgrade],
        to_write: Mapping[str, api.ClusterUpgradeStatus],
        result: StepResult,
    ) -> set[str]:
        """Write every changed status; the names whose write took effect."""
        written: set[str] = set()

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
                written.add(name)

        self._each(write, list(to_write))
        return written

    def _each(self, fn: Callable[[T], None], items: Sequence[T]) -> None:
        """fn over items: in order, or on `parallelism` threads (the product's API latency)."""
        if self.parallelism <= 1 or len(items) <= 1:
            for item in items:
                fn(item)
            return
        with ThreadPoolExecutor(max_workers=min(self.parallelism, len(items))) as pool:
            for _ in pool.map(fn, items):
                pass

    @staticmethod
    def _pools(snapshot: Snapshot, cid: str) -> Sequence[PoolObs]:
        obs = snapshot.clusters.get(cid)
        return obs.node_pools if obs is not None else ()

    def _evaluate_clusters(
        self,
        spec: api.UpdateRunSpec,
        upgrades: Mapping[str, Upgrade],
        snapshot: Snapshot,
        now: datetime,
    ) -> tuple[dict[str, Upgrade], dict[str, api.ClusterUpgradeStatus]]:
        """Run the checks that are due for clusters in Verifying; health lives on the upgrade."""
        out = dict(upgrades)
        changed: dict[str, api.ClusterUpgradeStatus] = {}
        for name, u in upgrades.items():
            st = u.status
            checks = checks_for(spec, u.spec.stage)
            obs = snapshot.clusters.get(u.cluster_id)
            if (
                st.phase != api.UpgradePhase.VERIFYING
                or st.health is None
                or checks is None
                or obs is None
                or not obs.available
                or due_in(st.health, checks, now) > 0
            ):
                continue
            results = self.checker.evaluate(checks, [obs], u.spec.stage)
            base = st.health
            if name in self.unrecorded_failures:
                base = base.model_copy(update={"passes": 0})
            if not all(r.passed for r in results):
                self.unrecorded_failures.add(name)  # until the write below takes effect
            new = st.model_copy(update={"health": record(base, results, now)})
            out[name] = with_status(u, new)
            changed[name] = new
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


_FINAL = frozenset({api.RunPhase.SUCCEEDED, api.RunPhase.FAILED, api.RunPhase.STOPPED})


def _min(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def holdings(upgrades: Sequence[tuple[str, Upgrade]]) -> dict[str, str]:
    """cluster id → holder run key, over (run key, upgrade) pairs in active phases."""
    return {u.cluster_id: run for run, u in upgrades if u.status.phase in ACTIVE}
