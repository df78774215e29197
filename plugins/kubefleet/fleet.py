"""The KubeFleet hub as the contract sees it: gates, workload health, inventory and taints.

KubeFleetHub is what the gRPC servicers call. Everything it reads comes from watch caches
(approval requests, update runs, trackers, MemberClusters, reports, and the objects it
created), so a gate evaluation costs the hub no request in steady state. One reconcile thread,
woken by any cache change and by a short tick, turns approval requests into gates (before-stage
and after-stage ones decide on different clusters, see gates.readiness), publishes their changes
to WatchGates streams, keeps what health data needs per pending tracked gate (current cookbook:
the hub-created MetricCollectorReports; seed: a MetricCollector, its placements and a slot in a
shared override; collection.py) and removes it once the gate is resolved or gone, writes what it
sees about the stage's workloads onto the approval request (condition and Event), and follows
service-out / service-in operations (members.py) until the cache shows the taint.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, gate_pb2, health_pb2
from plugins.kubefleet import collection, health, inventory
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet.backoff import WriteBackoff
from plugins.kubefleet.collection import collector_names
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.members import Members
from plugins.kubefleet.objects import (
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CLUSTER_RESOURCE_OVERRIDES,
    CLUSTER_RESOURCE_PLACEMENTS,
    CLUSTER_STAGED_UPDATE_RUNS,
    COOKBOOKS,
    CURRENT,
    EVENTS_NAMESPACE,
    LABEL_MANAGED_BY,
    LABEL_METRIC_COLLECTOR,
    MANAGED_BY,
    MANAGED_SELECTOR,
    MEMBER_CLUSTERS,
    METRIC_COLLECTORS,
    REPORT_SELECTOR,
    SEED,
    STAGED_UPDATE_RUNS,
    Cookbook,
    condition,
    format_time,
    generation,
    member_namespace,
    set_condition,
)
from plugins.kubefleet.prometheus import PrometheusError, escape_label_value, query_vector
from plugins.sdk import (
    FailedPrecondition,
    Informer,
    Kube,
    KubeConflict,
    KubeError,
    KubeNotFound,
    NotFound,
    Resource,
    Unavailable,
)

__all__ = [
    "HEALTH_CONDITION",
    "KubeFleetHub",
    "collector_names",
    "resolve_cookbook",
]

_LOG = logging.getLogger("plugins.kubefleet.fleet")

HEALTH_CONDITION = "fleetupgrade.io/WorkloadsHealthy"
"""The condition this plugin writes on approval requests: what it sees of the stage's workloads."""

_COMPONENT = MANAGED_BY
_RETRIES = 6
_WAKE_SECONDS = 1.0
_TICK_SECONDS = 1.0
_PENDING = gate_pb2.GATE_STATE_PENDING


@dataclass
class _View:
    """One approval request as a gate, with what this plugin has to say about it."""

    ref: gatelib.GateRef
    obj: dict[str, Any]
    state: int
    tracked: bool = False
    clusters: list[str] = field(default_factory=list)
    workloads: list[health_pb2.Workload] = field(default_factory=list)
    extra: Any = None
    status: str = "Unknown"
    reason: str = ""
    message: str = ""
    collect_on: list[str] = field(default_factory=list)
    """The clusters whose health data the gate needs (also while it is blocked)."""
    blocked: str = ""
    """Why the gate cannot be decided yet (its preconditions); "" when it can."""

    @property
    def checkable(self) -> bool:
        """Pending, tracked, with clusters and workloads: health can be looked at."""
        return self.state == _PENDING and self.tracked and bool(self.clusters and self.workloads)

    def gate(self) -> gate_pb2.Gate:
        out = gate_pb2.Gate(
            id=self.ref.id,
            run=self.ref.run,
            stage=self.ref.stage,
            cluster_ids=self.clusters,
            workloads=self.workloads,
            state=self.state,  # type: ignore[arg-type]
            message=self.message,
            tracked=self.tracked,
        )
        if self.extra is not None:
            out.extra_health_checks.CopyFrom(self.extra)
        created = gatelib.create_time(self.obj)
        if created is not None:
            out.create_time.FromDatetime(created)
        return out


class _GateWatcher:
    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[gate_pb2.WatchGatesResponse | None] = queue.SimpleQueue()


def resolve_cookbook(kube: Kube, choice: str, attempts: int = 5) -> Cookbook:
    """The cookbook generation to serve: the one chosen, or with "auto" the one whose trackers
    the hub serves (current first). ValueError when the hub serves neither (or is unreachable
    for every attempt), naming the fix."""
    if choice != "auto":
        return COOKBOOKS[choice]
    last = ""
    for attempt in range(attempts):
        try:
            for cookbook in (CURRENT, SEED):
                try:
                    kube.list(cookbook.cluster_trackers)
                except KubeNotFound:
                    continue
                return cookbook
        except KubeError as exc:
            last = exc.message
            time.sleep(min(2.0, 0.25 * 2**attempt))
            continue
        raise ValueError(
            "--cookbook auto: the hub serves neither ClusterStagedWorkloadTrackers of "
            f"{CURRENT.group} (the cookbook) nor of {SEED.group} (the tutorial); install the "
            "cookbook's CRDs on the hub, or pass --cookbook current|seed"
        )
    raise ValueError(
        f"--cookbook auto: cannot ask the hub which cookbook API it serves ({last}); "
        "check --kubeconfig, or pass --cookbook current|seed"
    )


def _hub_unavailable(action: str, exc: KubeError) -> Unavailable:
    return Unavailable(f"hub: cannot {action}: {exc.message}; retry")


def _what_decides(ref: gatelib.GateRef, ready: gatelib.Readiness) -> str:
    """The start of a gate's message: which clusters decide it, and on which version."""
    if ref.task == gatelib.AFTER_STAGE:
        return f"after-stage: stage {ref.stage} updated; "
    if ready.baseline:
        return (
            f"before-stage go/no-go of the first stage {ref.stage} (baseline: nothing updated "
            "yet, its clusters checked on the current version; the update itself is verified "
            "by the after-stage gate): "
        )
    return f"before-stage go/no-go of {ref.stage}: the clusters already updated by the run: "


def _regex_union(values: Sequence[str]) -> str:
    return "|".join(escape_label_value(re.escape(v)) for v in sorted(set(values)))


class KubeFleetHub:
    """One KubeFleet hub: caches, the reconcile thread, and the operations it starts."""

    def __init__(self, cfg: KubeFleetConfig, kube: Kube, cookbook: Cookbook) -> None:
        self.cfg = cfg
        self.cookbook = cookbook
        self._kube = kube
        self._reports_mode = cfg.health_source == "reports"
        self._seed = cookbook.collectors is not None
        self._wake = threading.Event()
        self._stop = threading.Event()
        wake = self._wake.set
        self._requests = {
            CLUSTER_APPROVAL_REQUESTS: Informer(kube, CLUSTER_APPROVAL_REQUESTS, on_change=wake),
            APPROVAL_REQUESTS: Informer(kube, APPROVAL_REQUESTS, on_change=wake),
        }
        self._runs = {
            CLUSTER_STAGED_UPDATE_RUNS: Informer(kube, CLUSTER_STAGED_UPDATE_RUNS, on_change=wake),
            STAGED_UPDATE_RUNS: Informer(kube, STAGED_UPDATE_RUNS, on_change=wake),
        }
        self._trackers = {
            res: Informer(kube, res, on_change=wake)
            for res in (cookbook.cluster_trackers, cookbook.staged_trackers)
        }
        self._members = Informer(kube, MEMBER_CLUSTERS, on_change=wake)
        self._writes = WriteBackoff()
        self.members = Members(cfg, kube, self._members, wake, self._writes)
        self._owned: dict[Resource, Informer] = {}
        self._reports: Informer | None = None
        if self._reports_mode:
            # seed: the reports our agent writes (it labels them); current: those we create.
            selector = REPORT_SELECTOR if self._seed else MANAGED_SELECTOR
            self._reports = Informer(
                kube, cookbook.reports, label_selector=selector, on_change=wake
            )
            if self._seed:
                for res in (
                    METRIC_COLLECTORS,
                    CLUSTER_RESOURCE_OVERRIDES,
                    CLUSTER_RESOURCE_PLACEMENTS,
                ):
                    self._owned[res] = Informer(
                        kube, res, label_selector=MANAGED_SELECTOR, on_change=wake
                    )
        self._published: dict[str, gate_pb2.Gate] = {}
        self._views: dict[str, _View] = {}
        self._gates_lock = threading.Lock()
        self._watchers: list[_GateWatcher] = []
        self._closed = False
        self._health_memo: dict[str, tuple[float, tuple[Any, ...], bool, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._loop_error = ""
        self._unplaced: list[str] = []
        self._passes = 0
        self._thread = threading.Thread(target=self._loop, name="kubefleet-reconcile", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def _informers(self) -> list[Informer]:
        found = [
            *self._requests.values(),
            *self._runs.values(),
            *self._trackers.values(),
            self._members,
            *self._owned.values(),
        ]
        if self._reports is not None:
            found.append(self._reports)
        return found

    @property
    def kube(self) -> Kube:
        """The hub adapter (its request counters are read by benchmarks)."""
        return self._kube

    def start(self) -> None:
        """Starts the watch caches and the reconcile thread."""
        for informer in self._informers:
            informer.start()
        self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        deadline = time.monotonic() + timeout
        return all(
            informer.wait_synced(max(0.0, deadline - time.monotonic()))
            for informer in self._informers
        )

    def close_streams(self) -> None:
        """Ends open WatchOperations and WatchGates streams (a server stop callback)."""
        self.members.close_streams()
        with self._gates_lock:
            self._closed = True
            for watcher in self._watchers:
                watcher.queue.put(None)
            self._watchers.clear()

    def close(self) -> None:
        """Ends streams and threads and releases the hub connection."""
        self._stop.set()
        self._wake.set()
        self.close_streams()
        for informer in self._informers:
            informer.stop(timeout=0)  # all at once; their daemon threads end on their own
        self._kube.close()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        for informer in self._informers:
            if not informer.synced:
                reason = informer.last_error or "first list in progress"
                return False, f"{informer.resource} not listed yet: {reason}"
            if not informer.healthy:
                return False, f"{informer.resource} watch failing: {informer.last_error}"
        return True, ""

    def _require_synced(self) -> None:
        for informer in self._informers:
            if not informer.synced:
                reason = informer.last_error or "the first list is in progress"
                raise Unavailable(f"hub: {informer.resource} not listed yet ({reason}); retry")
        self.members.restore()

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- inventory and operations (members.py) -----------------------------------------------

    def _member(self, cluster_id: str) -> dict[str, Any]:
        return self.members.member(cluster_id)

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of MemberClusters, ordered by name, from the watch cache."""
        self._require_synced()
        return self.members.list_clusters(page_size, page_token, match_labels)

    def get_cluster(self, cluster_id: str) -> cluster_pb2.Cluster:
        """One MemberCluster from the watch cache."""
        self._require_synced()
        return self.members.get_cluster(cluster_id)

    def service_out(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Adds our NoSchedule taint; the operation succeeds when the cache shows it."""
        self._require_synced()
        return self.members.taint_operation(request_id, cluster_id, add=True)

    def service_in(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Removes our taint (never another); succeeds when the cache shows it gone."""
        self._require_synced()
        return self.members.taint_operation(request_id, cluster_id, add=False)

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation's current state (also of operations recorded before a restart)."""
        return self.members.get_operation(op_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Every update of the clusters' operations until the caller cancels."""
        return self.members.watch_operations(cluster_ids, include_in_flight, context)

    # -- workload health ---------------------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), clusters in request order."""
        self._require_synced()
        for cluster_id in cluster_ids:
            self._member(cluster_id)
        return self._verdicts(cluster_ids, workloads, datetime.now(UTC))

    def _verdicts(
        self,
        cluster_ids: Sequence[str],
        workloads: Sequence[health_pb2.Workload],
        now: datetime,
    ) -> list[health_pb2.WorkloadResult]:
        updated = self._updated_times()
        if self._reports_mode:
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
        runs = [c.obj for informer in self._runs.values() for c in informer.items()]
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
        assert self._reports is not None
        reports = [c.obj for c in self._reports.in_namespace(member_namespace(cluster_id))]
        if not reports:
            why = (
                f"no MetricCollectorReport in {member_namespace(cluster_id)} yet "
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

    # -- gates: the view -----------------------------------------------------------------------

    def _view(self, ref: gatelib.GateRef, obj: dict[str, Any], now: datetime) -> _View:
        view = _View(ref, obj, gatelib.approval_state(obj))
        tracker_res = ref.tracker_resource(self.cookbook)
        tracker = self._trackers[tracker_res].get(ref.namespace, ref.run_name)
        run = self._runs[ref.run_resource].get(ref.namespace, ref.run_name)
        if tracker is not None:
            view.tracked = True
            view.workloads = gatelib.tracked_workloads(tracker.obj)
            view.extra = gatelib.extra_checks(tracker.obj)
        ready = gatelib.readiness(run.obj, ref) if run is not None else None
        if ready is not None:
            view.collect_on = list(ready.clusters)
            view.clusters = [] if ready.blocked_reason else list(ready.clusters)
        approved = condition((obj.get("status") or {}).get("conditions"), gatelib.APPROVED)
        if view.state == gate_pb2.GATE_STATE_APPROVED:
            view.message = "approved" + (
                f": {approved.get('message')}" if approved and approved.get("message") else ""
            )
            return view
        if view.state == gate_pb2.GATE_STATE_REJECTED:
            view.message = "rejected" + (
                f": {approved.get('message')}" if approved and approved.get("message") else ""
            )
            return view
        tracker_name = f"{ref.namespace}/{ref.run_name}" if ref.namespace else ref.run_name
        touched = [*ready.clusters, *ready.stage_clusters] if ready else []
        unavailable = self._unavailable(list(dict.fromkeys(touched)), ref)
        if tracker is None:
            view.status, view.reason = "False", "NoWorkloadTracker"
            view.message = (
                f"no {tracker_res.kind} {tracker_name} ({tracker_res.group}) for update run "
                f"{ref.run}: this stage is never approved automatically; create a "
                f"{tracker_res.kind} named like the run listing the workloads to check"
            )
        elif run is None or ready is None:
            view.status, view.reason = "Unknown", "UpdateRunNotFound"
            view.message = f"update run {ref.run} not found"
        elif ready.blocked_reason:
            view.status = "Unknown" if ready.blocked_reason == "StageNotFound" else "False"
            view.reason, view.message = ready.blocked_reason, ready.blocked_message
            view.blocked = ready.blocked_message
        elif unavailable:
            view.status, view.reason = "False", "ClusterUnavailable"
            view.message = unavailable
            view.blocked = unavailable
            view.clusters = []
        elif not view.clusters:
            view.status, view.reason = "False", "StageHasNoClusters"
            view.message = (
                f"stage {ref.stage} has no clusters: nothing to check, so it is never approved "
                "automatically; approve it by hand if that is intended"
            )
        elif not view.workloads:
            view.status, view.reason = "False", "NoWorkloadsTracked"
            view.message = (
                f"{tracker_res.kind} {tracker_name} lists no workloads: nothing to check, so the "
                "stage is never approved automatically"
            )
        else:
            healthy, summary = self._stage_health(view, now)
            view.status = "True" if healthy else "False"
            view.reason = "AllWorkloadsHealthy" if healthy else "WorkloadsNotHealthy"
            view.message = _what_decides(ref, ready) + summary
        return view

    def _unavailable(self, clusters: Sequence[str], ref: gatelib.GateRef) -> str:
        """For a before-stage gate: why a cluster it will update (or decide on) is not
        available (MemberCluster joined, agent healthy); "" when all are."""
        if ref.task != gatelib.BEFORE_STAGE:
            return ""
        for cluster_id in clusters:
            cached = self._members.get("", cluster_id)
            if cached is None:
                return f"before-stage go/no-go: no MemberCluster named {cluster_id}"
            available, why = inventory.availability(cached.obj, self.cfg.heartbeat_timeout)
            if not available:
                return f"before-stage go/no-go: {cluster_id} is not available: {why}"
        return ""

    def _stage_health(self, view: _View, now: datetime) -> tuple[bool, str]:
        """(all healthy, summary) of the view's workloads on its clusters.

        From the caches every pass in reports mode; in prometheus mode at most once per
        evaluate_interval per gate (or when the clusters or workloads change).
        """
        inputs = (tuple(view.clusters), tuple(w.SerializeToString() for w in view.workloads))
        memo = self._health_memo.get(view.ref.id)
        stamp = time.monotonic()
        if (
            not self._reports_mode
            and memo is not None
            and memo[1] == inputs
            and stamp - memo[0] < self.cfg.evaluate_interval
        ):
            return memo[2], memo[3]
        known = [c for c in view.clusters if self._members.get("", c) is not None]
        gone = [c for c in view.clusters if c not in known]
        results = self._verdicts(known, view.workloads, now) if known else []
        healthy, summary = health.summarize(results)
        if gone:
            healthy = False
            summary = f"no MemberCluster named {', '.join(gone)}; " + summary
        self._health_memo[view.ref.id] = (stamp, inputs, healthy, summary)
        return healthy, summary

    def _all_views(self, now: datetime) -> dict[str, _View]:
        views: dict[str, _View] = {}
        for res, informer in self._requests.items():
            for cached in informer.items():
                if not gatelib.is_latest(cached.obj):
                    continue
                ref = gatelib.ref_of(res, cached.obj)
                if ref is None:
                    continue
                views[ref.id] = self._view(ref, cached.obj, now)
        return views

    # -- gates: RPCs ---------------------------------------------------------------------------

    def list_gates(self) -> list[gate_pb2.Gate]:
        """Every gate (pending first, then by id), computed from the caches now."""
        self._require_synced()
        views = self._all_views(datetime.now(UTC))
        gates = [v.gate() for v in views.values()]
        return sorted(gates, key=lambda g: (g.state != _PENDING, g.id))

    def watch_gates(self, context: grpc.ServicerContext) -> Iterator[gate_pb2.WatchGatesResponse]:
        """Every pending gate, then each change, until the caller cancels."""
        self._require_synced()
        watcher = _GateWatcher()
        with self._gates_lock:
            if self._closed:
                return
            if not self._published:
                self._publish_locked(self._all_views(datetime.now(UTC)))
            initial = [g for _, g in sorted(self._published.items()) if g.state == _PENDING]
            self._watchers.append(watcher)
        context.add_callback(lambda: watcher.queue.put(None))
        upserted = gate_pb2.GATE_EVENT_TYPE_UPSERTED
        try:
            for gate in initial:
                yield gate_pb2.WatchGatesResponse(type=upserted, gate=gate)
            while context.is_active():
                try:
                    item = watcher.queue.get(timeout=_WAKE_SECONDS)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item
        finally:
            with self._gates_lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    def _publish_locked(self, views: Mapping[str, _View]) -> None:
        fresh = {gate_id: view.gate() for gate_id, view in views.items()}
        events = []
        for gate_id, gate in sorted(fresh.items()):
            if self._published.get(gate_id) != gate:
                events.append(
                    gate_pb2.WatchGatesResponse(type=gate_pb2.GATE_EVENT_TYPE_UPSERTED, gate=gate)
                )
        for gate_id in sorted(set(self._published) - set(fresh)):
            events.append(
                gate_pb2.WatchGatesResponse(
                    type=gate_pb2.GATE_EVENT_TYPE_DELETED, gate=self._published[gate_id]
                )
            )
        self._published = fresh
        self._views = dict(views)
        for event in events:
            for watcher in self._watchers:
                watcher.queue.put(event)

    def resolve_gate(self, gate_id: str, decision: int, reason: str) -> gate_pb2.Gate:
        """Approve: Approved=True (observedGeneration, reason); reject: Approved=False."""
        self._require_synced()
        parsed = gatelib.parse_gate_id(gate_id)
        if parsed is None:
            raise NotFound(f"gate {gate_id} not found: not a gate id of this plugin")
        res, namespace, name = parsed
        approve = decision == gate_pb2.GATE_DECISION_APPROVE
        with self._lock_for(gate_id):
            for _ in range(_RETRIES):
                try:
                    obj = self._kube.get(res, namespace, name)
                except KubeNotFound:
                    raise NotFound(f"gate {gate_id} not found: the {res.kind} is gone") from None
                except KubeError as exc:
                    raise _hub_unavailable(f"read {res.kind} {name}", exc) from exc
                ref = gatelib.ref_of(res, obj)
                if ref is None:
                    raise NotFound(f"gate {gate_id} not found: its spec names no run or stage")
                now = datetime.now(UTC)
                view = self._view(ref, obj, now)
                state = view.state
                wanted = gate_pb2.GATE_STATE_APPROVED if approve else gate_pb2.GATE_STATE_REJECTED
                if state == wanted:
                    return view.gate()
                if state != _PENDING:
                    now_is = "approved" if state == gate_pb2.GATE_STATE_APPROVED else "rejected"
                    raise FailedPrecondition(
                        f"gate {gate_id} is {now_is} already; it cannot be "
                        f"{'approved' if approve else 'rejected'} now"
                    )
                if approve and not view.tracked:
                    raise FailedPrecondition(
                        f"gate {gate_id}: {view.message}; the plugin never approves an "
                        "untracked stage"
                    )
                if approve and view.blocked:
                    raise FailedPrecondition(
                        f"gate {gate_id} cannot be approved yet: {view.blocked}"
                    )
                if approve and ref.task == gatelib.BEFORE_STAGE:
                    reason = f"before-stage go: {reason}"
                conds = set_condition(
                    (obj.get("status") or {}).get("conditions"),
                    gatelib.APPROVED,
                    "True" if approve else "False",
                    gatelib.APPROVED_REASON if approve else gatelib.REJECTED_REASON,
                    reason,
                    generation(obj),
                    now,
                )
                body = {
                    "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                    "status": {"conditions": conds},
                }
                try:
                    written = self._kube.patch_status(res, namespace, name, body)
                except KubeConflict:
                    continue
                except KubeNotFound:
                    raise NotFound(f"gate {gate_id} not found: the {res.kind} is gone") from None
                except KubeError as exc:
                    raise _hub_unavailable(f"write {res.kind} {name}", exc) from exc
                self._event(
                    res,
                    written,
                    "Approved" if approve else "Rejected",
                    reason,
                    warning=not approve,
                )
                self._wake.set()
                return self._view(ref, written, now).gate()
        raise Unavailable(f"hub: {res.kind} {name} kept changing while resolving it; retry")

    # -- the reconcile thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_TICK_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.members.follow_operations()
                if all(informer.synced for informer in self._informers):
                    self.reconcile_once()
                self._loop_error = ""
            except Exception as exc:  # the loop must survive anything one object does to it
                if str(exc) != self._loop_error:
                    _LOG.exception("reconcile failed; trying again")
                self._loop_error = str(exc)

    @property
    def passes(self) -> int:
        """Reconcile passes completed so far (tests wait on it instead of sleeping)."""
        return self._passes

    def reconcile_once(self) -> None:
        """One pass: publish gate changes, keep per-gate objects, write what we see."""
        self._passes += 1
        now = datetime.now(UTC)
        views = self._all_views(now)
        with self._gates_lock:
            self._publish_locked(views)
        for gate_id in set(self._health_memo) - set(views):
            self._health_memo.pop(gate_id, None)
        pending = [v for v in views.values() if v.state == _PENDING]
        if self._reports_mode:
            collecting = [v for v in pending if v.tracked and v.collect_on]
            if self._seed:
                wanted = self._ensure_seed_collection(collecting)
            else:
                wanted = self._ensure_reports(collecting)
            self._collect_garbage(wanted)
        for view in pending:
            self._note(view, now)

    def _note(self, view: _View, now: datetime) -> None:
        """Writes our condition on the approval request when what we see changed (+ Event)."""
        obj = view.obj
        current = condition((obj.get("status") or {}).get("conditions"), HEALTH_CONDITION)
        if current is not None and (
            current.get("status"),
            current.get("reason"),
            current.get("message"),
        ) == (view.status, view.reason, view.message):
            return
        key = f"note/{view.ref.id}"
        if not self._writes.may_write(key):
            return
        res = view.ref.request
        conds = set_condition(
            (obj.get("status") or {}).get("conditions"),
            HEALTH_CONDITION,
            view.status,
            view.reason,
            view.message,
            generation(obj),
            now,
        )
        body = {
            "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
            "status": {"conditions": conds},
        }
        try:
            written = self._kube.patch_status(res, view.ref.namespace, view.ref.name, body)
        except (KubeConflict, KubeNotFound):
            return  # the cache will bring the newer object (or its deletion) next pass
        except KubeError as exc:
            self._writes.failed(key, "write the workload condition", exc)
            return
        self._writes.succeeded(key)
        warning = view.status != "True"
        self._event(res, written, view.reason, view.message, warning=warning)

    def _event(
        self, res: Resource, obj: Mapping[str, Any], reason: str, message: str, *, warning: bool
    ) -> None:
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "") or EVENTS_NAMESPACE
        stamp = format_time(datetime.now(UTC))
        involved = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        }
        if res.namespaced:
            involved["namespace"] = namespace
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name')}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason[:128],
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": _COMPONENT},
            "reportingComponent": _COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._kube.create_event(namespace, body)
        except KubeError as exc:
            _LOG.info("event not recorded", extra={"fields": {"error": exc.message}})

    # -- per-gate MetricCollector propagation ---------------------------------------------------

    def _ensure(self, res: Resource, namespace: str, body: dict[str, Any]) -> None:
        """Creates the object, or patches its spec, labels and annotations when the cached one
        does not carry them (fields the server defaulted or added are fine: no re-patch)."""
        name = body["metadata"]["name"]
        key = f"{res.kind}/{namespace}/{name}"
        informer = self._reports if res == self.cookbook.reports else self._owned[res]
        assert informer is not None
        cached = informer.get(namespace, name)
        if cached is not None and cached.obj["metadata"].get("deletionTimestamp"):
            return  # being deleted: created again once it is gone
        meta = body["metadata"]
        wanted = {
            "spec": body["spec"],
            "metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
        }
        if cached is not None and _covers(cached.obj, wanted):
            self._writes.succeeded(key)
            return
        if not self._writes.may_write(key):
            return
        try:
            if cached is None:
                self._kube.create(res, namespace, body)
            else:
                version = cached.obj["metadata"]["resourceVersion"]
                patch = {**wanted, "metadata": {**wanted["metadata"], "resourceVersion": version}}
                self._kube.merge_patch(res, namespace, name, patch)
        except KubeConflict:
            return  # exists already / changed meanwhile: the cache brings it next pass
        except KubeError as exc:
            self._writes.failed(key, f"write the {res.kind}", exc)
            return
        self._writes.succeeded(key)

    def _ensure_reports(self, views: Sequence[_View]) -> set[tuple[Resource, str, str]]:
        """current cookbook: the gates' MetricCollectorReports, one per cluster to collect on."""
        wanted: set[tuple[Resource, str, str]] = set()
        for view in views:
            for res, namespace, body in collection.report_bodies(
                view.ref,
                view.obj,
                view.collect_on,
                self.cookbook,
                self.cfg.member_prometheus_url,
                self.cfg.collect_interval,
            ):
                wanted.add((res, namespace, body["metadata"]["name"]))
                self._ensure(res, namespace, body)
        return wanted

    def _ensure_seed_collection(self, views: Sequence[_View]) -> set[tuple[Resource, str, str]]:
        """seed cookbook: per gate a MetricCollector and its placements, and the shared
        overrides (a collector's placements are created once its override selects it)."""
        wanted: set[tuple[Resource, str, str]] = set()
        bodies = {}
        for view in views:
            collector, placements = collection.seed_bodies(
                view.ref,
                view.obj,
                view.collect_on,
                self.cfg.member_prometheus_url,
                self.cfg.collect_interval,
            )
            bodies[collector["metadata"]["name"]] = (collector, placements)
        current = {
            str(c.obj["metadata"]["name"]): collection.selected_collectors(c.obj)
            for c in self._owned[CLUSTER_RESOURCE_OVERRIDES].items()
        }
        plan, unplaced = collection.plan_overrides(current, sorted(bodies), self.cfg.max_overrides)
        if unplaced and unplaced != self._unplaced:
            _LOG.warning(
                f"{len(unplaced)} MetricCollector(s) wait for room: the "
                f"{self.cfg.max_overrides} ClusterResourceOverrides this plugin may use "
                "(--max-overrides) are full",
                extra={"fields": {"waiting": ", ".join(unplaced[:5])}},
            )
        self._unplaced = unplaced
        for name, collectors in sorted(plan.items()):
            wanted.add((CLUSTER_RESOURCE_OVERRIDES, "", name))
            self._ensure(CLUSTER_RESOURCE_OVERRIDES, "", collection.override_body(name, collectors))
        selected = {c for names in current.values() for c in names}
        for mc, (collector, placements) in sorted(bodies.items()):
            if mc in unplaced:
                continue
            wanted.add((METRIC_COLLECTORS, "", mc))
            self._ensure(METRIC_COLLECTORS, "", collector)
            for placement in placements:
                wanted.add((CLUSTER_RESOURCE_PLACEMENTS, "", placement["metadata"]["name"]))
                if mc in selected:  # the override is in place: the first rollout has it
                    self._ensure(CLUSTER_RESOURCE_PLACEMENTS, "", placement)
        return wanted

    def _collect_garbage(self, wanted: set[tuple[Resource, str, str]]) -> None:
        """Deletes our objects that no pending tracked gate needs (placements first), and the
        reports of our MetricCollectors that no longer exist (the agent copies the collector's
        managed-by label onto its report)."""
        assert self._reports is not None
        if not self._seed:
            for cached in self._reports.items():
                meta = cached.obj["metadata"]
                key = (self.cookbook.reports, str(meta["namespace"]), str(meta["name"]))
                if key not in wanted and not meta.get("deletionTimestamp"):
                    self._delete(self.cookbook.reports, key[1], key[2])
            return
        for res in (CLUSTER_RESOURCE_PLACEMENTS, CLUSTER_RESOURCE_OVERRIDES, METRIC_COLLECTORS):
            for cached in self._owned[res].items():
                meta = cached.obj["metadata"]
                if (res, "", meta["name"]) in wanted or meta.get("deletionTimestamp"):
                    continue
                self._delete(res, "", meta["name"])
        collectors = {c.obj["metadata"]["name"] for c in self._owned[METRIC_COLLECTORS].items()}
        for cached in self._reports.items():
            meta = cached.obj["metadata"]
            labels = meta.get("labels") or {}
            if (
                labels.get(LABEL_MANAGED_BY) != MANAGED_BY  # a report of someone else's collector
                or labels.get(LABEL_METRIC_COLLECTOR, "") in collectors
                or meta.get("deletionTimestamp")
            ):
                continue
            self._delete(self.cookbook.reports, meta["namespace"], meta["name"])

    def _delete(self, res: Resource, namespace: str, name: str) -> None:
        key = f"{res.kind}/{namespace}/{name}"
        if not self._writes.may_write(key):
            return
        try:
            self._kube.delete(res, namespace, name)
        except KubeNotFound:
            pass
        except KubeError as exc:
            self._writes.failed(key, f"delete the {res.kind}", exc)
            return
        self._writes.succeeded(key)


def _covers(current: Any, wanted: Any) -> bool:
    """True when current carries every field of wanted with the same value; fields the server
    added (defaults such as a selector's selectionScope) are allowed, in lists item by item."""
    if isinstance(wanted, Mapping):
        return isinstance(current, Mapping) and all(
            _covers(current.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_covers(c, w) for c, w in zip(current, wanted, strict=True))
        )
    return bool(current == wanted)
