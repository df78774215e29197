"""The controller loop: caches of our three kinds, one queue, one key reconciled at a time."""

from __future__ import annotations

import heapq
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

from orchestrator import api
from orchestrator.adapters.cache import AccessCatalog, ObjectCache
from orchestrator.adapters.hooks import HookExecutor
from orchestrator.adapters.kube import Conflict, KubeClient, KubeError
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.notify import Notifier
from orchestrator.adapters.probes import Probes
from orchestrator.adapters.provider import OperationTracker, PluginPool
from orchestrator.adapters.secrets import TLSResolver
from orchestrator.controllers.clusterversion import DEFAULT_HISTORY, ClusterVersionController
from orchestrator.controllers.updaterun import (
    OPERATION_WAKE,
    AlwaysLeader,
    UpdateRunController,
)
from orchestrator.engine.access import AccessPolicy
from orchestrator.engine.observations import OpObs
from orchestrator.pipeline.crossrun import endpoint_identity
from orchestrator.pipeline.driver import Fence

__all__ = ["Controller", "WorkQueue"]

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # (kind "cv" | "ur", namespace, name)
COMPONENT = "fleet-orchestrator"


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
    """Runs the ClusterVersion and UpdateRun controllers over one namespace (or all)."""

    kube: KubeClient
    metrics: Metrics
    namespace: str | None
    sync_period: float
    caller: str
    fence: Fence = field(default_factory=AlwaysLeader)
    history: int = DEFAULT_HISTORY
    queue: WorkQueue = field(default_factory=WorkQueue)
    stop: threading.Event = field(default_factory=threading.Event)
    probes: Probes = field(default_factory=Probes)
    #: Who may do what (orchestrator.engine.access); default: inline endpoints only in the namespace
    #: watched (or "default" when watching all).
    policy: AccessPolicy | None = None
    #: An Event for every step of a cluster, not only its start and end (--step-events).
    step_events: bool = False

    def __post_init__(self) -> None:
        self.pool = PluginPool(self.metrics, self.caller)
        self.tracker = OperationTracker(self._on_operation_done)
        self._events: queue.Queue[tuple[dict[str, Any], str, str, bool, str]] = queue.Queue(
            maxsize=10_000
        )
        ns = self.namespace
        self.cvs = ObjectCache(self.kube, api.PLURAL, ns, on_change=self._cv_changed)
        # Every namespace's runs, like the ClusterUpgrades, though only this namespace's are
        # reconciled here: the floors of runs another orchestrator reconciles bind the clusters
        # ours share with them. This narrows, but cannot close, the window in which two
        # orchestrators admitting on one provider at once decide on each other's stale state:
        # one orchestrator per fleet is a precondition (docs/operations.md, `--namespace`).
        self.runs = ObjectCache(
            self.kube, api.UPDATE_RUN_PLURAL, None, api.LABEL_CLUSTER_VERSION, self._run_changed
        )
        # Only the run's own reconcile writes ClusterUpgrade status (write-through): the echo
        # of those writes is no news to it.
        self.upgrades = ObjectCache(
            self.kube,
            api.CLUSTER_UPGRADE_PLURAL,
            None,
            api.LABEL_RUN,
            self._upgrade_changed,
            quiet_echoes=True,
        )
        policy = self.policy or AccessPolicy.default(self.namespace or "default")
        self.catalog = AccessCatalog(self.kube, policy, self._catalog_changed)
        tls = TLSResolver(self.kube)
        self.notifier = Notifier(tls, self.metrics)
        # HTTP hooks finish on worker threads; the end of one wakes its run, like an operation's.
        self.hooks = HookExecutor(self.kube, tls, wake=self._wake_run, metrics=self.metrics)
        self.run_controller = UpdateRunController(
            self.kube,
            self.metrics,
            self.pool,
            self.tracker,
            self.upgrades,
            tls,
            self.catalog,
            fence=self.fence,
            runs=self.runs,
            emit_event=self._queue_event,
            step_events=self.step_events,
            notifier=self.notifier,
            hooks=self.hooks,
        )
        self.cv_controller = ClusterVersionController(
            self.kube, self.runs, self.upgrades, self.catalog, self.cvs, history=self.history
        )
        self._failures: dict[Key, int] = {}
        self._backoff = wait_exponential(multiplier=0.5, max=60.0) + wait_random(0, 0.5)

    def run(self) -> None:
        """Run until stop is set."""
        threads = [
            threading.Thread(
                target=self.upgrades.run, args=(self.stop,), name="watch-cu", daemon=True
            ),
            threading.Thread(target=self.runs.run, args=(self.stop,), name="watch-ur", daemon=True),
            threading.Thread(target=self.cvs.run, args=(self.stop,), name="watch-cv", daemon=True),
            threading.Thread(
                target=self.catalog.providers.run, args=(self.stop,), name="watch-fp", daemon=True
            ),
            threading.Thread(
                target=self.catalog.sources.run, args=(self.stop,), name="watch-ms", daemon=True
            ),
            threading.Thread(target=self._resync_loop, name="resync", daemon=True),
            threading.Thread(target=self._event_loop, name="events", daemon=True),
        ]
        for thread in threads:
            thread.start()
        watchers = threads[:5]
        self.probes.liveness = lambda: next(
            (f"the {t.name} thread died" for t in watchers if not t.is_alive()), ""
        )
        self.probes.readiness = lambda: "" if self.ready() else "caches not synced yet"
        for cache in self._caches():  # holdings and access need the whole picture
            while not cache.synced.wait(0.5):
                if self.stop.is_set():
                    return
        self._resync()
        try:
            while not self.stop.is_set():
                self.probes.beat()
                key = self.queue.get(timeout=0.5)
                if key is not None and self.fence.held():
                    self._process(key)
        finally:
            self.tracker.stop()
            self.pool.close()
            self.notifier.close()
            self.hooks.close()

    def ready(self) -> bool:
        """Caches synced (the /readyz answer)."""
        return all(c.synced.is_set() for c in self._caches())

    def _caches(self) -> tuple[ObjectCache, ...]:
        return (self.upgrades, self.runs, self.cvs, *self.catalog.caches())

    def _process(self, key: Key) -> None:
        kind, ns, name = key
        started = time.perf_counter()
        try:
            if kind == "cv":
                requeue = self.cv_controller.reconcile(ns, name)
            else:
                requeue = self.run_controller.reconcile(ns, name)
            self.metrics.reconcile_total.labels("success").inc()
        except Exception as err:
            self.metrics.reconcile_total.labels("error").inc()
            attempt = self._failures.get(key, 0) + 1
            self._failures[key] = attempt
            state = RetryCallState(Retrying(), fn=None, args=(), kwargs={})
            state.attempt_number = attempt
            delay = self._backoff(state)
            log.warning(
                "reconcile %s %s/%s failed (attempt %d, retry in %.1fs): %s",
                kind,
                ns,
                name,
                attempt,
                delay,
                err,
            )
            self.queue.add(key, delay)
            return
        finally:
            self.metrics.reconcile_seconds.observe(time.perf_counter() - started)
        self._failures.pop(key, None)
        if requeue is not None:
            self.queue.add(key, requeue)

    def _on_operation_done(self, endpoint: str, op: OpObs) -> None:
        self.run_controller.count_operation(endpoint, op)
        # Every run on the same provider wakes, whichever address it reaches the plugin by.
        provider = self.run_controller.pool.identities().get(endpoint)
        if provider is None:
            provider = endpoint_identity(endpoint)
        for (ns, name), used in list(self.run_controller.providers.items()):
            if provider in used:
                self.queue.add(("ur", ns, name), OPERATION_WAKE)

    def _wake_run(self, run: str) -> None:
        ns, _, name = run.partition("/")
        self.queue.add(("ur", ns, name))

    def _catalog_changed(self, event: str, obj: dict[str, Any]) -> None:
        """A FleetProvider or MetricSource changed: who may use what may have changed."""
        self._resync()

    def _cv_changed(self, event: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.queue.add(("cv", meta["namespace"], meta["name"]))

    def _run_changed(self, event: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if self.namespace is not None and meta["namespace"] != self.namespace:
            return  # another orchestrator's run: read for its floor, never reconciled here
        self.queue.add(("ur", meta["namespace"], meta["name"]))
        owner = (meta.get("labels") or {}).get(api.LABEL_CLUSTER_VERSION)
        if owner:
            self.queue.add(("cv", meta["namespace"], owner))

    def _upgrade_changed(self, event: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        run = (meta.get("labels") or {}).get(api.LABEL_RUN)
        if run and (self.namespace is None or meta["namespace"] == self.namespace):
            self.queue.add(("ur", meta["namespace"], run), 0.05)

    def _queue_event(
        self, obj: dict[str, Any], reason: str, message: str, warning: bool, name: str
    ) -> None:
        try:
            self._events.put_nowait((obj, reason, message, warning, name))
        except queue.Full:
            log.warning("event queue full; dropped %s", reason)

    def _event_loop(self) -> None:
        while not self.stop.is_set():
            try:
                obj, reason, message, warning, name = self._events.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.kube.create_event(obj, reason, message, warning, COMPONENT, name=name)
            except Conflict:
                pass  # this transition's Event exists already (one per transition per object)
            except KubeError as err:
                log.info("event not recorded: %s", err)

    def _resync(self) -> None:
        runs = self.runs.items()
        # Per-run series only for runs that exist: a deletion the watch missed (a re-list after
        # a gap sends no DELETED event) is caught here.
        self.metrics.keep_runs({(o["metadata"]["namespace"], o["metadata"]["name"]) for o in runs})
        for obj in self.cvs.items():
            self._cv_changed("RESYNC", obj)
        for obj in runs:
            self._run_changed("RESYNC", obj)

    def _resync_loop(self) -> None:
        while not self.stop.wait(self.sync_period):
            self._resync()
