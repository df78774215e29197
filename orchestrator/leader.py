"""Leader election on a coordination.k8s.io Lease: 15 s lease, 10 s renew deadline, 2 s retry."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from orchestrator.kube import Conflict, KubeClient, KubeError

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


class LeaderElector:
    """Acquires a Lease and keeps renewing it; calls on_lost once if it cannot.

    Unlike the Python client's own elector, losing the lease is final: on_lost is expected to
    stop the process, so a deposed leader never goes on acting.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.lease_seconds, self.renew_deadline, self.retry_period = (
            lease_seconds,
            renew_deadline,
            retry_period,
        )
        self.clock = clock
        self._acquired_at: datetime | None = None
        self._renewed: float | None = None  # monotonic time of the last successful renewal
        self._lost = False
        # Every Lease request is bounded well inside the renew deadline (a 30 s request against
        # a 15 s lease would let a deposed leader believe it still leads).
        self.request_timeout = max(1.0, renew_deadline / 2)

    def held(self) -> bool:
        """True while the last renewal is younger than the renew deadline (the Fence)."""
        return (
            not self._lost
            and self._renewed is not None
            and time.monotonic() - self._renewed < self.renew_deadline
        )

    def release(self) -> None:
        """Give the Lease up at once (SIGTERM): the next replica need not wait for expiry."""
        if self._renewed is None:
            return
        self._lost = True
        try:
            record = self.kube.get_lease(self.namespace, self.name, self.request_timeout)
            if record is None or record.holder != self.identity:
                return
            now = self.clock().replace(microsecond=1)
            self.kube.write_lease(
                self.namespace,
                self.name,
                "",
                1,
                record.transitions,
                self._acquired_at or now,
                now,
                record.resource_version,
                self.request_timeout,
            )
            log.info("released the lease %s/%s", self.namespace, self.name)
        except KubeError as err:
            log.warning("could not release the lease: %s", err)

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when we hold the lease afterwards."""
        now = self.clock()
        if now.microsecond == 0:  # the client would drop the fraction; MicroTime requires it
            now = now.replace(microsecond=1)
        started = time.monotonic()
        try:
            record = self.kube.get_lease(self.namespace, self.name, self.request_timeout)
            if record is None:
                self._acquired_at = now
                self.kube.write_lease(
                    self.namespace,
                    self.name,
                    self.identity,
                    self.lease_seconds,
                    0,
                    now,
                    now,
                    None,
                    self.request_timeout,
                )
                self._renewed = started
                return True
            held_by_other = record.holder not in (None, "", self.identity)
            expired = record.renew_time is None or (
                record.renew_time + timedelta(seconds=record.duration_seconds) < now
            )
            if held_by_other and not expired:
                if self._renewed is not None:
                    # Invariant 8: another replica holds the Lease we held; we lost it for
                    # certain, so we stop acting now, not at the renew deadline.
                    self._lost = True
                return False
            transitions = record.transitions + (1 if record.holder != self.identity else 0)
            if record.holder != self.identity or self._acquired_at is None:
                self._acquired_at = now
            self.kube.write_lease(
                self.namespace,
                self.name,
                self.identity,
                self.lease_seconds,
                transitions,
                self._acquired_at,
                now,
                record.resource_version,
                self.request_timeout,
            )
            self._renewed = started
            return True
        except Conflict:
            return False
        except KubeError as err:
            log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            return False

    def acquire(self, stop: threading.Event) -> bool:
        """Block until the lease is ours (True) or stop is set (False)."""
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("became leader as %s", self.identity)
                return True
            stop.wait(self.retry_period)
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in the background; on_lost() when renewal fails for renew_deadline."""

        def loop() -> None:
            last_ok = time.monotonic()
            while not stop.wait(self.retry_period):
                if self.try_acquire_or_renew():
                    last_ok = time.monotonic()
                elif self._lost or time.monotonic() - last_ok > self.renew_deadline:
                    self._lost = True
                    log.error("lost the lease %s/%s; stopping", self.namespace, self.name)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        thread.start()
        return thread
