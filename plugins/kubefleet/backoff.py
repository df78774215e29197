"""Per-object backoff of hub writes that failed: retried later, not on every reconcile pass."""

from __future__ import annotations

import logging
import threading
import time

from plugins.sdk import KubeError

__all__ = ["WriteBackoff"]

_LOG = logging.getLogger("plugins.kubefleet.backoff")
_MAX_SECONDS = 60.0


class WriteBackoff:
    """Failed writes by object key, each waiting 0.5·2^failures seconds (at most a minute)."""

    def __init__(self, max_seconds: float = _MAX_SECONDS) -> None:
        self._max = max_seconds
        self._lock = threading.Lock()
        self._failures: dict[str, tuple[int, float]] = {}

    def may_write(self, key: str) -> bool:
        """False while a write of key that failed is backing off."""
        with self._lock:
            failed = self._failures.get(key)
        return failed is None or time.monotonic() >= failed[1]

    def failed(self, key: str, what: str, exc: KubeError) -> None:
        """Records a failure of key (what: "write the X", for the log line) and backs off."""
        with self._lock:
            count = self._failures.get(key, (0, 0.0))[0] + 1
            delay = min(self._max, 0.5 * 2**count)
            self._failures[key] = (count, time.monotonic() + delay)
        _LOG.warning(
            f"cannot {what}; retrying in {delay:.0f}s",
            extra={"fields": {"object": key, "error": exc.message}},
        )

    def succeeded(self, key: str) -> None:
        """key was written: no backoff any more."""
        with self._lock:
            self._failures.pop(key, None)
