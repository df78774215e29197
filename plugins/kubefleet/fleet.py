"""The KubeFleet hub as the contract sees it: gates, workload health, inventory and taints.

KubeFleetHub is what the gRPC servicers call. Everything it reads comes from watch caches
(approval requests, update runs, trackers, MemberClusters, reports, and the objects it
created), so a gate evaluation costs the hub no request in steady state. One reconcile thread,
woken by any cache change and by a short tick, turns approval requests into gates, publishes
their changes to WatchGates streams, keeps a MetricCollector + ClusterResourceOverride + PickFixed
ClusterResourcePlacement per pending tracked gate (and removes them once the gate is approved
or gone), writes what it sees about the stage's workloads onto the approval request (condition
and Event), and follows service-out / service-in operations until the cache shows the taint.
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
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet import health, inventory
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.objects import (
    ANNOTATION_GATE,
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CLUSTER_RESOURCE_OVERRIDES,
    CLUSTER_RESOURCE_PLACEMENTS,
    CLUSTER_STAGED_UPDATE_RUNS,
    CLUSTER_TRACKERS,
    EVENTS_NAMESPACE,
    LABEL_MANAGED_BY,
    LABEL_METRIC_COLLECTOR,
    MANAGED_BY,
    MANAGED_SELECTOR,
    MEMBER_CLUSTERS,
    METRIC_COLLECTOR_REPORTS,
    METRIC_COLLECTORS,
    METRIC_GROUP,
    METRIC_VERSION,
    REPORT_SELECTOR,
    STAGED_TRACKERS,
    STAGED_UPDATE_RUNS,
    condition,
    format_time,
    generation,
    member_namespace,
    name_with_limit,
    set_condition,
)
from plugins.kubefleet.prometheus import PrometheusError, escape_label_value, query_vector
from plugins.sdk.errors import FailedPrecondition, NotFound, Unavailable
from plugins.sdk.kube import Kube, KubeConflict, KubeError, KubeNotFound, Resource
from plugins.sdk.kubecache import Informer
from plugins.sdk.operations import OperationStore
from plugins.sdk.validate import check_page_size, decode_page_token, encode_page_token

__all__ = [
    "HEALTH_CONDITION",
    "PICK_FIXED_MAX",
    "REPORT_NAMESPACE_TEMPLATE",
    "KubeFleetHub",
    "collection_objects",
    "collector_names",
]

_LOG = logging.getLogger("plugins.kubefleet.fleet")

HEALTH_CONDITION = "fleetupgrade.io/WorkloadsHealthy"
"""The condition this plugin writes on approval requests: what it sees of the stage's workloads."""

REPORT_NAMESPACE_TEMPLATE = "fleet-member-${MEMBER-CLUSTER-NAME}"
"""The override value: KubeFleet replaces ${MEMBER-CLUSTER-NAME} with each member's name."""

_UNSET_REPORT_NAMESPACE = "set-by-override"
_COMPONENT = MANAGED_BY
_RETRIES = 6
_WAKE_SECONDS = 1.0
_TICK_SECONDS = 1.0
_WRITE_BACKOFF_MAX = 60.0
PICK_FIXED_MAX = 100
"""KubeFleet's limit on a placement's clusterNames: bigger stages get several placements."""
_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED
_PENDING = gate_pb2.GATE_STATE_PENDING


def collector_names(ref: gatelib.GateRef) -> tuple[str, str, str]:
    """(MetricCollector, ClusterResourceOverride, ClusterResourcePlacement) names of a gate.

    As in the cookbook: mc-<run>-<stage>, ro-mc-..., crp-mc-... (namespaced runs add their
    namespace); at most 63 characters, longer names end in a stable hash. Stages of more than
    100 clusters get further placements crp-mc-...-2, -3, ...
    """
    base = "-".join(p for p in ("mc", ref.namespace, ref.run_name, ref.stage) if p)
    mc = name_with_limit(base, 54)  # room for crp- and a shard suffix -NN
    return mc, f"ro-{mc}", f"crp-{mc}"


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


def _hub_unavailable(action: str, exc: KubeError) -> Unavailable:
    return Unavailable(f"hub: cannot {action}: {exc.message}; retry")


def _regex_union(values: Sequence[str]) -> str:
    return "|".join(escape_label_value(re.escape(v)) for v in sorted(set(values)))


class KubeFleetHub:
    """One KubeFleet hub: caches, the reconcile thread, and the operations it starts."""

    def __init__(self, cfg: KubeFleetConfig, kube: Kube) -> None:
        self.cfg = cfg
        self._kube = kube
        self._reports_mode = cfg.health_source == "reports"
        self._store = OperationStore(id_prefix="kubefleet")
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
            CLUSTER_TRACKERS: Informer(kube, CLUSTER_TRACKERS, on_change=wake),
            STAGED_TRACKERS: Informer(kube, STAGED_TRACKERS, on_change=wake),
        }
        self._members = Informer(kube, MEMBER_CLUSTERS, on_change=wake)
        self._owned: dict[Resource, Informer] = {}
        self._reports: Informer | None = None
        if self._reports_mode:
            self._reports = Informer(
                kube, METRIC_COLLECTOR_REPORTS, label_selector=REPORT_SELECTOR, on_change=wake
            )
            for res in (METRIC_COLLECTORS, CLUSTER_RESOURCE_OVERRIDES, CLUSTER_RESOURCE_PLACEMENTS):
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
        self._write_failures: dict[str, tuple[int, float]] = {}
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
        self._store.close()
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

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- inventory ---------------------------------------------------------------------------

    def _member(self, cluster_id: str) -> dict[str, Any]:
        cached = self._members.get("", cluster_id)
        if cached is None:
            raise NotFound(f"cluster {cluster_id} not found: no MemberCluster of that name")
        return cached.obj

    def _to_cluster(self, obj: Mapping[str, Any]) -> cluster_pb2.Cluster:
        current = self._store.in_flight(str(obj["metadata"]["name"]))
        return inventory.to_cluster(obj, self.cfg.taint, self.cfg.version_source, current)

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of MemberClusters, ordered by name, from the watch cache."""
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
        self._require_synced()
        matching = [
            c.obj
            for c in self._members.items()
            if all(inventory.labels_of(c.obj).get(k) == v for k, v in match_labels.items())
        ]
        page = [obj for obj in matching if obj["metadata"]["name"] > after][:size]
        more = (
            bool(page)
            and len(page) == size
            and matching[-1]["metadata"]["name"] > page[-1]["metadata"]["name"]
        )
        return cluster_pb2.ListClustersResponse(
            clusters=[self._to_cluster(obj) for obj in page],
            next_page_token=encode_page_token(page[-1]["metadata"]["name"]) if more else "",
            total_size=len(matching),
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.Cluster:
        """One MemberCluster from the watch cache."""
        self._require_synced()
        return self._to_cluster(self._member(cluster_id))

    def service_out(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Adds our NoSchedule taint; the operation succeeds when the cache shows it."""
        return self._taint_operation(request_id, cluster_id, _SERVICE_OUT)

    def service_in(self, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """Removes our taint (never another); succeeds when the cache shows it gone."""
        return self._taint_operation(request_id, cluster_id, _SERVICE_IN)

    def _taint_operation(
        self, request_id: str, cluster_id: str, kind: int
    ) -> cluster_pb2.Operation:
        with self._lock_for(f"member/{cluster_id}"):
            self._require_synced()
            obj = self._member(cluster_id)
            if self._store.lookup(request_id) is not None:
                return self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)[0]
            self._store.ensure_free(cluster_id)
            if inventory.has_our_taint(obj, self.cfg.taint) == (kind == _SERVICE_OUT):
                return self._store.start(
                    request_id=request_id,
                    kind=kind,
                    cluster_id=cluster_id,
                    initial_state=_SUCCEEDED,
                )[0]
            self._write_taints(cluster_id, add=kind == _SERVICE_OUT)
            op, _ = self._store.start(
                request_id=request_id, kind=kind, cluster_id=cluster_id, initial_state=_RUNNING
            )
        self._wake.set()
        return op

    def _write_taints(self, cluster_id: str, *, add: bool) -> None:
        """Read-modify-write of spec.taints, conditional on the resourceVersion read."""
        action = "add the service-out taint" if add else "remove the service-out taint"

        def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
            taints = list((fresh.get("spec") or {}).get("taints") or [])
            new = (
                inventory.with_our_taint(taints, self.cfg.taint)
                if add
                else inventory.without_our_taint(taints, self.cfg.taint)
            )
            return None if new is None else {"spec": {"taints": new}}

        try:
            written = self._kube.patch_latest(MEMBER_CLUSTERS, "", cluster_id, change, _RETRIES)
        except KubeNotFound:
            raise NotFound(
                f"cluster {cluster_id} not found: no MemberCluster of that name"
            ) from None
        except KubeError as exc:
            raise _hub_unavailable(action, exc) from exc
        if not written:
            raise Unavailable(
                f"hub: MemberCluster {cluster_id} kept changing while trying to {action}"
            )

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation's current state (NotFound for ids this plugin never gave)."""
        return self._store.get(op_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Every update of the clusters' operations until the caller cancels."""
        return self._store.watch(cluster_ids, include_in_flight, context)

    def _follow_operations(self) -> None:
        for op in self._store.all_in_flight():
            cached = self._members.get("", op.cluster_id)
            if cached is None:
                self._store.update(
                    op.id,
                    state=_FAILED,
                    error_code="CLUSTER_GONE",
                    error_message="the MemberCluster was deleted",
                )
            elif inventory.has_our_taint(cached.obj, self.cfg.taint) == (op.kind == _SERVICE_OUT):
                self._store.update(op.id, state=_SUCCEEDED)

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
        if self._reports_mode:
            per_cluster = {c: self._from_reports(c, workloads, now) for c in cluster_ids}
        else:
            per_cluster = self._from_prometheus(cluster_ids, workloads, now)
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

    def _from_reports(
        self, cluster_id: str, workloads: Sequence[health_pb2.Workload], now: datetime
    ) -> list[health.Verdict]:
        """From the freshest MetricCollectorReport in fleet-member-<cluster> (any collector:
        every report carries every workload_health series of the member's Prometheus)."""
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
            problem, collected = health.report_problem(report, now, self.cfg.report_max_age)
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
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload], now: datetime
    ) -> dict[str, list[health.Verdict]]:
        """Two queries to the central Prometheus, whatever the number of clusters."""
        label = self.cfg.cluster_label
        selector = (
            f'namespace=~"{_regex_union([w.namespace for w in workloads])}",'
            f'app=~"{_regex_union([w.name for w in workloads])}"'
        )
        try:
            samples = query_vector(
                self.cfg.central_prometheus_url, f"workload_health{{{selector}}}"
            )
            fresh = query_vector(
                self.cfg.central_prometheus_url,
                f"max by ({label}) (timestamp(workload_health))",
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
            pods = health.pods_from_samples(by_cluster.get(cluster_id, []))
            out[cluster_id] = [health.judge(pods, w, observed) for w in workloads]
        return out

    # -- gates: the view -----------------------------------------------------------------------

    def _view(self, ref: gatelib.GateRef, obj: dict[str, Any], now: datetime) -> _View:
        view = _View(ref, obj, gatelib.approval_state(obj))
        tracker_kind = ref.tracker_resource.kind
        tracker = self._trackers[ref.tracker_resource].get(ref.namespace, ref.run_name)
        run = self._runs[ref.run_resource].get(ref.namespace, ref.run_name)
        if tracker is not None:
            view.tracked = True
            view.workloads = gatelib.tracked_workloads(tracker.obj)
            view.extra = gatelib.extra_checks(tracker.obj)
        if run is not None:
            view.clusters = gatelib.stage_clusters(run.obj, ref.stage) or []
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
        if tracker is None:
            view.status, view.reason = "False", "NoWorkloadTracker"
            view.message = (
                f"no {tracker_kind} {tracker_name} for update run {ref.run}: this stage is never "
                f"approved automatically; create a {tracker_kind} named like the run listing "
                "the workloads to check"
            )
        elif run is None:
            view.status, view.reason = "Unknown", "UpdateRunNotFound"
            view.message = f"update run {ref.run} not found"
        elif gatelib.stage_clusters(run.obj, ref.stage) is None:
            view.status, view.reason = "Unknown", "StageNotFound"
            view.message = f"stage {ref.stage} is not in the status of update run {ref.run} (yet)"
        elif not view.clusters:
            view.status, view.reason = "False", "StageHasNoClusters"
            view.message = (
                f"stage {ref.stage} has no clusters: nothing to check, so it is never approved "
                "automatically; approve it by hand if that is intended"
            )
        elif not view.workloads:
            view.status, view.reason = "False", "NoWorkloadsTracked"
            view.message = (
                f"{tracker_kind} {tracker_name} lists no workloads: nothing to check, so the "
                "stage is never approved automatically"
            )
        else:
            healthy, summary = self._stage_health(view, now)
            view.status = "True" if healthy else "False"
            view.reason = "AllWorkloadsHealthy" if healthy else "WorkloadsNotHealthy"
            view.message = summary
        return view

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
                self._follow_operations()
                if all(informer.synced for informer in self._informers):
                    self.reconcile_once()
                self._loop_error = ""
            except Exception as exc:  # the loop must survive anything one object does to it
                if str(exc) != self._loop_error:
                    _LOG.exception("reconcile failed; trying again")
                self._loop_error = str(exc)

    def reconcile_once(self) -> None:
        """One pass: publish gate changes, keep per-gate objects, write what we see."""
        now = datetime.now(UTC)
        views = self._all_views(now)
        with self._gates_lock:
            self._publish_locked(views)
        for gate_id in set(self._health_memo) - set(views):
            self._health_memo.pop(gate_id, None)
        wanted: set[tuple[Resource, str]] = set()
        for view in views.values():
            if view.state != _PENDING:
                continue
            if self._reports_mode and view.tracked and view.clusters:
                wanted |= self._ensure_collection(view)
            self._note(view, now)
        if self._reports_mode:
            self._collect_garbage(wanted)

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
        if not self._may_write(key):
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
            self._write_failed(key, "write the workload condition", exc)
            return
        self._write_failures.pop(key, None)
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

    def _may_write(self, key: str) -> bool:
        """False while a write that failed is backing off (it is retried later, not every pass)."""
        failed = self._write_failures.get(key)
        return failed is None or time.monotonic() >= failed[1]

    def _write_failed(self, key: str, what: str, exc: KubeError) -> None:
        count = self._write_failures.get(key, (0, 0.0))[0] + 1
        delay = min(_WRITE_BACKOFF_MAX, 0.5 * 2**count)
        self._write_failures[key] = (count, time.monotonic() + delay)
        _LOG.warning(
            f"cannot {what}; retrying in {delay:.0f}s",
            extra={"fields": {"object": key, "error": exc.message}},
        )

    def _ensure_collection(self, view: _View) -> set[tuple[Resource, str]]:
        """Creates (or corrects the spec of) the gate's MetricCollector, override and
        placements; returns what the gate needs (for the garbage collection)."""
        wanted: set[tuple[Resource, str]] = set()
        for res, body in collection_objects(view.ref, view.obj, view.clusters, self.cfg):
            name = body["metadata"]["name"]
            wanted.add((res, name))
            key = f"{res.kind}/{name}"
            cached = self._owned[res].get("", name)
            if cached is not None and cached.obj["metadata"].get("deletionTimestamp"):
                continue  # being deleted: create it again once it is gone
            if cached is not None and _covers(cached.obj.get("spec") or {}, body["spec"]):
                self._write_failures.pop(key, None)
                continue
            if not self._may_write(key):
                continue
            try:
                if cached is None:
                    self._kube.create(res, "", body)
                else:
                    version = cached.obj["metadata"]["resourceVersion"]
                    patch = {"metadata": {"resourceVersion": version}, "spec": body["spec"]}
                    self._kube.merge_patch(res, "", name, patch)
            except KubeConflict:
                continue  # exists already / changed meanwhile: the cache brings it next pass
            except KubeError as exc:
                self._write_failed(key, f"write the {res.kind}", exc)
                continue
            self._write_failures.pop(key, None)
        return wanted

    def _collect_garbage(self, wanted: set[tuple[Resource, str]]) -> None:
        """Deletes our objects that no pending tracked gate needs (placements first), and the
        reports of our MetricCollectors that no longer exist (the agent copies the collector's
        managed-by label onto its report)."""
        for res in (CLUSTER_RESOURCE_PLACEMENTS, CLUSTER_RESOURCE_OVERRIDES, METRIC_COLLECTORS):
            for cached in self._owned[res].items():
                meta = cached.obj["metadata"]
                if (res, meta["name"]) in wanted or meta.get("deletionTimestamp"):
                    continue
                self._delete(res, "", meta["name"])
        assert self._reports is not None
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
            self._delete(METRIC_COLLECTOR_REPORTS, meta["namespace"], meta["name"])

    def _delete(self, res: Resource, namespace: str, name: str) -> None:
        key = f"{res.kind}/{namespace}/{name}"
        if not self._may_write(key):
            return
        try:
            self._kube.delete(res, namespace, name)
        except KubeNotFound:
            pass
        except KubeError as exc:
            self._write_failed(key, f"delete the {res.kind}", exc)
            return
        self._write_failures.pop(key, None)


def _owner(ref: gatelib.GateRef, request: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ClusterApprovalRequest as owner (a cluster-scoped owner is valid for our
    cluster-scoped objects; a namespaced ApprovalRequest is not: we clean those up)."""
    if ref.request.namespaced:
        return []
    meta = request.get("metadata") or {}
    return [
        {
            "apiVersion": ref.request.api_version,
            "kind": ref.request.kind,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        }
    ]


def collection_objects(
    ref: gatelib.GateRef,
    request: Mapping[str, Any],
    clusters: Sequence[str],
    cfg: KubeFleetConfig,
) -> list[tuple[Resource, dict[str, Any]]]:
    """The MetricCollector, its override, and one PickFixed placement per 100 clusters
    (KubeFleet's limit on clusterNames), in the order they are created."""
    mc, ro, crp = collector_names(ref)
    selector = {
        "group": METRIC_GROUP,
        "version": METRIC_VERSION,
        "kind": METRIC_COLLECTORS.kind,
        "name": mc,
    }

    def meta(name: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": name,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {ANNOTATION_GATE: ref.id},
        }
        owner = _owner(ref, request)
        if owner:
            out["ownerReferences"] = owner
        return out

    names_sorted = sorted(clusters)
    shards = [
        names_sorted[i : i + PICK_FIXED_MAX] for i in range(0, len(names_sorted), PICK_FIXED_MAX)
    ]
    # One placement: the override names it (its rollout picks the override up at once).
    # Several: the override applies to every placement of the collector; it exists before
    # they do, so their first rollout has it.
    override_spec: dict[str, Any] = {
        "clusterResourceSelectors": [selector],
        "policy": {
            "overrideRules": [
                {
                    "clusterSelector": {"clusterSelectorTerms": []},
                    "overrideType": "JSONPatch",
                    "jsonPatchOverrides": [
                        {
                            "op": "replace",
                            "path": "/spec/reportNamespace",
                            "value": REPORT_NAMESPACE_TEMPLATE,
                        }
                    ],
                }
            ]
        },
    }
    if len(shards) == 1:
        override_spec = {"placement": {"name": crp, "scope": "Cluster"}, **override_spec}
    out: list[tuple[Resource, dict[str, Any]]] = [
        (
            METRIC_COLLECTORS,
            {
                "apiVersion": METRIC_COLLECTORS.api_version,
                "kind": METRIC_COLLECTORS.kind,
                "metadata": meta(mc),
                "spec": {
                    "prometheusUrl": cfg.member_prometheus_url,
                    "reportNamespace": _UNSET_REPORT_NAMESPACE,
                    "interval": cfg.collect_interval,
                },
            },
        ),
        (
            CLUSTER_RESOURCE_OVERRIDES,
            {
                "apiVersion": CLUSTER_RESOURCE_OVERRIDES.api_version,
                "kind": CLUSTER_RESOURCE_OVERRIDES.kind,
                "metadata": meta(ro),
                "spec": override_spec,
            },
        ),
    ]
    for index, names in enumerate(shards):
        out.append(
            (
                CLUSTER_RESOURCE_PLACEMENTS,
                {
                    "apiVersion": CLUSTER_RESOURCE_PLACEMENTS.api_version,
                    "kind": CLUSTER_RESOURCE_PLACEMENTS.kind,
                    "metadata": meta(crp if index == 0 else f"{crp}-{index + 1}"),
                    "spec": {
                        "resourceSelectors": [selector],
                        "policy": {"placementType": "PickFixed", "clusterNames": names},
                        "strategy": {"type": "RollingUpdate"},
                    },
                },
            )
        )
    return out


def _covers(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when every field of wanted has the same value in current (extra fields allowed)."""
    for key, value in wanted.items():
        if isinstance(value, Mapping):
            inner = current.get(key)
            if not isinstance(inner, Mapping) or not _covers(inner, value):
                return False
        elif current.get(key) != value:
            return False
    return True
