"""One replica's belief about a Lease, decided on its own monotonic clock (no I/O).

As client-go's leader election (`tryAcquireOrRenew`: observedRecord, observedTime): a Lease
held by someone else expires when this replica has seen its record unchanged for the whole
lease duration, timed on this replica's own monotonic clock from the moment it first saw that
record. The holder's renewTime is never compared with this replica's wall clock, so wall-clock
skew between replicas does not matter; wall time is only written into renewTime and
acquireTime for people to read. The holder stops acting (`held` turns false) once its last
successful renewal is renew_deadline old by its own monotonic clock, and renew_deadline is
shorter than the lease duration, so it stops before any other replica may take the Lease.

`orchestrator.adapters.leader.LeaderElector` does the apiserver I/O around this; the simulation
(tests/sim) runs the same class against a model Lease with per-replica clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["LeaseBelief", "LeaseRecord", "LeaseTiming", "LeaseWrite"]


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The fields of a coordination.k8s.io/v1 Lease that leader election uses."""

    holder: str | None
    renew_time: datetime | None
    duration_seconds: int
    transitions: int
    resource_version: str | None


@dataclass(frozen=True, slots=True)
class LeaseWrite:
    """What to write to take or renew the Lease (resource_version None: create it)."""

    holder: str
    duration_seconds: int
    transitions: int
    acquire_time: datetime
    renew_time: datetime
    resource_version: str | None


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """Lease duration, renew deadline and retry period, in seconds, checked at construction."""

    lease_seconds: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be > 0 (got {self.lease_seconds})")
        if not 0 < self.renew_deadline < self.lease_seconds:
            raise ValueError(
                f"renew_deadline must be > 0 and shorter than lease_seconds "
                f"(got renew_deadline={self.renew_deadline}, lease_seconds={self.lease_seconds}):"
                " the holder must stop acting before another replica may take the Lease"
            )
        if not 0 < self.retry_period < self.renew_deadline:
            raise ValueError(
                f"retry_period must be > 0 and shorter than renew_deadline "
                f"(got retry_period={self.retry_period}, renew_deadline={self.renew_deadline}):"
                " the holder must get a chance to renew before its deadline"
            )


def _version(record: LeaseRecord) -> tuple[object, ...]:
    """What makes a record a new observation: any change restarts the expiry timer."""
    return (record.holder, record.renew_time, record.transitions, record.resource_version)


class LeaseBelief:
    """What one replica believes about one Lease; every `now` is its own monotonic clock."""

    def __init__(self, identity: str, timing: LeaseTiming) -> None:
        if not identity:
            raise ValueError("identity must be a non-empty string (it is the Lease's holder)")
        self.identity = identity
        self.timing = timing
        #: The record last observed, and when (our monotonic clock) it was first seen as is.
        self.observed: LeaseRecord | None = None
        self.observed_at: float | None = None
        #: Monotonic time at which the attempt that last renewed (or took) the Lease began.
        self.renewed_at: float | None = None
        #: When we took the Lease (wall clock, written as acquireTime).
        self.acquired_wall: datetime | None = None
        #: Final: we saw another holder after holding it, or we released it.
        self.lost = False

    def observe(self, record: LeaseRecord | None, now: float) -> None:
        """Record what a read returned (now: our monotonic clock after the read answered)."""
        if record is None:
            # Absent: anyone may create it now, so a Lease we held is lost for certain.
            self.lost = self.lost or self.renewed_at is not None
            self.observed, self.observed_at = None, None
            return
        if self.observed is None or _version(record) != _version(self.observed):
            self.observed, self.observed_at = record, now
        if self.renewed_at is not None and record.holder != self.identity:
            # Someone else wrote the Lease we held: we lost it for certain (invariant 8), so
            # we stop acting now, not at the renew deadline.
            self.lost = True

    def expired(self, now: float) -> bool:
        """True when the observed record has been unchanged for a whole lease duration."""
        if self.observed is None or self.observed_at is None:
            return True  # no Lease: nothing to wait for
        return now - self.observed_at >= self.observed.duration_seconds

    def may_take(self, now: float) -> bool:
        """Whether we may write ourselves into the observed record (take it or renew it)."""
        if self.lost:
            return False
        record = self.observed
        if record is None or record.holder in (None, "", self.identity):
            return True  # absent, released, or ours
        return self.expired(now)

    def attempt(self, now: float, wall: datetime) -> LeaseWrite | None:
        """The write that takes or renews the observed Lease, or None when we may not."""
        if not self.may_take(now):
            return None
        record = self.observed
        if record is None:
            self.acquired_wall = wall
            return LeaseWrite(
                self.identity, self.timing.lease_seconds, 0, wall, wall, resource_version=None
            )
        ours = record.holder == self.identity
        if not ours or self.acquired_wall is None:
            self.acquired_wall = wall
        return LeaseWrite(
            self.identity,
            self.timing.lease_seconds,
            record.transitions + (0 if ours else 1),
            self.acquired_wall,
            wall,
            record.resource_version,
        )

    def renewed(self, started: float) -> None:
        """The write of `attempt` succeeded; started: our monotonic clock before the read."""
        self.renewed_at = started

    def held(self, now: float) -> bool:
        """True while our last renewal is younger than the renew deadline (the Fence)."""
        return (
            not self.lost
            and self.renewed_at is not None
            and now - self.renewed_at < self.timing.renew_deadline
        )

    def release(self, wall: datetime) -> LeaseWrite | None:
        """Stop acting at once; the write that hands the Lease over, if it is still ours."""
        had = self.renewed_at is not None
        self.lost = True
        record = self.observed
        if not had or record is None or record.holder != self.identity:
            return None
        return LeaseWrite(
            "", 1, record.transitions, self.acquired_wall or wall, wall, record.resource_version
        )
