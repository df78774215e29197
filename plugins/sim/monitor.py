"""Invariant monitor of the simulated fleet: counts kept as it changes, JSON file and gauges."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk import compare_versions

__all__ = [
    "ClusterView",
    "InvariantMonitor",
    "MonitorCollector",
    "MonitorFileWriter",
    "StepKey",
]

_LOG = logging.getLogger("plugins.sim.monitor")
_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_OPPOSITE: dict[int, int] = {_SERVICE_OUT: _SERVICE_IN, _SERVICE_IN: _SERVICE_OUT}


class ClusterView(NamedTuple):
    """What the monitor counts of one cluster."""

    available_in_service: bool
    control_plane_version: str
    node_pool_versions: tuple[str, ...]


class StepKey(NamedTuple):
    """A step: cluster, operation kind, node pool ("" unless a pool) and target ("" unless an
    upgrade)."""

    cluster_id: str
    kind: int
    node_pool: str
    target_version: str


class InvariantMonitor:
    """What a fleet upgrade must never do, counted while the simulation runs.

    - min_available_in_service: the lowest number of clusters both available and in service
      ever seen (starting with the fleet as loaded).
    - duplicate_mutations: operations started (new request_id) for a step whose effect an
      earlier SUCCEEDED operation already achieved, with nothing undoing it since: the same
      upgrade target of the same control plane / node pool while it is still there, a second
      service-out with no service-in between (and the reverse). A retry after FAILED is not
      a duplicate; repeating a request_id is not either (it starts nothing).
    - concurrent_mutators: mutating calls made while a different caller identity (metadata
      x-fleetupgrade-caller, else the peer address) made one within the last window seconds.
    - mutations_total: operations started (not idempotent repeats).
    - clusters_by_version (control planes), clusters_at_target (control plane and every node
      pool at target_version, when one is given).
    """

    def __init__(
        self,
        target_version: str | None = None,
        window_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target_version = target_version
        self.window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._sequence = 0
        self._clusters_total = 0
        self._available_in_service = 0
        self._min_available_in_service: int | None = None
        self._by_version: Counter[str] = Counter()
        self._at_target = 0
        self._duplicates = 0
        self._concurrent = 0
        self._mutations = 0
        self._in_flight = 0
        self._failed = 0
        self._done: dict[tuple[str, int, str], str] = {}
        self._last_call: dict[str, float] = {}
        self._callers: set[str] = set()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Calls listener (quickly, without locks held) after every change."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _at_target_view(self, view: ClusterView) -> bool:
        target = self.target_version
        if not target:
            return False
        return compare_versions(view.control_plane_version, target) == 0 and all(
            compare_versions(v, target) == 0 for v in view.node_pool_versions
        )

    def add_clusters(self, views: list[ClusterView]) -> None:
        """Counts clusters of the fleet (at load time, or when a reload adds some).

        The low-water mark starts at the loaded fleet's count, not at the partial counts
        seen while loading.
        """
        with self._lock:
            self._clusters_total += len(views)
            for view in views:
                self._apply(view, +1)
            self._low_water()
            self._sequence += 1
        self._changed()

    def cluster_changed(self, before: ClusterView, after: ClusterView) -> None:
        """Counts one cluster's change; a no-op when nothing the monitor counts changed."""
        if before == after:
            return
        with self._lock:
            self._apply(before, -1)
            self._apply(after, +1)
            self._low_water()
            self._sequence += 1
        self._changed()

    def _apply(self, view: ClusterView, sign: int) -> None:
        if view.available_in_service:
            self._available_in_service += sign
        self._by_version[view.control_plane_version] += sign
        if self._by_version[view.control_plane_version] <= 0:
            del self._by_version[view.control_plane_version]
        if self._at_target_view(view):
            self._at_target += sign

    def _low_water(self) -> None:
        low = self._min_available_in_service
        if low is None or self._available_in_service < low:
            self._min_available_in_service = self._available_in_service

    def mutating_call(self, caller: str) -> bool:
        """Records a mutating call; True when another caller mutated within the window."""
        now = self._clock()
        with self._lock:
            horizon = now - self.window_seconds
            overlapping = any(c != caller and t >= horizon for c, t in self._last_call.items())
            self._last_call = {c: t for c, t in self._last_call.items() if t >= horizon}
            self._last_call[caller] = now
            self._callers.add(caller)
            if overlapping:
                self._concurrent += 1
                self._sequence += 1
        if overlapping:
            self._changed()
        return overlapping

    def operation_started(self, step: StepKey, in_flight: bool) -> bool:
        """Counts a new operation; True when it duplicates an earlier successful step."""
        with self._lock:
            self._mutations += 1
            if in_flight:
                self._in_flight += 1
            done = self._done.get(step[:3])
            duplicate = done is not None and (
                done == step.target_version
                or (
                    bool(done)
                    and bool(step.target_version)
                    and compare_versions(done, step.target_version) == 0
                )
            )
            if duplicate:
                self._duplicates += 1
            if not in_flight:  # a request with nothing to do: already SUCCEEDED
                self._record_success(step)
            self._sequence += 1
        self._changed()
        return duplicate

    def operation_resumed(self, step: StepKey) -> None:
        """Counts an operation an earlier process left in flight (from the journal) as in
        flight again; it is not a new mutation."""
        with self._lock:
            self._in_flight += 1
            self._sequence += 1
        self._changed()

    def operation_ended(self, step: StepKey, succeeded: bool) -> None:
        """Counts the end of an operation that was in flight."""
        with self._lock:
            self._in_flight -= 1
            if succeeded:
                self._record_success(step)
            else:
                self._failed += 1
            self._sequence += 1
        self._changed()

    def _record_success(self, step: StepKey) -> None:
        self._done[step[:3]] = step.target_version
        opposite = _OPPOSITE.get(step.kind)
        if opposite is not None:
            self._done.pop((step.cluster_id, opposite, step.node_pool), None)

    def snapshot(self) -> dict[str, Any]:
        """The counts as a JSON-ready mapping."""
        with self._lock:
            return {
                "sequence": self._sequence,
                "clusters_total": self._clusters_total,
                "available_in_service": self._available_in_service,
                "min_available_in_service": self._min_available_in_service or 0,
                "duplicate_mutations": self._duplicates,
                "concurrent_mutators": self._concurrent,
                "mutations_total": self._mutations,
                "operations_in_flight": self._in_flight,
                "operations_failed": self._failed,
                "mutating_callers": len(self._callers),
                "clusters_by_version": dict(sorted(self._by_version.items())),
                "target_version": self.target_version,
                "clusters_at_target": self._at_target if self.target_version else None,
            }


_GAUGES: tuple[tuple[str, str], ...] = (
    ("clusters_total", "Clusters in the simulated fleet."),
    ("available_in_service", "Clusters both available and in service now."),
    ("min_available_in_service", "Lowest count of clusters available and in service ever seen."),
    ("duplicate_mutations", "Operations started for a step an earlier operation had achieved."),
    ("concurrent_mutators", "Mutating calls overlapping another caller identity's (window)."),
    ("mutations_total", "Operations started (idempotent repeats excluded)."),
    ("operations_in_flight", "Operations PENDING or RUNNING now."),
    ("operations_failed", "Operations that ended FAILED."),
)


class MonitorCollector(Collector):
    """Exports the monitor as fleet_sim_* gauges on a prometheus registry."""

    def __init__(self, monitor: InvariantMonitor) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._monitor.snapshot()
        for key, help_text in _GAUGES:
            yield GaugeMetricFamily(f"fleet_sim_{key}", help_text, value=snap[key])
        if snap["clusters_at_target"] is not None:
            yield GaugeMetricFamily(
                "fleet_sim_clusters_at_target",
                "Clusters whose control plane and node pools are at --target-version.",
                value=snap["clusters_at_target"],
            )
        by_version = GaugeMetricFamily(
            "fleet_sim_clusters_by_version",
            "Clusters per control-plane version.",
            labels=["version"],
        )
        for version, count in snap["clusters_by_version"].items():
            by_version.add_metric([version], count)
        yield by_version


class MonitorFileWriter:
    """Rewrites the monitor's JSON file atomically after changes, at most every interval."""

    def __init__(self, monitor: InvariantMonitor, path: str | Path, interval: float = 0.1) -> None:
        self._monitor = monitor
        self._path = Path(path)
        self._interval = interval
        self._dirty = threading.Event()
        self._stop = threading.Event()
        try:
            self._write()
        except OSError as exc:
            raise ValueError(
                f"--monitor-file: cannot write {str(path)!r} ({exc.strerror}); "
                "pass a path in an existing, writable directory"
            ) from None
        monitor.add_listener(self._dirty.set)
        self._thread = threading.Thread(target=self._run, name="sim-monitor-file", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        data = json.dumps(self._monitor.snapshot(), indent=2, sort_keys=True) + "\n"
        directory = self._path.parent
        fd, tmp = tempfile.mkstemp(prefix=f".{self._path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(data)
            os.replace(tmp, self._path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _run(self) -> None:
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                break
            self._dirty.clear()
            try:
                self._write()
            except OSError as exc:
                _LOG.error(
                    "cannot write the monitor file",
                    extra={"fields": {"path": str(self._path), "error": exc.strerror}},
                )
            self._stop.wait(self._interval)

    def close(self) -> None:
        """Writes the final state and stops."""
        self._stop.set()
        self._dirty.set()
        self._thread.join(timeout=5)
        try:
            self._write()
        except OSError as exc:
            _LOG.error("cannot write the monitor file", extra={"fields": {"error": exc.strerror}})
