"""Prometheus metrics of the orchestrator: the original operator's four counters and more."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Iterator, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

__all__ = ["Metrics"]

_PerRun = TypeVar("_PerRun", Counter, Gauge)


class RunClusters:
    """`multicluster_controller_clusters`: per UpdateRun, its ClusterUpgrades per phase.

    A run's phases are replaced together (`put`) and read together (`collect`), so a scrape
    never sees a run half-updated: its phases always sum to its clusters."""

    NAME = "multicluster_controller_clusters"
    HELP = "ClusterUpgrades of an UpdateRun (name) per phase; removed with the run."
    LABELS = ("namespace", "name", "phase")

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], dict[str, int]] = {}
        self._lock = threading.Lock()

    def put(self, namespace: str, run: str, by_phase: Mapping[str, int]) -> None:
        """The run's count in every phase (give each phase, 0 included)."""
        counts = dict(by_phase)
        with self._lock:
            self._runs[(namespace, run)] = counts

    def forget(self, namespace: str, run: str) -> None:
        with self._lock:
            self._runs.pop((namespace, run), None)

    def runs(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._runs)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=self.LABELS)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=self.LABELS)
        with self._lock:
            runs = sorted(self._runs.items())
        for (namespace, run), by_phase in runs:
            for phase, count in by_phase.items():
                family.add_metric([namespace, run, phase], count)
        yield family


class Metrics:
    """Every metric the orchestrator exports, on one registry.

    The metrics labelled by an UpdateRun (`namespace`, `name` = the run's name, first: `clusters`,
    and `health_checks` and `health_value` made through `of_run`) lose their series with
    `forget_run` when the run stops existing, so their series are bounded by the runs that
    exist; every other label is bounded by configuration (plugin endpoints, RPCs, operations,
    codes, results)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        #: (namespace, run) → the (metric, other label values) children made for that run.
        self._runs: dict[tuple[str, str], set[tuple[Counter | Gauge, tuple[str, ...]]]] = {}
        self._runs_lock = threading.Lock()
        r = self.registry
        self.success_operation = Counter(
            "multicluster_controller_success_operation",
            "Plugin operations that succeeded, by operation kind.",
            ["operation", "plugin"],
            registry=r,
        )
        self.failed_operation = Counter(
            "multicluster_controller_failed_operation",
            "Plugin operations that failed, by operation kind.",
            ["operation", "plugin"],
            registry=r,
        )
        self.success_plugin_call = Counter(
            "multicluster_controller_success_plugin_call",
            "Plugin RPCs answered OK.",
            ["rpc", "plugin"],
            registry=r,
        )
        self.failed_plugin_call = Counter(
            "multicluster_controller_failed_plugin_call",
            "Plugin RPCs answered with an error.",
            ["rpc", "plugin", "code"],
            registry=r,
        )
        self.plugin_call_seconds = Histogram(
            "multicluster_controller_plugin_call_duration_seconds",
            "Plugin RPC latency.",
            ["rpc", "plugin"],
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.inventory_missed = Counter(
            "multicluster_controller_inventory_missed_changes",
            "Clusters a plugin's listing of changes (ListClusters changed_since) missed, found "
            "by a whole listing: the plugin's bug; the whole listing is kept.",
            ["plugin"],
            registry=r,
        )
        self.reconcile_total = Counter(
            "multicluster_controller_reconcile",
            "Reconciles by result (success, error, invalid).",
            ["result"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "multicluster_controller_reconcile_duration_seconds",
            "Reconcile latency.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.clusters = RunClusters()
        r.register(self.clusters)

        self.api_writes = Counter(
            "multicluster_controller_api_writes",
            "ClusterUpgrade status writes made by the run controller.",
            registry=r,
        )
        self.health_checks = Counter(
            "multicluster_controller_health_check",
            "Health check evaluations by check and result.",
            ["namespace", "name", "check", "result"],
            registry=r,
        )
        self.health_value = Gauge(
            "multicluster_controller_health_check_value",
            "The last value a metric health check saw.",
            ["namespace", "name", "check"],
            registry=r,
        )

        self.hook_runs = Counter(
            "multicluster_controller_hook_runs",
            "Pre/post-upgrade hook outcomes by hook (preUpgrade, postUpgrade), type (http, job) "
            "and result (succeeded, failed), each hook id counted once per process.",
            ["hook", "type", "result"],
            registry=r,
        )

        self.notification_deliveries = Counter(
            "multicluster_controller_notification_deliveries",
            "Notification delivery attempts by result (delivered, retried, dropped).",
            ["result"],
            registry=r,
        )
        self.notification_queue = Gauge(
            "multicluster_controller_notification_queue",
            "Notifications waiting for delivery (or being delivered).",
            registry=r,
        )

    def of_run(self, metric: _PerRun, namespace: str, run: str, *labels: str) -> _PerRun:
        """The child of a run-labelled metric (`health_checks`, `health_value`) for one
        UpdateRun, remembered so that `forget_run` removes it."""
        with self._runs_lock:
            self._runs.setdefault((namespace, run), set()).add((metric, labels))
        return metric.labels(namespace, run, *labels)

    def forget_run(self, namespace: str, run: str) -> None:
        """Remove every series of an UpdateRun that no longer exists (pruned or deleted)."""
        self.clusters.forget(namespace, run)
        with self._runs_lock:
            children = self._runs.pop((namespace, run), set())
        for metric, labels in children:
            with contextlib.suppress(KeyError):  # removed already
                metric.remove(namespace, run, *labels)

    def keep_runs(self, existing: Collection[tuple[str, str]]) -> None:
        """Remove the series of every run not in `existing` ((namespace, name) pairs): a
        deletion the watch missed (a re-list after a gap)."""
        with self._runs_lock:
            gone = (set(self._runs) | self.clusters.runs()) - set(existing)
        for namespace, run in gone:
            self.forget_run(namespace, run)

    def on_plugin_call(self, plugin: str, rpc: str, code_name: str, seconds: float) -> None:
        """Count one plugin RPC."""
        self.plugin_call_seconds.labels(rpc, plugin).observe(seconds)
        if code_name == "OK":
            self.success_plugin_call.labels(rpc, plugin).inc()
        else:
            self.failed_plugin_call.labels(rpc, plugin, code_name).inc()
