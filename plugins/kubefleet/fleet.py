"""The KubeFleet hub as the contract sees it: a facade over the plugin's rooms.

KubeFleetHub is what the gRPC servicers call. Everything it reads comes from watch caches
(caches.py: approval requests, update runs, trackers, MemberClusters, reports, and the objects
it created), so a gate evaluation costs the hub no request in steady state. Its rooms:

- inventory and service-out / service-in operations: members.py (Members), followed until the
  cache shows the taint;
- workload health, for CheckWorkloads and for each gate: workloads.py (WorkloadHealth);
- gates: approvals.py (Approvals) turns approval requests into gates (before-stage and
  after-stage ones decide on different clusters, see gates.readiness), publishes their changes
  to WatchGates streams and resolves them;
- what the plugin writes on approval requests (condition and Event): notes.py (ApprovalNotes);
- what health data needs per pending tracked gate (current cookbook: the hub-created
  MetricCollectorReports; seed: a MetricCollector, its placements and a slot in a shared
  override; collection.py), removed once the gate is resolved or gone: health_objects.py.

This module wires them and runs the one reconcile thread, woken by any cache change and by a
short tick, that drives each room once per pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, gate_pb2, health_pb2
from plugins.kubefleet.approvals import Approvals
from plugins.kubefleet.backoff import WriteBackoff
from plugins.kubefleet.caches import HubCaches
from plugins.kubefleet.collection import collector_names
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.health_objects import HealthObjects
from plugins.kubefleet.members import Members
from plugins.kubefleet.notes import HEALTH_CONDITION, ApprovalNotes
from plugins.kubefleet.objects import COOKBOOKS, CURRENT, SEED, Cookbook
from plugins.kubefleet.workloads import WorkloadHealth
from plugins.sdk import Kube, KubeError, KubeNotFound

__all__ = [
    "HEALTH_CONDITION",
    "KubeFleetHub",
    "collector_names",
    "resolve_cookbook",
]

_LOG = logging.getLogger("plugins.kubefleet.fleet")

_TICK_SECONDS = 1.0
_PENDING = gate_pb2.GATE_STATE_PENDING


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


class KubeFleetHub:
    """One KubeFleet hub: caches, the reconcile thread, and the rooms it drives."""

    def __init__(self, cfg: KubeFleetConfig, kube: Kube, cookbook: Cookbook) -> None:
        self.cfg = cfg
        self.cookbook = cookbook
        self._kube = kube
        self._wake = threading.Event()
        self._stop = threading.Event()
        wake = self._wake.set
        self._caches = HubCaches(cfg, kube, cookbook, wake)
        writes = WriteBackoff()
        self.members = Members(cfg, kube, self._caches.members, wake, writes)
        self._health = WorkloadHealth(cfg, self._caches)
        self._notes = ApprovalNotes(kube, writes)
        self._approvals = Approvals(
            cfg, kube, cookbook, self._caches, self._health, self._notes, self._require_synced, wake
        )
        self._objects = HealthObjects(cfg, kube, cookbook, self._caches, writes)
        self._loop_error = ""
        self._passes = 0
        self._thread = threading.Thread(target=self._loop, name="kubefleet-reconcile", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def kube(self) -> Kube:
        """The hub adapter (its request counters are read by benchmarks)."""
        return self._kube

    def start(self) -> None:
        """Starts the watch caches and the reconcile thread."""
        self._caches.start()
        self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        return self._caches.wait_synced(timeout)

    def close_streams(self) -> None:
        """Ends open WatchOperations and WatchGates streams (a server stop callback)."""
        self.members.close_streams()
        self._approvals.close_streams()

    def close(self) -> None:
        """Ends streams and threads and releases the hub connection."""
        self._stop.set()
        self._wake.set()
        self.close_streams()
        self._caches.stop()
        self._kube.close()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        return self._caches.readiness()

    def _require_synced(self) -> None:
        self._caches.require_listed()
        self.members.restore()

    # -- inventory and operations (members.py) -----------------------------------------------

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

    # -- workload health (workloads.py) ------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), clusters in request order."""
        self._require_synced()
        for cluster_id in cluster_ids:
            self.members.member(cluster_id)
        return self._health.verdicts(cluster_ids, workloads, datetime.now(UTC))

    # -- gates (approvals.py) ----------------------------------------------------------------

    def list_gates(self) -> list[gate_pb2.Gate]:
        """Every gate (pending first, then by id), computed from the caches now."""
        return self._approvals.list_gates()

    def watch_gates(self, context: grpc.ServicerContext) -> Iterator[gate_pb2.WatchGatesResponse]:
        """Every pending gate, then each change, until the caller cancels."""
        return self._approvals.watch_gates(context)

    def resolve_gate(self, gate_id: str, decision: int, reason: str) -> gate_pb2.Gate:
        """Approve: Approved=True (observedGeneration, reason); reject: Approved=False."""
        return self._approvals.resolve_gate(gate_id, decision, reason)

    # -- the reconcile thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_TICK_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.members.follow_operations()
                if self._caches.synced:
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
        views = self._approvals.all_views(now)
        self._approvals.publish(views)
        self._health.forget_all_but(views)
        pending = [v for v in views.values() if v.state == _PENDING]
        if self._caches.reports_mode:
            self._objects.keep([v for v in pending if v.tracked and v.collect_on])
        for view in pending:
            self._notes.note(view, now)
