"""Leader election under clock skew and drift: replicas with their own monotonic and wall clocks
share one Lease (an in-memory apiserver with resourceVersion conflicts); at every step at most
one replica's held() is true, and a leader that keeps renewing is never deposed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from orchestrator.adapters.kube import Conflict, KubeError
from orchestrator.adapters.leader import LeaderElector
from orchestrator.pipeline.lease import LeaseBelief, LeaseRecord, LeaseTiming

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
STEP = 0.05  # seconds of true time per step of the schedule


@dataclass
class MemoryLeases:
    """The Lease calls of KubeClient over one in-memory object; writes carry resourceVersion."""

    record: LeaseRecord | None = None
    rv: int = 0
    #: Set by a test: every request fails (the replica is cut off from the apiserver).
    cut_off: set[str] = field(default_factory=set)
    caller: str = ""

    def get_lease(self, namespace: str, name: str, timeout: float = 0) -> LeaseRecord | None:
        self._reachable()
        return self.record

    def write_lease(
        self,
        namespace: str,
        name: str,
        holder: str,
        duration: int,
        transitions: int,
        acquire_time: datetime,
        renew_time: datetime,
        resource_version: str | None,
        timeout: float = 0,
    ) -> None:
        self._reachable()
        current = None if self.record is None else self.record.resource_version
        if resource_version != current:
            raise Conflict(409, f"stale resourceVersion {resource_version} (now {current})")
        self.rv += 1
        self.record = LeaseRecord(holder, renew_time, duration, transitions, str(self.rv))

    def _reachable(self) -> None:
        if self.caller in self.cut_off:
            raise KubeError(503, "unreachable")


class Replica:
    """One process: a LeaderElector on its own clocks, attempting every retry_period."""

    def __init__(
        self,
        leases: MemoryLeases,
        identity: str,
        skew: float,
        mono_offset: float,
        rate: float,
        timing: LeaseTiming,
    ) -> None:
        self.leases, self.identity = leases, identity
        self.skew, self.mono_offset, self.rate = skew, mono_offset, rate
        self.t = 0.0  # true time, set by the schedule
        kube: Any = _As(leases, identity)
        self.elector = LeaderElector(
            kube,
            "ns",
            "lock",
            identity,
            lease_seconds=timing.lease_seconds,
            renew_deadline=timing.renew_deadline,
            retry_period=timing.retry_period,
            clock=lambda: T0 + timedelta(seconds=self.t + self.skew),
            monotonic=lambda: self.mono_offset + self.rate * self.t,
        )
        self.next_try = 0.0  # own monotonic clock
        self.paused = False

    def tick(self, t: float) -> None:
        self.t = t
        mono = self.elector.monotonic()
        if not self.paused and mono >= self.next_try:
            self.elector.try_acquire_or_renew()
            self.next_try = mono + self.elector.retry_period


class _As:
    """The shared MemoryLeases seen by one caller (so a test can cut that caller off)."""

    def __init__(self, leases: MemoryLeases, caller: str) -> None:
        self.leases, self.caller = leases, caller

    def __getattr__(self, name: str) -> Callable[..., Any]:
        self.leases.caller = self.caller
        attr: Callable[..., Any] = getattr(self.leases, name)
        return attr


def run(
    replicas: list[Replica],
    until: float,
    on_step: Callable[[float], None] = lambda t: None,
) -> list[tuple[float, str]]:
    """Step true time to `until`; at every step at most one held(). Returns the leader changes."""
    changes: list[tuple[float, str]] = []
    leader = ""
    steps = int(until / STEP)
    for i in range(steps + 1):
        t = i * STEP
        on_step(t)
        for rep in replicas:
            rep.tick(t)
        holding = [rep.identity for rep in replicas if rep.elector.held()]
        assert len(holding) <= 1, f"t={t:.2f}: {holding} all believe they hold the Lease"
        now = holding[0] if holding else ""
        if now != leader:
            changes.append((round(t, 2), now))
            leader = now
    return changes


TIMING = LeaseTiming(lease_seconds=15, renew_deadline=10.0, retry_period=2.0)


@pytest.mark.parametrize("skew", [8.0, 20.0, -20.0, 3600.0])
def test_skewed_standby_never_deposes_a_renewing_leader(skew: float) -> None:
    leases = MemoryLeases()
    a = Replica(leases, "a", 0.0, 1_000.0, 1.0, TIMING)
    b = Replica(leases, "b", skew, 77.0, 1.0, TIMING)
    a.tick(0.0)
    assert a.elector.held()
    b.next_try = b.elector.monotonic() + 0.7  # b starts out of phase with a
    changes = run([a, b], 120.0)
    assert changes == [(0.0, "a")], f"the renewing leader a was deposed: {changes}"
    assert leases.record is not None and leases.record.holder == "a"
    assert leases.record.transitions == 0


@pytest.mark.parametrize(("skew", "rate"), [(8.0, 1.0), (20.0, 1.0), (-20.0, 1.0), (20.0, 1.01)])
def test_takeover_waits_for_the_full_duration_on_the_takers_clock(skew: float, rate: float) -> None:
    leases = MemoryLeases()
    a = Replica(leases, "a", 0.0, 5.0, 1.0, TIMING)
    b = Replica(leases, "b", skew, 9_000.0, rate, TIMING)
    a.tick(0.0)
    b.next_try = b.elector.monotonic() + 0.3

    def partition(t: float) -> None:
        if t >= 30.0:
            leases.cut_off.add("a")  # a's renewals stop reaching the apiserver

    changes = run([a, b], 90.0, partition)
    assert [who for _, who in changes] == ["a", "", "b"], changes
    (_, _), (a_stopped, _), (b_took, _) = changes
    # a's last renewal began at or before 30 s: it stops acting within the renew deadline...
    assert a_stopped <= 30.0 + TIMING.renew_deadline
    # ...and b took the Lease only after seeing a's last record unchanged for 15 s of its own
    # clock (a's last renewal was written at 28-30 s), whatever b's wall clock said.
    assert b_took >= 28.0 + TIMING.lease_seconds / rate
    assert b_took <= 30.0 + TIMING.lease_seconds / rate + 2 * TIMING.retry_period + STEP
    assert leases.record is not None and leases.record.holder == "b"
    assert leases.record.transitions == 1
    # a, reconnected, sees b's record: it has lost the Lease for good and stays out.
    leases.cut_off.clear()
    a.next_try = 0.0
    a.tick(91.0)
    b.tick(91.0)
    assert not a.elector.held() and a.elector.belief.lost and b.elector.held()


def test_a_replica_that_just_started_waits_the_full_duration() -> None:
    leases = MemoryLeases()
    a = Replica(leases, "a", 0.0, 0.0, 1.0, TIMING)
    a.tick(0.0)
    leases.cut_off.add("a")  # a dies right after taking the Lease (renewTime = t0)
    # b starts 40 s later with its wall clock 20 s ahead: by any wall clock the Lease is long
    # expired, but b has never seen it unchanged for 15 s.
    b = Replica(leases, "b", 20.0, 0.0, 1.0, TIMING)
    b.tick(40.0)
    assert not b.elector.held()
    for t in (41.0, 46.0, 54.9):
        b.next_try = 0.0
        b.tick(t)
        assert not b.elector.held(), f"b took the Lease {t - 40.0} s after first seeing it"
    b.next_try = 0.0
    b.tick(55.0)
    assert b.elector.held()


def test_a_released_lease_is_taken_at_once() -> None:
    leases = MemoryLeases()
    a = Replica(leases, "a", 0.0, 0.0, 1.0, TIMING)
    b = Replica(leases, "b", 20.0, 500.0, 1.0, TIMING)
    a.tick(0.0)
    b.tick(0.5)
    assert a.elector.held() and not b.elector.held()
    a.t = 1.0
    a.elector.release()  # SIGTERM
    assert not a.elector.held()
    assert leases.record is not None and leases.record.holder == ""
    b.next_try = 0.0
    b.tick(1.5)
    assert b.elector.held() and leases.record.holder == "b"
    a.next_try = 0.0
    a.tick(2.0)
    assert not a.elector.held(), "a released the Lease, yet acts again"


def test_a_holder_whose_lease_was_deleted_stops_at_once() -> None:
    leases = MemoryLeases()
    a = Replica(leases, "a", 0.0, 0.0, 1.0, TIMING)
    a.tick(0.0)
    assert a.elector.held()
    leases.record = None  # someone deletes the Lease: any replica may create it now
    a.tick(2.0)
    assert not a.elector.held(), "a acts on although anyone may have taken the Lease"
    assert a.elector.belief.lost


def test_concurrent_takers_conflict_and_one_wins() -> None:
    leases = MemoryLeases()
    timing = TIMING
    b = LeaseBelief("b", timing)
    c = LeaseBelief("c", timing)
    b.observe(None, 0.0)
    c.observe(None, 3.0)
    wb, wc = b.attempt(0.0, T0), c.attempt(3.0, T0)
    assert wb is not None and wc is not None
    for who, write, belief in (("b", wb, b), ("c", wc, c)):
        try:
            leases.write_lease("ns", "lock", who, 15, 0, T0, T0, write.resource_version)
            belief.renewed(0.0)
        except Conflict:
            pass
    assert leases.record is not None and leases.record.holder == "b"
    assert b.held(1.0) and not c.held(4.0)


@pytest.mark.parametrize(
    ("lease", "deadline", "retry", "field"),
    [
        (15, 15.0, 2.0, "renew_deadline"),
        (10, 12.0, 2.0, "renew_deadline"),
        (15, 0.0, 2.0, "renew_deadline"),
        (0, 10.0, 2.0, "lease_seconds"),
        (15, 10.0, 10.0, "retry_period"),
        (15, 10.0, 0.0, "retry_period"),
    ],
)
def test_timings_that_cannot_be_safe_are_refused(
    lease: int, deadline: float, retry: float, field: str
) -> None:
    kube: Any = MemoryLeases()
    with pytest.raises(ValueError, match=field):
        LeaderElector(
            kube,
            "ns",
            "lock",
            "a",
            lease_seconds=lease,
            renew_deadline=deadline,
            retry_period=retry,
        )
