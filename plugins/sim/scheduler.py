"""One timer thread over a heap of due callbacks, so 10,000 running operations cost no threads."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["Scheduler"]

_LOG = logging.getLogger("plugins.sim.scheduler")


class Scheduler:
    """Runs callbacks at their due time, in due order, on a single daemon thread.

    Callbacks must be quick (they run one after another); an exception in one is logged and
    does not stop the others.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sim-scheduler", daemon=True)
        self._thread.start()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Runs callback after delay seconds (at once when delay <= 0)."""
        due = self._clock() + max(0.0, delay)
        with self._cond:
            if self._stopped:
                return
            heapq.heappush(self._heap, (due, next(self._seq), callback))
            if self._heap[0][2] is callback:
                self._cond.notify()

    def pending(self) -> int:
        """How many callbacks wait."""
        with self._cond:
            return len(self._heap)

    def stop(self) -> None:
        """Drops every pending callback and ends the thread."""
        with self._cond:
            self._stopped = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - self._clock()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stopped:
                    return
                _, _, callback = heapq.heappop(self._heap)
            try:
                callback()
            except Exception:
                _LOG.exception("scheduled callback failed")
