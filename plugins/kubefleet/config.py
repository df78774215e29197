"""Settings of the KubeFleet plugin (from its command line), checked with clear errors."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from plugins.kubefleet.inventory import (
    DEFAULT_HEARTBEAT_TIMEOUT,
    DEFAULT_VERSION_SOURCE,
    TaintSpec,
    parse_version_sources,
)

__all__ = ["COOKBOOK_CHOICES", "HEALTH_SOURCES", "KubeFleetConfig"]

HEALTH_SOURCES = ("reports", "prometheus")
COOKBOOK_CHOICES = ("auto", "current", "seed")
MAX_OVERRIDES = 100
"""KubeFleet's limit of ClusterResourceOverrides per hub (its validating webhook)."""
_DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$")
_URL = re.compile(r"^https?://[^/\s]+")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class KubeFleetConfig:
    """What the plugin does and how often.

    health_source "reports": per-cluster MetricCollectorReports on the hub, written by the
    fleet-metric-collector agents; the plugin propagates a MetricCollector to each stage's
    clusters (ClusterResourcePlacement + ClusterResourceOverride). "prometheus": one central
    Prometheus holds workload_health of every cluster (label cluster_label); nothing is
    propagated and the hub sees no per-cluster traffic.

    cookbook "current": the cookbook's autoapprove.kubernetes-fleet.io API (hub-created
    MetricCollectorReports); "seed": the tutorial's metric.kubernetes-fleet.io API (a placed
    MetricCollector); "auto": whichever the hub serves, current first.

    heartbeat_timeout: seconds since the member agent's last heartbeat after which a member is
    not available (KubeFleet's scheduler's own threshold by default, 5 minutes).
    """

    health_source: str = "reports"
    member_prometheus_url: str = "http://prometheus.prometheus.svc.cluster.local:9090"
    collect_interval: str = "30s"
    report_max_age: float = 90.0
    central_prometheus_url: str = ""
    cluster_label: str = "cluster"
    evaluate_interval: float = 5.0
    taint: TaintSpec = field(default_factory=TaintSpec)
    version_source: str = DEFAULT_VERSION_SOURCE
    cookbook: str = "auto"
    max_overrides: int = 10
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT

    def problems(self) -> list[str]:
        """Every setting that is wrong, each naming its flag and the fix."""
        out = []
        if self.health_source not in HEALTH_SOURCES:
            out.append(
                f"--health-source: {self.health_source!r} is not one of {', '.join(HEALTH_SOURCES)}"
            )
        if self.health_source == "prometheus" and not _URL.match(self.central_prometheus_url):
            out.append(
                "--central-prometheus-url: required with --health-source prometheus; "
                "give the base URL, e.g. http://thanos-query.monitoring:9090"
            )
        if self.health_source == "reports" and not _URL.match(self.member_prometheus_url):
            out.append(
                "--member-prometheus-url: give the members' Prometheus base URL, "
                "e.g. http://prometheus.prometheus.svc.cluster.local:9090"
            )
        if not _DURATION.match(self.collect_interval):
            out.append(f"--collect-interval: {self.collect_interval!r} is not a duration like 30s")
        if self.report_max_age <= 0:
            out.append("--report-max-age: must be a positive number of seconds")
        if self.evaluate_interval <= 0:
            out.append("--evaluate-interval: must be a positive number of seconds")
        if not _LABEL_NAME.match(self.cluster_label):
            out.append(f"--cluster-label: {self.cluster_label!r} is not a Prometheus label name")
        try:
            parse_version_sources(self.version_source)
        except ValueError as exc:
            out.append(f"--version-source: {exc}")
        if self.cookbook not in COOKBOOK_CHOICES:
            out.append(f"--cookbook: {self.cookbook!r} is not one of {', '.join(COOKBOOK_CHOICES)}")
        if not 1 <= self.max_overrides <= MAX_OVERRIDES:
            out.append(
                f"--max-overrides: {self.max_overrides} is not between 1 and {MAX_OVERRIDES} "
                "(KubeFleet admits 100 ClusterResourceOverrides per hub; leave room for yours)"
            )
        if self.heartbeat_timeout <= 0:
            out.append(
                "--heartbeat-timeout: must be a positive number of seconds "
                f"(KubeFleet's own is {DEFAULT_HEARTBEAT_TIMEOUT:g})"
            )
        if not self.taint.key:
            out.append("--taint-key: must not be empty")
        return out
