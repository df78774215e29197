"""The fleet-metric-collector agent: local Prometheus → MetricCollectorReport on the KubeFleet hub.

Runs on each member cluster, for either cookbook generation or both at once (--cookbook
current|seed|both; auto: current when the hub serves autoapprove.kubernetes-fleet.io reports to
it, else seed; both: a hub that serves the two side by side, e.g. while moving from one to the
other):

- current: like the cookbook's own metric-collector (pkg/controllers/metriccollector), it
  watches the MetricCollectorReports the hub side created in fleet-member-<cluster> and, every
  interval, fills their status from the local Prometheus's workload_health. It never creates
  or deletes reports.
- seed: it watches the MetricCollectors that KubeFleet placed on the member (one per stage
  being verified) and creates or updates the MetricCollectorReport named like the collector in
  fleet-member-<cluster> (spec.reportNamespace, set per cluster by a ClusterResourceOverride);
  when a MetricCollector goes away its report is deleted.

Only the fields the generation's schema keeps are written (a pruned field would be written
again at every collection for nothing). Prometheus or hub outages are ridden out with
exponential backoff; what is wrong is written as conditions on the report (MetricsCollected)
and, in seed mode, on the member's MetricCollector (MetricsCollected, MetricsReported).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, start_http_server

from plugins.kubefleet import health
from plugins.kubefleet.objects import (
    ANNOTATION_INTERVAL,
    CURRENT,
    LABEL_CLUSTER,
    LABEL_MANAGED_BY,
    LABEL_METRIC_COLLECTOR,
    METRIC_COLLECTORS,
    SEED,
    Cookbook,
    condition,
    format_time,
    member_namespace,
    set_condition,
)
from plugins.kubefleet.prometheus import PrometheusError, query_vector
from plugins.sdk import Informer, Kube, KubeError, KubeNotFound, Resource, configure_logging

__all__ = [
    "COLLECTED",
    "REPORTED",
    "CollectorOptions",
    "MetricCollectorAgent",
    "build_parser",
    "main",
    "parse_interval",
]

_LOG = logging.getLogger("plugins.kubefleet.collector")

COLLECTED = health.COLLECTED
"""Report and MetricCollector condition: True when the last Prometheus query worked."""
REPORTED = "MetricsReported"
"""MetricCollector condition (member side): True when the last report reached the hub."""

QUERY = "workload_health"
_DEFAULT_INTERVAL = 30.0
_MIN_INTERVAL = 0.2
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
COOKBOOK_CHOICES = ("auto", "current", "seed", "both")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def parse_interval(text: object, default: float = _DEFAULT_INTERVAL) -> float:
    """A Go-style duration ("30s", "1m30s") in seconds; default when absent or malformed."""
    if not isinstance(text, str) or not re.fullmatch(r"([0-9]+(\.[0-9]+)?(ms|s|m|h))+", text):
        return default
    seconds = sum(float(n) * _UNIT[u] for n, u in _DURATION_PART.findall(text))
    return max(_MIN_INTERVAL, seconds)


@dataclass
class CollectorOptions:
    """Where the agent reads and writes, and how often it retries."""

    cluster_name: str
    member_kubeconfig: str | None = None
    hub_kubeconfig: str | None = None
    hub_url: str | None = None
    hub_token_file: str | None = None
    hub_ca_file: str | None = None
    prometheus_url: str | None = None
    default_interval: float = _DEFAULT_INTERVAL
    max_backoff: float = 60.0
    cookbook: str = "auto"
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def problems(self) -> list[str]:
        """Every option that is wrong, naming its flag and the fix."""
        out = []
        if not _DNS_LABEL.match(self.cluster_name or ""):
            out.append(
                "--cluster-name: set the MemberCluster name of this cluster (a DNS label; "
                "or MEMBER_CLUSTER_NAME)"
            )
        if not self.hub_kubeconfig and not self.hub_url:
            out.append(
                "--hub-url (with --hub-token-file) or --hub-kubeconfig: say how to reach the hub"
            )
        if self.max_backoff <= 0 or self.default_interval <= 0:
            out.append("--max-backoff and --default-interval: must be positive seconds")
        if self.cookbook not in COOKBOOK_CHOICES:
            out.append(f"--cookbook: {self.cookbook!r} is not one of {', '.join(COOKBOOK_CHOICES)}")
        return out


@dataclass
class _State:
    """What the agent remembers about one MetricCollector."""

    due: float = 0.0
    failures: int = 0
    report_namespace: str = ""
    report_conditions: list[dict[str, Any]] = field(default_factory=list)
    member_conditions: list[dict[str, Any]] = field(default_factory=list)
    reported: bool = False


class _InNamespace:
    """The hub adapter as an Informer sees it, listing and watching one namespace only (the
    agent may read reports in its own fleet-member-<cluster>, nowhere else)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self._kube = kube
        self._namespace = namespace

    @property
    def closed(self) -> bool:
        return self._kube.closed

    def list(self, res: Resource, label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        return self._kube.list(res, label_selector, namespace=self._namespace)

    def watch(
        self,
        res: Resource,
        resource_version: str,
        label_selector: str = "",
        timeout_seconds: int = 300,
    ) -> Any:
        return self._kube.watch(
            res, resource_version, label_selector, timeout_seconds, namespace=self._namespace
        )


class MetricCollectorAgent:
    """The agent: a watch cache of the member's MetricCollectors and one collection thread."""

    def __init__(self, options: CollectorOptions) -> None:
        problems = options.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.options = options
        self.member = Kube(options.member_kubeconfig, what="member cluster")
        self.hub = Kube(
            options.hub_kubeconfig,
            url=options.hub_url,
            token_file=options.hub_token_file,
            ca_file=options.hub_ca_file,
            what="KubeFleet hub",
            flag="--hub-kubeconfig" if options.hub_kubeconfig else "--hub-url",
        )
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.namespace = member_namespace(options.cluster_name)
        chosen = {"current": [CURRENT], "seed": [SEED], "both": [CURRENT, SEED]}
        self.cookbooks: list[Cookbook] = chosen.get(options.cookbook, [])
        self._collectors: Informer | None = None
        self._reports: Informer | None = None
        self._states: dict[str, _State] = {}  # seed: per MetricCollector
        self._report_states: dict[str, _State] = {}  # current: per hub-created report
        self._orphans: dict[str, str] = {}  # report name -> namespace, to delete on the hub
        self._thread = threading.Thread(target=self._run, name="metric-collector", daemon=True)
        registry = options.registry
        self.collections = Counter(
            "fleet_metric_collector_collections",
            "Prometheus queries by result (success, failure).",
            ["result"],
            registry=registry,
        )
        self.reports = Counter(
            "fleet_metric_collector_reports",
            "Report writes to the hub by result (success, failure).",
            ["result"],
            registry=registry,
        )

    def start(self) -> MetricCollectorAgent:
        """Starts the collection thread (it picks the generation, then starts its cache)."""
        self._thread.start()
        return self

    def _resolve(self) -> bool:
        """Picks the generation (auto: current when the hub serves its reports to this agent)
        and starts the watch cache it needs; False while the hub cannot be asked."""
        if not self.cookbooks:
            try:
                self.hub.list(CURRENT.reports, namespace=self.namespace)
                self.cookbooks = [CURRENT]
            except KubeError as exc:
                if exc.status not in (403, 404):
                    _LOG.info("cannot ask the hub yet", extra={"fields": {"error": exc.message}})
                    return False
                self.cookbooks = [SEED]
            _LOG.info(
                "collecting for the cookbook generation",
                extra={"fields": {"cookbook": self.cookbooks[0].name}},
            )
        if CURRENT in self.cookbooks and self._reports is None:
            scoped: Any = _InNamespace(self.hub, self.namespace)
            self._reports = Informer(scoped, CURRENT.reports, on_change=self._wake.set)
            self._reports.start()
        if SEED in self.cookbooks and self._collectors is None:
            self._collectors = Informer(self.member, METRIC_COLLECTORS, on_change=self._wake.set)
            self._collectors.start()
        return True

    def stop(self) -> None:
        """Stops the thread and closes both connections."""
        self._stop.set()
        self._wake.set()
        for informer in (self._collectors, self._reports):
            if informer is not None:
                informer.stop(timeout=0)
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.member.close()
        self.hub.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = self._pass()
            self._wake.wait(wait)
            self._wake.clear()

    def _pass(self) -> float:
        """Collects for what is due; returns seconds until the next one is due."""
        if not self._resolve():
            return min(self.options.max_backoff, 2.0)
        waits = []
        if CURRENT in self.cookbooks:
            waits.append(self._current_pass())
        if SEED in self.cookbooks:
            waits.append(self._seed_pass())
        return min(waits)

    def _current_pass(self) -> float:
        """current generation: fills the status of every due report the hub created here."""
        assert self._reports is not None
        if not self._reports.synced:
            return 0.5
        next_due, _ = self._due_pass(self._reports, self._report_states, self._fill, "report")
        return next_due

    def _due_pass(
        self,
        cache: Informer,
        states: dict[str, _State],
        act: Callable[[Mapping[str, Any], _State], None],
        what: str,
    ) -> tuple[float, dict[str, _State]]:
        """Runs `act` on every cached object that is due; returns the seconds until the next
        one is due and the states of objects no longer in the cache (removed from `states`)."""
        now = time.monotonic()
        present: set[str] = set()
        next_due = 5.0
        for cached in cache.items():
            obj = cached.obj
            name = str(obj["metadata"]["name"])
            present.add(name)
            state = states.setdefault(name, _State())
            if obj["metadata"].get("deletionTimestamp"):
                continue
            if state.due <= now:
                try:
                    act(obj, state)
                except Exception:  # the agent must survive anything one object does
                    _LOG.exception("collection failed", extra={"fields": {what: name}})
                    state.due = time.monotonic() + self._backoff(state)
            next_due = min(next_due, max(0.0, state.due - time.monotonic()))
        gone = {name: states.pop(name) for name in set(states) - present}
        return next_due, gone

    def _fill(self, report: Mapping[str, Any], state: _State) -> None:
        """Queries Prometheus and writes the report's status (what the cookbook's collector
        writes: conditions, workloadsMonitored, lastCollectionTime, collectedMetrics)."""
        meta = report.get("metadata") or {}
        name = str(meta.get("name"))
        url = self.options.prometheus_url or str(
            (report.get("spec") or {}).get("prometheusUrl") or ""
        )
        status, ok, _ = self._query(url, state, int(meta.get("generation") or 0), CURRENT)
        try:
            self.hub.patch_status(CURRENT.reports, self.namespace, name, {"status": status})
        except KubeNotFound:
            return  # the hub side removed it: nothing to report
        except KubeError as exc:
            self.reports.labels("failure").inc()
            _LOG.warning(
                "report not written", extra={"fields": {"report": name, "error": str(exc)}}
            )
            state.due = time.monotonic() + self._backoff(state)
            return
        self.reports.labels("success").inc()
        interval = parse_interval(
            (meta.get("annotations") or {}).get(ANNOTATION_INTERVAL), self.options.default_interval
        )
        if ok:
            state.failures = 0
            state.due = time.monotonic() + interval
        else:
            state.due = time.monotonic() + min(interval, self._backoff(state))

    def _query(
        self, url: str, state: _State, generation: int, cookbook: Cookbook
    ) -> tuple[dict[str, Any], bool, str]:
        """(report status, collected, message) of one Prometheus query, with only the fields
        the generation's report schema keeps."""
        now = datetime.now(UTC)
        try:
            if not url:
                raise PrometheusError("no Prometheus URL: spec.prometheusUrl is empty")
            samples = query_vector(url, QUERY)
        except PrometheusError as exc:
            self.collections.labels("failure").inc()
            state.report_conditions = set_condition(
                state.report_conditions,
                COLLECTED,
                "False",
                "CollectionFailed",
                str(exc),
                generation,
                now,
            )
            return {"conditions": state.report_conditions}, False, str(exc)
        self.collections.labels("success").inc()
        pods = health.pods_from_samples(samples)
        if "podName" in cookbook.metric_fields:
            pods = [p for p in pods if p.pod]  # podName is required there (as the cookbook skips)
        workloads = {(p.namespace, p.workload, p.kind) for p in pods}
        message = f"collected {len(pods)} workload_health series of {len(workloads)} workload(s)"
        state.report_conditions = set_condition(
            state.report_conditions,
            COLLECTED,
            "True",
            "CollectionSucceeded",
            message,
            generation,
            now,
        )
        metrics = []
        for p in pods:
            item = {
                "namespace": p.namespace,
                "workloadName": p.workload,
                "workloadKind": p.kind,
                "podName": p.pod,
                "health": p.healthy,
            }
            metrics.append(
                _without_empty({k: v for k, v in item.items() if k in cookbook.metric_fields})
            )
        status = {
            "conditions": state.report_conditions,
            "workloadsMonitored": len(workloads),
            "lastCollectionTime": format_time(now),
            "collectedMetrics": metrics,
        }
        return status, True, message

    def _seed_pass(self) -> float:
        """seed generation: collects for every due MetricCollector placed on the member."""
        assert self._collectors is not None
        if not self._collectors.synced:
            return 0.5
        next_due, gone = self._due_pass(self._collectors, self._states, self._collect, "collector")
        for name, state in gone.items():
            if state.reported and state.report_namespace:
                self._orphans[name] = state.report_namespace
        for name, namespace in list(self._orphans.items()):
            try:
                self.hub.delete(SEED.reports, namespace, name)
            except KubeNotFound:
                pass
            except KubeError as exc:
                _LOG.info("cannot delete the report yet", extra={"fields": {"error": exc.message}})
                next_due = min(next_due, 2.0)
                continue
            self._orphans.pop(name, None)
            _LOG.info("report deleted", extra={"fields": {"report": f"{namespace}/{name}"}})
        return next_due

    def _interval(self, mc: Mapping[str, Any]) -> float:
        annotations = (mc.get("metadata") or {}).get("annotations") or {}
        return parse_interval(
            annotations.get(ANNOTATION_INTERVAL) or (mc.get("spec") or {}).get("interval"),
            self.options.default_interval,
        )

    def _backoff(self, state: _State) -> float:
        state.failures += 1
        return float(min(self.options.max_backoff, 0.5 * 2 ** min(state.failures, 16)))

    def _collect(self, mc: Mapping[str, Any], state: _State) -> None:
        name = str(mc["metadata"]["name"])
        spec = mc.get("spec") or {}
        now = datetime.now(UTC)
        expected = self.namespace
        namespace = str(spec.get("reportNamespace") or "")
        if namespace != expected:
            message = (
                f"spec.reportNamespace is {namespace!r}, not this cluster's {expected!r}: "
                "the ClusterResourceOverride did not apply; nothing is reported"
            )
            self._set_member(mc, state, COLLECTED, "False", "ReportNamespaceInvalid", message, now)
            state.due = time.monotonic() + self._backoff(state)
            return
        url = self.options.prometheus_url or str(spec.get("prometheusUrl") or "")
        status, collected_ok, collect_message = self._query(url, state, 0, SEED)
        self._set_member(
            mc,
            state,
            COLLECTED,
            "True" if collected_ok else "False",
            "CollectionSucceeded" if collected_ok else "CollectionFailed",
            collect_message,
            now,
        )
        try:
            self._write_report(mc, namespace, url, status)
        except KubeError as exc:
            self.reports.labels("failure").inc()
            message = f"cannot write MetricCollectorReport {namespace}/{name} on the hub: {exc}"
            self._set_member(mc, state, REPORTED, "False", "HubUnavailable", message, now)
            state.due = time.monotonic() + self._backoff(state)
            _LOG.warning("report not written", extra={"fields": {"error": message}})
            return
        self.reports.labels("success").inc()
        state.reported = True
        state.report_namespace = namespace
        self._set_member(
            mc, state, REPORTED, "True", "ReportWritten", f"reported to {namespace}/{name}", now
        )
        if collected_ok:
            state.failures = 0
            state.due = time.monotonic() + self._interval(mc)
        else:
            state.due = time.monotonic() + min(self._interval(mc), self._backoff(state))

    def _write_report(
        self, mc: Mapping[str, Any], namespace: str, url: str, status: dict[str, Any]
    ) -> None:
        """Status merge patch; on 404 create the report (spec.prometheusUrl, the one field of
        the seed schema's spec; labels say which collector and cluster), then patch."""
        name = str(mc["metadata"]["name"])
        try:
            self.hub.patch_status(SEED.reports, namespace, name, {"status": status})
            return
        except KubeNotFound:
            pass
        labels = {
            LABEL_METRIC_COLLECTOR: name,
            LABEL_CLUSTER: self.options.cluster_name,
        }
        managed = ((mc.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED_BY)
        if managed:
            labels[LABEL_MANAGED_BY] = str(managed)
        body = {
            "apiVersion": SEED.reports.api_version,
            "kind": SEED.reports.kind,
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"prometheusUrl": url or "unset"},
        }
        try:
            self.hub.create(SEED.reports, namespace, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
        self.hub.patch_status(SEED.reports, namespace, name, {"status": status})

    def _set_member(
        self,
        mc: Mapping[str, Any],
        state: _State,
        kind: str,
        status: str,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        """Writes a condition on the member's MetricCollector when it changed (not every pass)."""
        current = condition(state.member_conditions, kind) or condition(
            (mc.get("status") or {}).get("conditions"), kind
        )
        same = current is not None and (current.get("status"), current.get("reason")) == (
            status,
            reason,
        )
        if (
            same
            and current is not None
            and (current.get("message") == message or kind == COLLECTED)
        ):
            return
        base = state.member_conditions or list((mc.get("status") or {}).get("conditions") or [])
        generation = int((mc.get("metadata") or {}).get("generation") or 0)
        conds = set_condition(base, kind, status, reason, message, generation, now)
        name = str(mc["metadata"]["name"])
        try:
            self.member.patch_status(
                METRIC_COLLECTORS,
                "",
                name,
                {"status": {"conditions": conds, "observedGeneration": generation}},
            )
        except KubeError as exc:
            _LOG.info("cannot write the collector status", extra={"fields": {"error": str(exc)}})
            return
        state.member_conditions = conds


def _without_empty(item: dict[str, Any]) -> dict[str, Any]:
    """Optional string fields left out when empty (a series without workload_kind)."""
    return {k: v for k, v in item.items() if v != ""}


def build_parser() -> argparse.ArgumentParser:
    """The command line of fleet-metric-collector."""
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="fleet-metric-collector",
        description="Report the member's workload_health (local Prometheus) to the KubeFleet hub.",
    )
    parser.add_argument(
        "--cluster-name",
        default=env.get("MEMBER_CLUSTER_NAME", ""),
        help="this member's MemberCluster name (default: $MEMBER_CLUSTER_NAME)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        metavar="FILE",
        help="the member cluster's kubeconfig (default: in-cluster config, then ~/.kube/config)",
    )
    parser.add_argument(
        "--hub-kubeconfig", default=None, metavar="FILE", help="a kubeconfig of the hub"
    )
    parser.add_argument(
        "--hub-url",
        default=env.get("HUB_SERVER_URL") or None,
        metavar="URL",
        help="the hub apiserver URL (default: $HUB_SERVER_URL)",
    )
    parser.add_argument(
        "--hub-token-file",
        default=env.get("HUB_TOKEN_FILE", "/var/run/secrets/hub/token"),
        metavar="FILE",
        help="bearer token for the hub, re-read before each request (a mounted Secret key; "
        "default: $HUB_TOKEN_FILE or /var/run/secrets/hub/token)",
    )
    parser.add_argument(
        "--hub-ca-file",
        default=env.get("HUB_CA_FILE") or None,
        metavar="FILE",
        help="CA bundle of the hub apiserver (default: $HUB_CA_FILE)",
    )
    parser.add_argument(
        "--prometheus-url",
        default=env.get("PROMETHEUS_URL") or None,
        metavar="URL",
        help="query this Prometheus instead of each MetricCollector's spec.prometheusUrl",
    )
    parser.add_argument(
        "--default-interval",
        type=float,
        default=_DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="collection interval when a MetricCollector gives none (default 30)",
    )
    parser.add_argument(
        "--max-backoff",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait between retries during an outage (default 60)",
    )
    parser.add_argument(
        "--metrics-addr", default="", metavar="HOST:PORT", help="serve the agent's metrics here"
    )
    parser.add_argument(
        "--cookbook",
        choices=COOKBOOK_CHOICES,
        default=env.get("COOKBOOK", "auto"),
        help="current: fill the reports the hub creates (autoapprove.kubernetes-fleet.io); "
        "seed: report for the MetricCollectors placed here (metric.kubernetes-fleet.io); "
        "both: the two side by side; auto: current when the hub serves its reports to this "
        "agent, else seed (default)",
    )
    parser.add_argument("--debug", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the agent until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    configure_logging(args.debug)
    registry = CollectorRegistry()
    try:
        agent = MetricCollectorAgent(
            CollectorOptions(
                cluster_name=args.cluster_name,
                member_kubeconfig=args.kubeconfig,
                hub_kubeconfig=args.hub_kubeconfig,
                hub_url=None if args.hub_kubeconfig else args.hub_url,
                hub_token_file=args.hub_token_file,
                hub_ca_file=args.hub_ca_file,
                prometheus_url=args.prometheus_url,
                default_interval=args.default_interval,
                max_backoff=args.max_backoff,
                cookbook=args.cookbook,
                registry=registry,
            )
        )
        if args.metrics_addr:
            host, _, port = args.metrics_addr.rpartition(":")
            if not port.isdigit():
                raise ValueError(f"--metrics-addr: {args.metrics_addr!r} is not HOST:PORT")
            start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    except (ValueError, OSError) as exc:
        print(f"fleet-metric-collector: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    agent.start()
    _LOG.info(
        "metric collector running",
        extra={"fields": {"cluster": args.cluster_name, "hub": agent.hub.server}},
    )
    stop.wait()
    agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
