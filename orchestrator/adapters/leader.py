"""Leader election on a coordination.k8s.io Lease: 15 s lease, 10 s renew deadline, 2 s retry.

The apiserver I/O around `orchestrator.pipeline.lease.LeaseBelief`, which decides (on this replica's
own monotonic clock, never by comparing wall clocks) whether the Lease may be taken and whether
we still hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from orchestrator.adapters.kube import Conflict, KubeClient, KubeError
from orchestrator.pipeline.lease import LeaseBelief, LeaseTiming, LeaseWrite

__all__ = ["LeaderElector"]

log = logging.getLogger(__name__)


def _micro(now: datetime) -> datetime:
    """The client drops a zero fraction, and MicroTime requires one."""
    return now.replace(microsecond=1) if now.microsecond == 0 else now


class LeaderElector:
    """Acquires a Lease and keeps renewing it; calls on_lost once if it cannot.

    Unlike the Python client's own elector, losing the lease is final: on_lost is expected to
    stop the process, so a deposed leader never goes on acting. `clock` (wall) is only written
    into the Lease for people to read; every decision uses `monotonic`.
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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.timing = LeaseTiming(lease_seconds, renew_deadline, retry_period)
        self.lease_seconds, self.renew_deadline, self.retry_period = (
            lease_seconds,
            renew_deadline,
            retry_period,
        )
        self.clock, self.monotonic = clock, monotonic
        self.belief = LeaseBelief(identity, self.timing)
        # Every Lease request is bounded well inside the renew deadline (a 30 s request against
        # a 15 s lease would let a deposed leader believe it still leads).
        self.request_timeout = max(1.0, renew_deadline / 2)

    def held(self) -> bool:
        """True while the last renewal is younger than the renew deadline (the Fence)."""
        return self.belief.held(self.monotonic())

    def _write(self, write: LeaseWrite) -> None:
        self.kube.write_lease(
            self.namespace,
            self.name,
            write.holder,
            write.duration_seconds,
            write.transitions,
            write.acquire_time,
            write.renew_time,
            write.resource_version,
            self.request_timeout,
        )

    def release(self) -> None:
        """Give the Lease up at once (SIGTERM): the next replica need not wait for expiry."""
        if self.belief.renewed_at is None:
            return
        self.belief.lost = True  # stop acting first, whatever the apiserver says
        try:
            record = self.kube.get_lease(self.namespace, self.name, self.request_timeout)
            self.belief.observe(record, self.monotonic())
            write = self.belief.release(_micro(self.clock()))
            if write is not None:
                self._write(write)
                log.info("released the lease %s/%s", self.namespace, self.name)
        except KubeError as err:
            log.warning("could not release the lease: %s", err)

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when we hold the lease afterwards."""
        started = self.monotonic()
        try:
            record = self.kube.get_lease(self.namespace, self.name, self.request_timeout)
            self.belief.observe(record, self.monotonic())
            write = self.belief.attempt(self.monotonic(), _micro(self.clock()))
            if write is None:
                return False
            self._write(write)
        except Conflict:
            return False
        except KubeError as err:
            log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            return False
        self.belief.renewed(started)
        return True

    def acquire(self, stop: threading.Event) -> bool:
        """Block until the lease is ours (True) or stop is set (False)."""
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("became leader as %s", self.identity)
                return True
            stop.wait(self.retry_period)
        return False

    def keep(self, stop: threading.Event, on_lost: Callable[[], None]) -> threading.Thread:
        """Renew in the background; on_lost() once we no longer hold the lease."""

        def loop() -> None:
            while not stop.wait(self.retry_period):
                if not self.try_acquire_or_renew() and not self.held():
                    self.belief.lost = True
                    log.error("lost the lease %s/%s; stopping", self.namespace, self.name)
                    on_lost()
                    return

        thread = threading.Thread(target=loop, name="lease-renewal", daemon=True)
        thread.start()
        return thread
