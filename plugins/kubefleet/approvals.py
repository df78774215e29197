"""Approval requests as the contract's gates: each one's view, WatchGates, and resolving them.

A gate's view is computed from the caches: its tracker (workloads, extra checks), its run
(which clusters decide it, gates.readiness), the MemberClusters a before-stage gate will touch,
and the stage's workload health (workloads.py). Each reconcile pass publishes what changed to
the open WatchGates streams; ResolveGate writes the Approved condition (conditional on the
resourceVersion read, retried on a conflict) and never approves an untracked or blocked gate.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from fleetupgrade.plugin.v1 import gate_pb2
from plugins.kubefleet import gates as gatelib
from plugins.kubefleet import inventory
from plugins.kubefleet.caches import HubCaches, hub_unavailable
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.gates import GateView
from plugins.kubefleet.notes import ApprovalNotes
from plugins.kubefleet.objects import Cookbook, condition, generation, set_condition
from plugins.kubefleet.workloads import WorkloadHealth
from plugins.sdk import (
    FailedPrecondition,
    Kube,
    KubeConflict,
    KubeError,
    KubeNotFound,
    NotFound,
    Unavailable,
)

__all__ = ["Approvals"]

_RETRIES = 6
_WAKE_SECONDS = 1.0
_PENDING = gate_pb2.GATE_STATE_PENDING


class _GateWatcher:
    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[gate_pb2.WatchGatesResponse | None] = queue.SimpleQueue()


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


class Approvals:
    """The gates of the cached approval requests, their watchers and their resolution.

    require_synced: raises Unavailable until the hub is listed (and operations restored);
    wake: asks the reconcile thread for a pass (after a gate was resolved).
    """

    def __init__(
        self,
        cfg: KubeFleetConfig,
        kube: Kube,
        cookbook: Cookbook,
        caches: HubCaches,
        health: WorkloadHealth,
        notes: ApprovalNotes,
        require_synced: Callable[[], None],
        wake: Callable[[], None],
    ) -> None:
        self.cfg = cfg
        self.cookbook = cookbook
        self._kube = kube
        self._caches = caches
        self._health = health
        self._notes = notes
        self._require_synced = require_synced
        self._wake = wake
        self._published: dict[str, gate_pb2.Gate] = {}
        self._gates_lock = threading.Lock()
        self._watchers: list[_GateWatcher] = []
        self._closed = False
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def close_streams(self) -> None:
        """Ends open WatchGates streams; none opens afterwards."""
        with self._gates_lock:
            self._closed = True
            for watcher in self._watchers:
                watcher.queue.put(None)
            self._watchers.clear()

    def _lock_for(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- the view ------------------------------------------------------------------------------

    def _view(self, ref: gatelib.GateRef, obj: dict[str, Any], now: datetime) -> GateView:
        view = GateView(ref, obj, gatelib.approval_state(obj))
        tracker_res = ref.tracker_resource(self.cookbook)
        tracker = self._caches.trackers[tracker_res].get(ref.namespace, ref.run_name)
        run = self._caches.runs[ref.run_resource].get(ref.namespace, ref.run_name)
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
            healthy, summary = self._health.stage_health(view, now)
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
            cached = self._caches.members.get("", cluster_id)
            if cached is None:
                return f"before-stage go/no-go: no MemberCluster named {cluster_id}"
            available, why = inventory.availability(cached.obj, self.cfg.heartbeat_timeout)
            if not available:
                return f"before-stage go/no-go: {cluster_id} is not available: {why}"
        return ""

    def all_views(self, now: datetime) -> dict[str, GateView]:
        """The view of every latest approval request, by gate id."""
        views: dict[str, GateView] = {}
        for res, informer in self._caches.requests.items():
            for cached in informer.items():
                if not gatelib.is_latest(cached.obj):
                    continue
                ref = gatelib.ref_of(res, cached.obj)
                if ref is None:
                    continue
                views[ref.id] = self._view(ref, cached.obj, now)
        return views

    # -- RPCs ---------------------------------------------------------------------------

    def list_gates(self) -> list[gate_pb2.Gate]:
        """Every gate (pending first, then by id), computed from the caches now."""
        self._require_synced()
        views = self.all_views(datetime.now(UTC))
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
                self._publish_locked(self.all_views(datetime.now(UTC)))
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

    def publish(self, views: Mapping[str, GateView]) -> None:
        """Sends each gate's change since the last publication to every watcher."""
        with self._gates_lock:
            self._publish_locked(views)

    def _publish_locked(self, views: Mapping[str, GateView]) -> None:
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
                    raise hub_unavailable(f"read {res.kind} {name}", exc) from exc
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
                    raise hub_unavailable(f"write {res.kind} {name}", exc) from exc
                self._notes.event(
                    res,
                    written,
                    "Approved" if approve else "Rejected",
                    reason,
                    warning=not approve,
                )
                self._wake()
                return self._view(ref, written, now).gate()
        raise Unavailable(f"hub: {res.kind} {name} kept changing while resolving it; retry")
