"""The controller loop: watch ClusterVersions, queue keys, reconcile one key at a time."""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

from orchestrator.fleet import OpObs
from orchestrator.kube import Gone, KubeClient, KubeError
from orchestrator.metrics import Metrics
from orchestrator.plan import Event
from orchestrator.reconcile import COMPONENT, OperationTracker, PluginPool, Reconciler

__all__ = ["Controller", "WorkQueue"]

log = logging.getLogger(__name__)
Key = tuple[str, str]


class WorkQueue:
    """Keys to reconcile: each key at most once in the queue, with optional delays."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Key]] = []
        self._due: dict[Key, float] = {}
        self._seq = 0

    def add(self, key: Key, delay: float = 0.0) -> None:
        """Queue key to run after delay seconds (an earlier due time wins)."""
        due = time.monotonic() + max(0.0, delay)
        with self._cond:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float) -> Key | None:
        """The next due key, or None after timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded entry
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    return key
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                if wait <= 0:
                    return None
                self._cond.wait(wait)


@dataclass
class Controller:
    """Runs the reconciler for every ClusterVersion of a namespace (or all namespaces)."""

    kube: KubeClient
    metrics: Metrics
    namespace: str | None
    sync_period: float
    caller: str
    queue: WorkQueue = field(default_factory=WorkQueue)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.pool = PluginPool(self.metrics, self.caller)
        self.tracker = OperationTracker(self._on_operation_done)
        self._events: queue.Queue[tuple[dict[str, Any], Event]] = queue.Queue(maxsize=10_000)
        self.reconciler = Reconciler(
            self.kube, self.metrics, self.pool, self.tracker, emit_event=self._queue_event
        )
        self._keys: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._backoff = wait_exponential(multiplier=0.5, max=60.0) + wait_random(0, 0.5)

    def run(self) -> None:
        """Run until stop is set."""
        threads = [
            threading.Thread(target=self._watch_loop, name="watch-cv", daemon=True),
            threading.Thread(target=self._resync_loop, name="resync", daemon=True),
            threading.Thread(target=self._event_loop, name="events", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            while not self.stop.is_set():
                key = self.queue.get(timeout=0.5)
                if key is not None:
                    self._process(key)
        finally:
            self.tracker.stop()
            self.pool.close()

    def _process(self, key: Key) -> None:
        try:
            requeue = self.reconciler.reconcile(*key)
        except Exception as err:
            attempt = self._failures.get(key, 0) + 1
            self._failures[key] = attempt
            state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
            state.attempt_number = attempt
            delay = self._backoff(state)
            log.warning(
                "reconcile %s/%s failed (attempt %d, retry in %.1fs): %s",
                key[0],
                key[1],
                attempt,
                delay,
                err,
            )
            self.queue.add(key, delay)
            return
        self._failures.pop(key, None)
        if requeue is not None:
            self.queue.add(key, requeue)

    def _on_operation_done(self, endpoint: str, op: OpObs) -> None:
        self.reconciler.count_operation(endpoint, op)
        for key, used in list(self.reconciler.endpoints.items()):
            if used == endpoint:
                self.queue.add(key)

    def _queue_event(self, obj: dict[str, Any], event: Event) -> None:
        try:
            self._events.put_nowait((obj, event))
        except queue.Full:
            log.warning("event queue full; dropped %s for %s", event.reason, event.cluster_id)

    def _event_loop(self) -> None:
        while not self.stop.is_set():
            try:
                obj, event = self._events.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.kube.create_event(
                    obj,
                    event.reason,
                    f"{event.cluster_id}: {event.message}",
                    event.warning,
                    COMPONENT,
                )
            except KubeError as err:
                log.info("event not recorded: %s", err)

    def _resync_loop(self) -> None:
        while not self.stop.wait(self.sync_period):
            for key in list(self._keys):
                self.queue.add(key)

    def _watch_loop(self) -> None:
        resource_version = ""
        delay = 0.5
        while not self.stop.is_set():
            try:
                if not resource_version:
                    items, resource_version = self.kube.list_cluster_versions(self.namespace)
                    self._keys = {
                        (o["metadata"]["namespace"], o["metadata"]["name"]) for o in items
                    }
                    for key in self._keys:
                        self.queue.add(key)
                for event in self.kube.watch_cluster_versions(self.namespace, resource_version):
                    meta = event.obj.get("metadata", {})
                    resource_version = meta.get("resourceVersion", resource_version)
                    if event.type == "BOOKMARK":
                        continue
                    key = (meta["namespace"], meta["name"])
                    if event.type == "DELETED":
                        self._keys.discard(key)
                    else:
                        self._keys.add(key)
                    self.queue.add(key)
                    if self.stop.is_set():
                        return
                delay = 0.5
            except Gone:
                resource_version = ""  # expired: list again
            except Exception as err:  # keep watching through API outages
                log.warning("watch of ClusterVersions failed: %s; retrying in %.1fs", err, delay)
                resource_version = ""
                self.stop.wait(delay)
                delay = min(delay * 2, 30.0)
