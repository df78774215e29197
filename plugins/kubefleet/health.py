"""Workload verdicts from per-pod workload_health: from MetricCollectorReports or Prometheus.

Pure functions. A tracked workload (namespace, name, kind, healthyReplicas) is healthy on a
cluster when at least healthyReplicas of its pods report workload_health >= 1; with 0, any pod
of it reporting is enough (the current cookbook's rule, pkg/controllers/approvalrequest
countHealthyPodsForWorkload: labels app = workload name, namespace, pod, workload_kind). Kinds
match exactly, case included, as that function compares them (`workload.Kind ==
metric.WorkloadKind`); a workload asked for without a kind matches no reading that has one. A
reading without a kind (the seed report schema keeps none) matches any kind. Stale or failed
data, or data collected before the cluster was last updated, answers UNKNOWN, never HEALTHY.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetupgrade.plugin.v1 import health_pb2
from plugins.kubefleet.objects import condition, format_time, parse_time
from plugins.kubefleet.prometheus import Sample

__all__ = [
    "COLLECTED",
    "HEALTHY_AT",
    "PodHealth",
    "Verdict",
    "judge",
    "pods_from_report",
    "pods_from_samples",
    "report_problem",
    "summarize",
    "unknown",
]

COLLECTED = "MetricsCollected"
"""The MetricCollectorReport condition the agent sets (True when the last query worked)."""

HEALTHY_AT = 1.0
"""A pod counts as healthy when its workload_health is at least this."""

_HEALTHY = health_pb2.WORKLOAD_HEALTH_HEALTHY
_UNHEALTHY = health_pb2.WORKLOAD_HEALTH_UNHEALTHY
_MISSING = health_pb2.WORKLOAD_HEALTH_MISSING
_UNKNOWN = health_pb2.WORKLOAD_HEALTH_UNKNOWN


@dataclass(frozen=True)
class PodHealth:
    """One pod's workload_health reading."""

    namespace: str
    workload: str
    kind: str
    pod: str
    value: float

    @property
    def healthy(self) -> bool:
        """workload_health >= 1."""
        return self.value >= HEALTHY_AT


@dataclass(frozen=True)
class Verdict:
    """A verdict for one workload on one cluster."""

    health: int
    healthy_pods: int = 0
    observed_value: float = 0.0
    message: str = ""
    observed_time: datetime | None = None


def unknown(message: str, observed_time: datetime | None = None) -> Verdict:
    """An UNKNOWN verdict (no fresh data) with why."""
    return Verdict(_UNKNOWN, message=message, observed_time=observed_time)


def _matches(pod: PodHealth, workload: health_pb2.Workload) -> bool:
    return (
        pod.namespace == workload.namespace
        and pod.workload == workload.name
        and (not pod.kind or pod.kind == workload.kind)
    )


def judge(
    pods: Iterable[PodHealth], workload: health_pb2.Workload, observed_time: datetime | None
) -> Verdict:
    """The verdict for one workload from the pods of one cluster."""
    pods = list(pods)
    mine = [p for p in pods if _matches(p, workload)]
    what = f"{workload.namespace}/{workload.name}"
    if workload.kind:
        what += f" ({workload.kind})"
    if not mine:
        other = sorted(
            {
                p.kind
                for p in pods
                if p.namespace == workload.namespace and p.workload == workload.name and p.kind
            }
        )
        hint = (
            f"; its pods report kind {', '.join(other)}: kinds match exactly, case included, "
            "as the cookbook's approval controller compares them: set the workload's kind"
            if other
            else ""
        )
        return Verdict(
            _MISSING,
            message=f"no workload_health series for {what}{hint}",
            observed_time=observed_time,
        )
    need = max(0, workload.min_healthy_replicas)
    healthy = sum(1 for p in mine if p.healthy)
    mean = sum(p.value for p in mine) / len(mine)
    text = (
        f"{healthy} of {len(mine)} pod(s) healthy, {need} required"
        if need
        else f"{len(mine)} pod(s) reporting ({healthy} healthy); 0 required: any pod is enough"
    )
    return Verdict(
        _HEALTHY if healthy >= need else _UNHEALTHY,
        healthy_pods=healthy,
        observed_value=mean,
        message=text,
        observed_time=observed_time,
    )


def pods_from_samples(samples: Iterable[Sample]) -> list[PodHealth]:
    """workload_health samples as pod readings (series without app or namespace are skipped).

    The same pod seen twice (two scrape jobs) keeps its lowest value.
    """
    seen: dict[tuple[str, str, str, str], PodHealth] = {}
    for sample in samples:
        labels = sample.labels
        app, namespace = labels.get("app", ""), labels.get("namespace", "")
        if not app or not namespace:
            continue
        pod = PodHealth(
            namespace, app, labels.get("workload_kind", ""), labels.get("pod", ""), sample.value
        )
        key = (pod.namespace, pod.workload, pod.kind, pod.pod)
        if key not in seen or seen[key].value > pod.value:
            seen[key] = pod
    return [seen[k] for k in sorted(seen)]


def pods_from_report(report: Mapping[str, Any]) -> list[PodHealth]:
    """The per-pod readings of a MetricCollectorReport's status.collectedMetrics."""
    pods = []
    for item in (report.get("status") or {}).get("collectedMetrics") or []:
        if not isinstance(item, Mapping):
            continue
        pods.append(
            PodHealth(
                str(item.get("namespace") or ""),
                str(item.get("workloadName") or ""),
                str(item.get("workloadKind") or ""),
                str(item.get("podName") or ""),
                HEALTHY_AT if item.get("health") is True else 0.0,
            )
        )
    return pods


def report_problem(
    report: Mapping[str, Any],
    now: datetime,
    max_age_seconds: float,
    not_before: datetime | None = None,
) -> tuple[str, datetime | None]:
    """("", collected at) for a fresh, successful report, else (why it cannot be used, time).

    not_before: when the cluster was last updated; a collection from before it is not used.
    """
    meta = report.get("metadata") or {}
    where = f"MetricCollectorReport {meta.get('namespace')}/{meta.get('name')}"
    status = report.get("status") or {}
    collected = parse_time(status.get("lastCollectionTime"))
    cond = condition(status.get("conditions"), COLLECTED)
    if cond is not None and cond.get("status") != "True":
        why = cond.get("message") or cond.get("reason") or "collection failed"
        return f"{where}: the collector reports {COLLECTED}={cond.get('status')}: {why}", collected
    if collected is None:
        return f"{where} has no collection yet", None
    if (now - collected).total_seconds() > max_age_seconds:
        return (
            f"{where} is stale: last collection at {format_time(collected)} "
            f"(older than {max_age_seconds:g}s)",
            collected,
        )
    if not_before is not None and collected <= not_before:
        return (
            f"{where} was collected at {format_time(collected)}, before the cluster's update "
            f"finished at {format_time(not_before)}; waiting for a collection on the new version",
            collected,
        )
    return "", collected


def summarize(results: Sequence[health_pb2.WorkloadResult], limit: int = 5) -> tuple[bool, str]:
    """(all healthy, a short text naming the first few results that are not healthy)."""
    bad = [r for r in results if r.health != _HEALTHY]
    if not results:
        return False, "no workload results"
    if not bad:
        clusters = len({r.cluster_id for r in results})
        workloads = len({(r.workload.namespace, r.workload.name) for r in results})
        return True, f"{workloads} tracked workload(s) healthy on {clusters} cluster(s)"
    parts = [
        f"{r.cluster_id} {r.workload.namespace}/{r.workload.name}: "
        f"{health_pb2.WorkloadHealth.Name(r.health).removeprefix('WORKLOAD_HEALTH_')}"
        + (f" ({r.message})" if r.message else "")
        for r in bad[:limit]
    ]
    more = f"; and {len(bad) - limit} more" if len(bad) > limit else ""
    return False, f"{len(bad)} of {len(results)} not healthy: " + "; ".join(parts) + more
