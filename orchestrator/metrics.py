"""Prometheus metrics of the orchestrator: the original operator's four counters and more."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


class Metrics:
    """Every metric the orchestrator exports, on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
        self.clusters = Gauge(
            "multicluster_controller_clusters",
            "Clusters per phase, by UpdateRun.",
            ["namespace", "name", "phase"],
            registry=r,
        )

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

    def on_plugin_call(self, plugin: str, rpc: str, code_name: str, seconds: float) -> None:
        """Count one plugin RPC."""
        self.plugin_call_seconds.labels(rpc, plugin).observe(seconds)
        if code_name == "OK":
            self.success_plugin_call.labels(rpc, plugin).inc()
        else:
            self.failed_plugin_call.labels(rpc, plugin, code_name).inc()
