"""Workload health of a stage's clusters: from MetricCollectorReports or the central Prometheus.

The verdicts CheckWorkloads answers and the health part of a gate's view. In reports mode each
cluster's freshest report in fleet-member-<cluster> is judged; in prometheus mode two queries
to the central Prometheus answer for every cluster. Data collected before a cluster's last
update (the runs' caches say when) never counts. A gate's health is looked at once per
evaluate_interval in prometheus mode (memoized per gate); every pass in reports mode.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import health_pb2
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet import health
from plugins.kubefleet.caches import HubCaches
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.objects import format_time, member_namespace
from plugins.kubefleet.prometheus import PrometheusError, escape_label_value, query_vector

__all__ = ["WorkloadHealth"]


def _regex_union(values: Sequence[str]) -> str:
    return "|".join(escape_label_value(re.escape(v)) for v in sorted(set(values)))


class WorkloadHealth:
    """Verdicts per (cluster, workload), and each gate's memoized stage health."""

    def __init__(self, cfg: KubeFleetConfig, caches: HubCaches) -> None:
        self.cfg = cfg
        self._caches = caches
        self._memo: dict[str, tuple[float, tuple[Any, ...], bool, str]] = {}

    def verdicts(
        self,
        cluster_ids: Sequence[str],
        workloads: Sequence[health_pb2.Workload],
        now: datetime,
    ) -> list[health_pb2.WorkloadResult]:
        """One result per (cluster, workload), clusters in the order given."""
        updated = self._updated_times()
        if self._caches.reports_mode:
            per_cluster = {
                c: self._from_reports(c, workloads, now, updated.get(c)) for c in cluster_ids
            }
        else:
            per_cluster = self._from_prometheus(cluster_ids, workloads, now, updated)
        results = []
        for cluster_id in cluster_ids:
            for workload, verdict in zip(workloads, per_cluster[cluster_id], strict=True):
                result = health_pb2.WorkloadResult(
                    cluster_id=cluster_id,
                    workload=workload,
                    health=verdict.health,  # type: ignore[arg-type]
                    healthy_replicas=verdict.healthy_pods,
                    observed_value=verdict.observed_value,
                    message=verdict.message,
                )
                if verdict.observed_time is not None:
                    result.observed_time.FromDatetime(verdict.observed_time)
                results.append(result)
        return results

    def _updated_times(self) -> dict[str, datetime]:
        """cluster → when an update run last finished updating it (from the runs' caches)."""
        runs = [c.obj for informer in self._caches.runs.values() for c in informer.items()]
        return gatelib.stage_updated_times(runs)

    def _from_reports(
        self,
        cluster_id: str,
        workloads: Sequence[health_pb2.Workload],
        now: datetime,
        not_before: datetime | None,
    ) -> list[health.Verdict]:
        """From the freshest MetricCollectorReport in fleet-member-<cluster> (any collector:
        every report carries every workload_health series of the member's Prometheus); one
        collected before the cluster's last update is not used."""
        assert self._caches.reports is not None
        namespace = member_namespace(cluster_id)
        reports = [c.obj for c in self._caches.reports.in_namespace(namespace)]
        if not reports:
            why = (
                f"no MetricCollectorReport in {namespace} yet "
                "(is fleet-metric-collector running on the member?)"
            )
            return [health.unknown(why)] * len(workloads)
        best: tuple[str, datetime | None, dict[str, Any]] | None = None
        for report in reports:
            problem, collected = health.report_problem(
                report, now, self.cfg.report_max_age, not_before
            )
            rank = (problem == "", collected or datetime.min.replace(tzinfo=UTC))
            if best is None or rank > (best[0] == "", best[1] or datetime.min.replace(tzinfo=UTC)):
                best = (problem, collected, report)
        assert best is not None
        problem, collected, report = best
        if problem:
            return [health.unknown(problem, collected)] * len(workloads)
        pods = health.pods_from_report(report)
        return [health.judge(pods, w, collected) for w in workloads]

    def _from_prometheus(
        self,
        cluster_ids: Sequence[str],
        workloads: Sequence[health_pb2.Workload],
        now: datetime,
        updated: Mapping[str, datetime],
    ) -> dict[str, list[health.Verdict]]:
        """Two queries to the central Prometheus, whatever the number of clusters."""
        label = self.cfg.cluster_label
        selector = (
            f'namespace=~"{_regex_union([w.namespace for w in workloads])}",'
            f'app=~"{_regex_union([w.name for w in workloads])}"'
        )
        try:
            samples = query_vector(
                self.cfg.central_prometheus_url,
                f"workload_health{{{selector}}}",
                name="the central Prometheus",
            )
            fresh = query_vector(
                self.cfg.central_prometheus_url,
                f"max by ({label}) (timestamp(workload_health))",
                name="the central Prometheus",
            )
        except PrometheusError as exc:
            return {c: [health.unknown(str(exc))] * len(workloads) for c in cluster_ids}
        last_seen = {s.labels.get(label, ""): s.value for s in fresh}
        by_cluster: dict[str, list[Any]] = {}
        for sample in samples:
            by_cluster.setdefault(sample.labels.get(label, ""), []).append(sample)
        out = {}
        for cluster_id in cluster_ids:
            seen = last_seen.get(cluster_id)
            if seen is None:
                why = f"the central Prometheus has no workload_health from {label}={cluster_id!r}"
                out[cluster_id] = [health.unknown(why)] * len(workloads)
                continue
            observed = datetime.fromtimestamp(seen, UTC)
            if (now - observed).total_seconds() > self.cfg.report_max_age:
                why = (
                    f"workload_health of {cluster_id} in the central Prometheus is stale: "
                    f"last sample at {format_time(observed)} "
                    f"(older than {self.cfg.report_max_age:g}s)"
                )
                out[cluster_id] = [health.unknown(why, observed)] * len(workloads)
                continue
            since = updated.get(cluster_id)
            if since is not None and observed <= since:
                why = (
                    f"the central Prometheus has no workload_health of {cluster_id} since its "
                    f"update finished at {format_time(since)} (last sample at "
                    f"{format_time(observed)})"
                )
                out[cluster_id] = [health.unknown(why, observed)] * len(workloads)
                continue
            pods = health.pods_from_samples(by_cluster.get(cluster_id, []))
            out[cluster_id] = [health.judge(pods, w, observed) for w in workloads]
        return out

    def stage_health(self, view: gatelib.GateView, now: datetime) -> tuple[bool, str]:
        """(all healthy, summary) of the view's workloads on its clusters.

        From the caches every pass in reports mode; in prometheus mode at most once per
        evaluate_interval per gate (or when the clusters or workloads change).
        """
        inputs = (tuple(view.clusters), tuple(w.SerializeToString() for w in view.workloads))
        memo = self._memo.get(view.ref.id)
        stamp = time.monotonic()
        if (
            not self._caches.reports_mode
            and memo is not None
            and memo[1] == inputs
            and stamp - memo[0] < self.cfg.evaluate_interval
        ):
            return memo[2], memo[3]
        members = self._caches.members
        known = [c for c in view.clusters if members.get("", c) is not None]
        gone = [c for c in view.clusters if c not in known]
        results = self.verdicts(known, view.workloads, now) if known else []
        healthy, summary = health.summarize(results)
        if gone:
            healthy = False
            summary = f"no MemberCluster named {', '.join(gone)}; " + summary
        self._memo[view.ref.id] = (stamp, inputs, healthy, summary)
        return healthy, summary

    def forget_all_but(self, gate_ids: Collection[str]) -> None:
        """Drops the memo of every gate not in gate_ids (the gate is gone)."""
        for gate_id in set(self._memo) - set(gate_ids):
            self._memo.pop(gate_id, None)
