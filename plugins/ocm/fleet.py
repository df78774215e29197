"""The OCM fleet: inventory from watch caches, taint service-out, upgrades and workload health.

OcmFleet is what the gRPC servicers call. It keeps ManagedClusters (and the ClusterCurators
and ManifestWorks it drives) in watch caches, starts operations through the SDK's
OperationStore, and follows them from a thread that re-reads the caches whenever they change.
A restarted plugin re-adopts the upgrades it started from the annotations on their objects.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm import curator, inventory, work
from plugins.ocm.config import OcmConfig
from plugins.ocm.hub import (
    CLUSTER_CURATORS,
    MANAGED_CLUSTERS,
    MANIFEST_WORKS,
)
from plugins.ocm.objects import (
    ANNOTATION_OPERATION_ID,
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    ANNOTATION_TARGET_VERSION,
    MANAGED_SELECTOR,
    Verdict,
    annotations_of,
    parse_time,
    timed_out,
    version_reached,
)
from plugins.sdk import versions
from plugins.sdk.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unimplemented,
)
from plugins.sdk.kube import Kube, KubeConflict, KubeError, KubeNotFound, Resource
from plugins.sdk.kubecache import Informer
from plugins.sdk.operations import OperationStore
from plugins.sdk.validate import check_page_size, decode_page_token, encode_page_token

__all__ = ["OcmFleet", "operation_id_for"]

_LOG = logging.getLogger("plugins.ocm.fleet")
_RETRIES = 8  # read-modify-write attempts on 409 before answering UNAVAILABLE
_FOLLOW_TICK = 0.5  # seconds between re-evaluations when no cache changes (for timeouts)
_WATCH_SECONDS = 30  # one watch call of a cache
_BACKOFF_MAX = 5.0  # seconds at most between a cache's retries after an error

_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_UPGRADE = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED


def operation_id_for(request_id: str) -> str:
    """The operation id of a request: derived from the request_id, so stable across restarts."""
    return "ocm-" + hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:20]


@dataclass
class _Followed:
    """What the follower needs about an upgrade besides the Operation itself."""

    started: datetime
    seen: bool = False


def _hub_unavailable(action: str, exc: KubeError) -> Unavailable:
    return Unavailable(f"hub: cannot {action}: {exc.message}; retry")


class OcmFleet:
    """The fleet on one OCM hub, as the contract sees it."""

    def __init__(self, cfg: OcmConfig, hub: Kube) -> None:
        self.cfg = cfg
        self._hub = hub
        self._store = OperationStore(id_prefix="ocm")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._clusters = self._informer(MANAGED_CLUSTERS)
        self._works = self._informer(MANIFEST_WORKS, MANAGED_SELECTOR)
        self._curators = (
            self._informer(CLUSTER_CURATORS, MANAGED_SELECTOR)
            if cfg.upgrade_method == "ClusterCurator"
            else None
        )
        self._followed: dict[str, _Followed] = {}
        self._followed_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._adopted = False
        self._adopt_lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow_loop, name="ocm-follow", daemon=True)

    def _informer(self, resource: Resource, label_selector: str = "") -> Informer:
        return Informer(
            self._hub,
            resource,
            label_selector=label_selector,
            on_change=self._wake.set,
            watch_seconds=_WATCH_SECONDS,
            backoff_max=_BACKOFF_MAX,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def _informers(self) -> list[Informer]:
        found = [self._clusters, self._works]
        if self._curators is not None:
            found.append(self._curators)
        return found

    def start(self) -> None:
        """Starts the watch caches and the operation follower."""
        for informer in self._informers:
            informer.start()
        self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        return all(informer.wait_synced(timeout) for informer in self._informers)

    def close(self) -> None:
        """Ends watch streams and threads and releases the hub connection."""
        self._stop.set()
        self._wake.set()
        self._store.close()
        self._hub.close()
        for informer in self._informers:
            informer.stop()
        self._thread.join(timeout=2)

    def close_streams(self) -> None:
        """Ends open WatchOperations streams (a server stop callback)."""
        self._store.close()

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        for informer in self._informers:
            if not informer.synced:
                reason = informer.last_error or "first list in progress"
                return False, f"{informer.resource} not listed yet: {reason}"
            if not informer.healthy:
                return False, f"{informer.resource} watch failing: {informer.last_error}"
        return True, ""

    # -- helpers -----------------------------------------------------------------------------

    def _lock_for(self, cluster_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster_id, threading.Lock())

    def _require_synced(self) -> None:
        for informer in self._informers:
            if not informer.synced:
                reason = informer.last_error or "the first list is in progress"
                raise Unavailable(f"hub: {informer.resource} not listed yet ({reason}); retry")
        self._adopt_once()

    def _managed_cluster(self, cluster_id: str) -> dict[str, Any]:
        cached = self._clusters.get("", cluster_id)
        if cached is None:
            raise NotFound(f"cluster {cluster_id} not found: no ManagedCluster of that name")
        return cached.obj

    def _version(self, obj: Mapping[str, Any]) -> str:
        return inventory.cluster_version(obj, self.cfg.version_source)

    # -- inventory ---------------------------------------------------------------------------

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the inventory, ordered by id, served from the watch cache."""
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
        self._require_synced()
        matching = []
        for cached in self._clusters.items():
            labels = inventory.labels_of(cached.obj, self.cfg.cluster_claim_label_prefix)
            if all(labels.get(k) == v for k, v in match_labels.items()):
                matching.append(cached.obj)
        page = [obj for obj in matching if obj["metadata"]["name"] > after][:size]
        clusters = [self._to_cluster(obj) for obj in page]
        last = len(page) == size and any(
            obj["metadata"]["name"] > page[-1]["metadata"]["name"] for obj in matching
        )
        return cluster_pb2.ListClustersResponse(
            clusters=clusters,
            next_page_token=encode_page_token(page[-1]["metadata"]["name"]) if last else "",
            total_size=len(matching),
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """One cluster from the watch cache."""
        self._require_synced()
        return cluster_pb2.GetClusterResponse(
            cluster=self._to_cluster(self._managed_cluster(cluster_id))
        )

    def _to_cluster(self, obj: Mapping[str, Any]) -> cluster_pb2.Cluster:
        current = self._store.in_flight(str(obj["metadata"]["name"]))
        return inventory.to_cluster(obj, self.cfg, current)

    # -- service-out / service-in ------------------------------------------------------------

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Adds our NoSelect taint; the operation succeeds when the cache shows it."""
        return self._taint_operation(request_id, cluster_id, _SERVICE_OUT)

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Removes our taint (never another); the operation succeeds when the cache shows it."""
        return self._taint_operation(request_id, cluster_id, _SERVICE_IN)

    def _taint_operation(
        self, request_id: str, cluster_id: str, kind: int
    ) -> cluster_pb2.Operation:
        with self._lock_for(cluster_id):
            self._require_synced()
            obj = self._managed_cluster(cluster_id)
            if self._store.lookup(request_id) is not None:
                return self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)[0]
            self._store.ensure_free(cluster_id)
            tainted = inventory.has_our_taint(obj, self.cfg.taint)
            if tainted == (kind == _SERVICE_OUT):
                op, _ = self._store.start(
                    request_id=request_id,
                    kind=kind,
                    cluster_id=cluster_id,
                    initial_state=_SUCCEEDED,
                    op_id=operation_id_for(request_id),
                )
                return op
            self._write_taints(cluster_id, add=kind == _SERVICE_OUT)
            op, _ = self._store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                initial_state=_RUNNING,
                op_id=operation_id_for(request_id),
            )
        self._wake.set()
        return op

    def _write_taints(self, cluster_id: str, *, add: bool) -> None:
        """Read-modify-write of spec.taints, conditional on the resourceVersion read.

        Only our taint is added or removed; every other taint is written back as read. A 409
        (someone changed the ManagedCluster in between) re-reads and tries again.
        """
        action = "add the service-out taint" if add else "remove the service-out taint"

        def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
            taints = list((fresh.get("spec") or {}).get("taints") or [])
            new = (
                inventory.with_our_taint(taints, self.cfg.taint, datetime.now(UTC))
                if add
                else inventory.without_our_taint(taints, self.cfg.taint)
            )
            return None if new is None else {"spec": {"taints": new}}

        try:
            written = self._hub.patch_latest(MANAGED_CLUSTERS, "", cluster_id, change, _RETRIES)
        except KubeNotFound:
            raise NotFound(
                f"cluster {cluster_id} not found: no ManagedCluster of that name"
            ) from None
        except KubeError as exc:
            raise _hub_unavailable(action, exc) from exc
        if not written:
            raise Unavailable(
                f"hub: ManagedCluster {cluster_id} kept changing while trying to {action}; retry"
            )

    # -- upgrades ----------------------------------------------------------------------------

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds) the upgrade by ClusterCurator or ManifestWork (caller: unused)."""
        with self._lock_for(cluster_id):
            self._require_synced()
            obj = self._managed_cluster(cluster_id)
            if self._store.lookup(request_id) is not None:
                return self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster_id,
                    target_version=version,
                )[0]
            self._store.ensure_free(cluster_id)
            current = self._version(obj)
            op_id = operation_id_for(request_id)
            try:
                downgrade = versions.is_downgrade(current, version)
            except ValueError:
                downgrade = False  # no readable version: let the upgrade say what it runs
            if downgrade:
                raise FailedPrecondition(
                    f"version: cluster {cluster_id} runs {current}, newer than {version}; "
                    "OCM upgrades never downgrade"
                )
            if version_reached(current, version):
                return self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster_id,
                    target_version=version,
                    initial_state=_SUCCEEDED,
                    op_id=op_id,
                )[0]
            now = datetime.now(UTC)
            if self.cfg.upgrade_method == "ClusterCurator":
                started = self._start_curation(cluster_id, version, request_id, op_id, now)
            else:
                started = self._start_work(cluster_id, version, request_id, op_id, now)
            op, created = self._store.start(
                request_id=request_id,
                kind=_UPGRADE,
                cluster_id=cluster_id,
                target_version=version,
                initial_state=_RUNNING,
                op_id=op_id,
            )
            if created:
                with self._followed_lock:
                    self._followed[op.id] = _Followed(started)
        self._wake.set()
        return op

    def _start_curation(
        self, cluster: str, version: str, request_id: str, op_id: str, now: datetime
    ) -> datetime:
        """Creates or patches ClusterCurator <cluster>/<cluster>; returns the start time."""
        for _ in range(_RETRIES):
            try:
                current = self._hub.get(CLUSTER_CURATORS, cluster, cluster)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise _hub_unavailable("read the ClusterCurator", exc) from exc
            if current is not None:
                notes = annotations_of(current)
                if notes.get(ANNOTATION_REQUEST_ID) == request_id:  # ours, from before a restart
                    return parse_time(notes.get(ANNOTATION_STARTED_AT)) or now
                job = curator.running_job(current)
                if job:
                    raise FailedPrecondition(
                        f"ClusterCurator {cluster}/{cluster} is running curation job {job}; "
                        "wait until it ends, then retry"
                    )
            patch = curator.curator_patch(self.cfg, cluster, version, request_id, op_id, now)
            try:
                if current is None:
                    body = {
                        "apiVersion": f"{CLUSTER_CURATORS.group}/{CLUSTER_CURATORS.version}",
                        "kind": "ClusterCurator",
                        **{k: v for k, v in patch.items() if k != "status"},
                    }
                    self._hub.create(CLUSTER_CURATORS, cluster, body)
                else:
                    patch["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                    self._hub.merge_patch(CLUSTER_CURATORS, cluster, cluster, patch)
                return now
            except KubeConflict:
                continue
            except KubeError as exc:
                raise _hub_unavailable("write the ClusterCurator", exc) from exc
        raise Unavailable(f"hub: ClusterCurator {cluster}/{cluster} kept changing; retry")

    def _start_work(
        self, cluster: str, version: str, request_id: str, op_id: str, now: datetime
    ) -> datetime:
        """Creates or replaces the upgrade ManifestWork in the cluster namespace."""
        mw = self.cfg.manifest_work
        assert mw is not None
        for _ in range(_RETRIES):
            try:
                current = self._hub.get(MANIFEST_WORKS, cluster, mw.name)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise _hub_unavailable("read the upgrade ManifestWork", exc) from exc
            if current is not None:
                notes = annotations_of(current)
                if notes.get(ANNOTATION_REQUEST_ID) == request_id:
                    return parse_time(notes.get(ANNOTATION_STARTED_AT)) or now
            body = work.upgrade_work(mw, cluster, version, request_id, op_id, now)
            try:
                if current is None:
                    self._hub.create(MANIFEST_WORKS, cluster, body)
                else:
                    meta = current["metadata"]
                    body["metadata"]["labels"] = {
                        **(meta.get("labels") or {}),
                        **body["metadata"]["labels"],
                    }
                    body["metadata"]["annotations"] = {
                        **(meta.get("annotations") or {}),
                        **body["metadata"]["annotations"],
                    }
                    body["metadata"]["resourceVersion"] = meta["resourceVersion"]
                    self._hub.replace(MANIFEST_WORKS, cluster, mw.name, body)
                return now
            except KubeConflict:
                continue
            except KubeError as exc:
                raise _hub_unavailable("write the upgrade ManifestWork", exc) from exc
        raise Unavailable(f"hub: ManifestWork {cluster}/{mw.name} kept changing; retry")

    # -- operations --------------------------------------------------------------------------

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation's current state (NotFound for ids this plugin never gave)."""
        self._require_synced()
        return self._store.get(op_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Every update of the clusters' operations until the caller cancels."""
        if include_in_flight:
            self._require_synced()
        return self._store.watch(cluster_ids, include_in_flight, context)

    def _upgrade_objects(self) -> list[tuple[str, dict[str, Any]]]:
        """(cluster, object) of every upgrade object this plugin drives, from the caches."""
        if self._curators is not None:
            return [(c.obj["metadata"]["namespace"], c.obj) for c in self._curators.items()]
        mw = self.cfg.manifest_work
        assert mw is not None
        return [
            (c.obj["metadata"]["namespace"], c.obj)
            for c in self._works.items()
            if c.obj["metadata"]["name"] == mw.name
        ]

    def _upgrade_object(self, cluster: str) -> dict[str, Any] | None:
        if self._curators is not None:
            cached = self._curators.get(cluster, cluster)
        else:
            assert self.cfg.manifest_work is not None
            cached = self._works.get(cluster, self.cfg.manifest_work.name)
        return None if cached is None else cached.obj

    def _adopt_once(self) -> None:
        """After a restart: re-creates the operations of the upgrades our objects carry."""
        if self._adopted:
            return
        with self._adopt_lock:
            if self._adopted:
                return
            for cluster, obj in self._upgrade_objects():
                notes = annotations_of(obj)
                request_id = notes.get(ANNOTATION_REQUEST_ID)
                target = notes.get(ANNOTATION_TARGET_VERSION)
                if not request_id or not target or self._store.lookup(request_id) is not None:
                    continue
                if self._store.in_flight(cluster) is not None:
                    continue
                started = parse_time(notes.get(ANNOTATION_STARTED_AT)) or datetime.now(UTC)
                op, _ = self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster,
                    target_version=target,
                    initial_state=_RUNNING,
                    op_id=notes.get(ANNOTATION_OPERATION_ID) or operation_id_for(request_id),
                )
                with self._followed_lock:
                    self._followed[op.id] = _Followed(started, seen=True)
                self._evaluate(op)
                _LOG.info(
                    "adopted an upgrade started before a restart",
                    extra={"fields": {"cluster": cluster, "operation": op.id}},
                )
            self._adopted = True

    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_FOLLOW_TICK)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if all(informer.synced for informer in self._informers):
                    self._adopt_once()
                for op in self._store.all_in_flight():
                    self._evaluate(op)
            except Exception:  # the follower must survive anything one object does to it
                _LOG.exception("following operations failed; trying again")

    def _evaluate(self, op: cluster_pb2.Operation) -> None:
        cluster = self._clusters.get("", op.cluster_id)
        if op.kind in (_SERVICE_OUT, _SERVICE_IN):
            if cluster is None:
                verdict = Verdict(_FAILED, 0, "CLUSTER_GONE", "the ManagedCluster was deleted")
            elif inventory.has_our_taint(cluster.obj, self.cfg.taint) == (op.kind == _SERVICE_OUT):
                verdict = Verdict(_SUCCEEDED, 100)
            else:
                return
        else:
            verdict = self._upgrade_verdict(op, cluster.obj if cluster else None)
        if verdict.terminal or verdict.progress:
            self._store.update(
                op.id,
                state=verdict.state,
                progress=verdict.progress,
                error_code=verdict.error_code if verdict.state == _FAILED else "",
                error_message=verdict.message if verdict.state == _FAILED else "",
            )
        if verdict.terminal:
            with self._followed_lock:
                self._followed.pop(op.id, None)

    def _upgrade_verdict(
        self, op: cluster_pb2.Operation, cluster: Mapping[str, Any] | None
    ) -> Verdict:
        with self._followed_lock:
            followed = self._followed.setdefault(op.id, _Followed(datetime.now(UTC)))
        now = datetime.now(UTC)
        if cluster is None:
            return Verdict(_FAILED, 0, "CLUSTER_GONE", "the ManagedCluster was deleted")
        obj = self._upgrade_object(op.cluster_id)
        what = "ClusterCurator" if self._curators is not None else "upgrade ManifestWork"
        ours = obj is not None and annotations_of(obj).get(ANNOTATION_REQUEST_ID) == op.request_id
        if not ours:
            if followed.seen:
                return Verdict(
                    _FAILED,
                    0,
                    "SUPERSEDED",
                    f"the {what} was deleted or changed by someone else during the upgrade",
                )
            waiting = f"waiting for the {what} to appear in the watch cache"
            return timed_out(followed.started, now, self.cfg.monitor_timeout, waiting) or Verdict(
                _RUNNING, 0
            )
        assert obj is not None
        followed.seen = True
        version = self._version(cluster)
        if self._curators is not None:
            return curator.curator_verdict(
                obj, version, op.target_version, followed.started, now, self.cfg
            )
        return work.work_verdict(obj, version, op.target_version, followed.started, now, self.cfg)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Not offered (outside the capabilities: the SDK server answers UNIMPLEMENTED first)."""
        raise Unimplemented("UpgradeNodePool: ManagedClusters report no node pools")

    # -- health ------------------------------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), from the read-only health ManifestWork."""
        for index, workload in enumerate(workloads):
            if workload.kind not in ("", "Deployment"):
                raise InvalidArgument(
                    f"workloads[{index}].kind",
                    f"{workload.kind!r} is not supported; the OCM plugin reads Deployments "
                    "(leave kind empty or set Deployment)",
                )
        limit = self.cfg.workloads.max_workloads
        wanted = {(w.namespace, w.name) for w in workloads}
        if len(wanted) > limit:
            raise InvalidArgument(
                "workloads",
                f"at most {limit} distinct workloads per request (workloads.maxWorkloads)",
            )
        self._require_synced()
        for cluster_id in cluster_ids:
            self._managed_cluster(cluster_id)
        results = []
        name = self.cfg.workloads.manifest_work_name
        for cluster_id in cluster_ids:
            cached = self._works.get(cluster_id, name)
            have = work.workloads_in(cached.obj if cached else None)
            if not wanted <= have:
                self._write_health_work(cluster_id, wanted)
            available = inventory.availability(self._managed_cluster(cluster_id))
            for workload in workloads:
                reading = work.read_workload(
                    cached.obj if cached else None,
                    available,
                    workload.namespace,
                    workload.name,
                    workload.min_healthy_replicas,
                )
                result = health_pb2.WorkloadResult(
                    cluster_id=cluster_id,
                    workload=workload,
                    health=reading.health,  # type: ignore[arg-type]
                    healthy_replicas=reading.healthy_replicas,
                    observed_value=reading.observed_value,
                    message=reading.message,
                )
                if cached is not None:
                    result.observed_time.FromDatetime(cached.received)
                results.append(result)
        return results

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str
    ) -> health_pb2.QueryMetricResponse:
        """Not offered (outside the capabilities: the SDK server answers UNIMPLEMENTED first)."""
        raise Unimplemented("QueryMetric: the OCM plugin does not query metrics")

    def _write_health_work(self, cluster_id: str, wanted: set[tuple[str, str]]) -> None:
        """Adds the wanted Deployments to the cluster's health ManifestWork (keeping the others
        while under workloads.maxWorkloads)."""
        name = self.cfg.workloads.manifest_work_name
        with self._lock_for(cluster_id):
            for _ in range(_RETRIES):
                try:
                    current: dict[str, Any] | None = self._hub.get(MANIFEST_WORKS, cluster_id, name)
                except KubeNotFound:
                    current = None
                except KubeError as exc:
                    raise _hub_unavailable("read the health ManifestWork", exc) from exc
                have = work.workloads_in(current)
                if wanted <= have:
                    return
                union = have | wanted
                keep = union if len(union) <= self.cfg.workloads.max_workloads else wanted
                body = work.health_work(self.cfg.workloads, cluster_id, sorted(keep))
                try:
                    if current is None:
                        self._hub.create(MANIFEST_WORKS, cluster_id, body)
                    else:
                        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                        self._hub.replace(MANIFEST_WORKS, cluster_id, name, body)
                    return
                except KubeConflict:
                    continue
                except KubeError as exc:
                    raise _hub_unavailable("write the health ManifestWork", exc) from exc
        raise Unavailable(f"hub: ManifestWork {cluster_id}/{name} kept changing; retry")
