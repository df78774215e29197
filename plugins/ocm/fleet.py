"""One OCM hub's fleet: inventory from watch caches, taint service-out, upgrades, health.

OcmFleet serves the clusters of one hub (OcmHubs, in hubs.py, routes the contract's calls to
the right one). It keeps ManagedClusters (and the ClusterCurators and ManifestWorks it drives)
in watch caches, starts operations through an OperationStore shared by every hub, and follows
them from a thread that re-reads the caches whenever they change. Every operation is recorded
in the operation ledger on its ManagedCluster (ledger.py); a restarted plugin reads the ledgers
and the annotations on the upgrade objects back before it answers.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm import curator, inventory, work
from plugins.ocm.config import OcmConfig
from plugins.ocm.hub import (
    CLUSTER_CURATORS,
    MANAGED_CLUSTERS,
    MANIFEST_WORKS,
)
from plugins.ocm.ledger import ANNOTATION_OPERATIONS, Record, read_ledger, with_record
from plugins.ocm.objects import (
    ANNOTATION_OPERATION_ID,
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    ANNOTATION_TARGET_VERSION,
    MANAGED_SELECTOR,
    Verdict,
    annotations_of,
    format_time,
    parse_time,
    timed_out,
    version_reached,
)
from plugins.sdk import (
    FailedPrecondition,
    Informer,
    Kube,
    KubeConflict,
    KubeError,
    KubeNotFound,
    NotFound,
    OperationStore,
    Reason,
    Resource,
    Unavailable,
    Unimplemented,
    accepted,
    is_downgrade,
    refused_later,
    refused_never,
)

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


MANAGED_CLUSTER_INFOS = Resource(
    "internal.open-cluster-management.io",
    "v1beta1",
    "managedclusterinfos",
    "ManagedClusterInfo",
    True,
)
"""ManagedClusterInfo (ACM's foundation; in the cluster namespace, named after the cluster)."""


class OcmFleet:
    """The fleet on one OCM hub, as the contract sees it.

    name: the hub's name (in messages); prefix: what cluster ids carry before the
    ManagedCluster name ("" for a single hub, "<hub>/" with several).
    """

    def __init__(
        self,
        cfg: OcmConfig,
        hub: Kube,
        *,
        store: OperationStore | None = None,
        name: str = "hub",
        prefix: str = "",
    ) -> None:
        self.cfg = cfg
        self.name = name
        self.prefix = prefix
        self._hub = hub
        self._store = store if store is not None else OperationStore(id_prefix="ocm")
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
        self._hub.close()
        for informer in self._informers:
            informer.stop()
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

    @property
    def synced(self) -> bool:
        """True once every cache has listed the hub once."""
        return all(informer.synced for informer in self._informers)

    @property
    def adopted(self) -> bool:
        """True once the operations recorded on the hub are back in the store."""
        return self._adopted

    # -- ids and helpers ---------------------------------------------------------------------

    def qualified(self, name: str) -> str:
        """The cluster id of a ManagedCluster name (the hub prefix added)."""
        return self.prefix + name

    def _local(self, cluster_id: str) -> str:
        return cluster_id.removeprefix(self.prefix)

    def _lock_for(self, cluster: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster, threading.Lock())

    def _require_synced(self) -> None:
        for informer in self._informers:
            if not informer.synced:
                reason = informer.last_error or "the first list is in progress"
                raise Unavailable(
                    f"hub {self.name}: {informer.resource} not listed yet ({reason}); retry"
                )
        self.adopt()

    def _require_reachable(self) -> None:
        """Unavailable when the hub's ManagedCluster watch is failing (the hub is unreachable)."""
        self._require_synced()
        if not self._clusters.healthy:
            raise Unavailable(
                f"hub {self.name} unreachable ({self._clusters.last_error}); retry with backoff"
            )

    def _managed_cluster(self, cluster: str) -> dict[str, Any]:
        cached = self._clusters.get("", cluster)
        if cached is None:
            raise NotFound(
                f"cluster {self.qualified(cluster)} not found: no ManagedCluster {cluster} "
                f"on hub {self.name}",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return cached.obj

    def _version(self, obj: Mapping[str, Any]) -> str:
        return inventory.cluster_version(obj, self.cfg.version_source)

    def _hub_unavailable(self, action: str, exc: KubeError) -> Unavailable:
        return Unavailable(f"hub {self.name}: cannot {action}: {exc.message}; retry")

    # -- inventory ---------------------------------------------------------------------------

    def clusters(self, match_labels: Mapping[str, str]) -> list[cluster_pb2.Cluster]:
        """Every ManagedCluster whose labels (and claims) match, from the watch cache."""
        self._require_synced()
        found = []
        for cached in self._clusters.items():
            labels = inventory.labels_of(cached.obj, self.cfg.cluster_claim_label_prefix)
            if all(labels.get(k) == v for k, v in match_labels.items()):
                found.append(self._to_cluster(cached.obj))
        return found

    def get_cluster(self, cluster: str) -> cluster_pb2.Cluster:
        """One cluster from the watch cache."""
        self._require_synced()
        return self._to_cluster(self._managed_cluster(cluster))

    def _to_cluster(self, obj: Mapping[str, Any]) -> cluster_pb2.Cluster:
        name = str(obj["metadata"]["name"])
        current = self._store.in_flight(self.qualified(name))
        found = inventory.to_cluster(obj, self.cfg, current)
        found.id = self.qualified(name)
        if not self._clusters.healthy:
            # The last state seen, from a hub that does not answer now: not available.
            found.available = False
            found.unavailable_reason = (
                f"hub {self.name} unreachable ({self._clusters.last_error}); last known state"
            )
        return found

    # -- service-out / service-in ------------------------------------------------------------

    def service_out(self, request_id: str, cluster: str) -> cluster_pb2.Operation:
        """Adds our NoSelect taint; the operation succeeds when the cache shows it."""
        return self._taint_operation(request_id, cluster, _SERVICE_OUT)

    def service_in(self, request_id: str, cluster: str) -> cluster_pb2.Operation:
        """Removes our taint (never another); the operation succeeds when the cache shows it."""
        return self._taint_operation(request_id, cluster, _SERVICE_IN)

    def _taint_operation(self, request_id: str, cluster: str, kind: int) -> cluster_pb2.Operation:
        cluster_id = self.qualified(cluster)
        with self._lock_for(cluster):
            self._require_synced()
            obj = self._managed_cluster(cluster)
            if self._store.lookup(request_id) is not None:
                return self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)[0]
            self._store.ensure_free(cluster_id)
            done = inventory.has_our_taint(obj, self.cfg.taint) == (kind == _SERVICE_OUT)
            state = _SUCCEEDED if done else _RUNNING
            # Recorded on the hub first, in the same write as the taint: the record says
            # Succeeded (the write is the change); the store says RUNNING until the watch
            # cache shows it, so ListClusters agrees with the operation's end.
            self._write_taints(
                cluster,
                add=None if done else kind == _SERVICE_OUT,
                record=self._record(request_id, kind, _SUCCEEDED),
            )
            op, _ = self._store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                initial_state=state,
                op_id=operation_id_for(request_id),
            )
        self._wake.set()
        return op

    def _record(self, request_id: str, kind: int, state: int, target: str = "") -> Record:
        now = format_time(datetime.now(UTC))
        return Record(
            request_id=request_id,
            operation_id=operation_id_for(request_id),
            kind=kind,
            state=state,
            target_version=target,
            started=now,
            ended=now if state in (_SUCCEEDED, _FAILED) else "",
        )

    def _write_taints(self, cluster: str, *, add: bool | None, record: Record | None) -> None:
        """Read-modify-write of spec.taints and the operation ledger, conditional on the
        resourceVersion read (add None: the ledger only).

        Only our taint is added or removed; every other taint is written back as read, except
        for the timeAdded the hub's webhook demands (inventory.admissible_taints). A 409
        (someone changed the ManagedCluster in between) re-reads and tries again, and so does
        the hub webhook's denial of a taint's timeAdded: the webhook runs before the
        resourceVersion check, so a write from a stale read (a taint removed meanwhile) is
        denied (400) instead of conflicting.
        """
        action = {
            True: "add the service-out taint",
            False: "remove the service-out taint",
            None: "record the operation",
        }[add]

        def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
            patch: dict[str, Any] = {}
            taints = [t for t in (fresh.get("spec") or {}).get("taints") or [] if t]
            new: list[dict[str, Any]] | None = None
            if add is not None:
                new = (
                    inventory.with_our_taint(taints, self.cfg.taint)
                    if add
                    else inventory.without_our_taint(taints, self.cfg.taint)
                )
            # Every write carries the whole object to the webhook, the ledger alone too: with
            # two taints of one key, even the list as read is denied (admissible_taints).
            admitted = inventory.admissible_taints(taints if new is None else new, taints)
            if admitted != taints:
                patch["spec"] = {"taints": admitted}
            ledger = with_record(fresh, record) if record is not None else None
            if ledger is not None:
                patch["metadata"] = {"annotations": {ANNOTATION_OPERATIONS: ledger}}
            return patch or None

        written = False
        try:
            for _ in range(_RETRIES):
                try:
                    written = self._hub.patch_latest(
                        MANAGED_CLUSTERS, "", cluster, change, _RETRIES
                    )
                    break
                except KubeError as exc:
                    if exc.status == 400 and "TimeAdded" in exc.message:
                        continue
                    raise
        except KubeNotFound:
            raise NotFound(
                f"cluster {self.qualified(cluster)} not found: no ManagedCluster {cluster} "
                f"on hub {self.name}",
                reason=Reason.CLUSTER_NOT_FOUND,
            ) from None
        except KubeError as exc:
            raise self._hub_unavailable(action, exc) from exc
        if not written:
            raise Unavailable(
                f"hub {self.name}: ManagedCluster {cluster} kept changing while trying to "
                f"{action}; retry"
            )

    def _ledger(self, cluster: str, op: cluster_pb2.Operation) -> None:
        """Records an operation's new state in its cluster's ledger (best effort: a failure
        is logged; the upgrade object's annotations still carry the last upgrade)."""
        try:
            self._write_taints(cluster, add=None, record=Record.of(op))
        except (NotFound, Unavailable) as exc:
            _LOG.warning(
                "could not record the operation on the hub",
                extra={"fields": {"operation": op.id, "error": exc.message}},
            )

    # -- upgrades ----------------------------------------------------------------------------

    def _upgrade_refusal(self, cluster: str, obj: Mapping[str, Any], version: str) -> None:
        """Raises what UpgradeControlPlane would refuse (downgrade) before anything is written."""
        current = self._version(obj)
        try:
            downgrade = is_downgrade(current, version)
        except ValueError:
            downgrade = False  # no readable version: let the upgrade say what it runs
        if downgrade:
            raise FailedPrecondition(
                f"version: cluster {self.qualified(cluster)} runs {current}, newer than "
                f"{version}; OCM upgrades never downgrade",
                reason=Reason.DOWNGRADE_NOT_SUPPORTED,
            )

    def upgrade_control_plane(
        self, request_id: str, cluster: str, version: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds) the upgrade by ClusterCurator or ManifestWork."""
        cluster_id = self.qualified(cluster)
        with self._lock_for(cluster):
            self._require_synced()
            obj = self._managed_cluster(cluster)
            if self._store.lookup(request_id) is not None:
                return self._store.start(
                    request_id=request_id,
                    kind=_UPGRADE,
                    cluster_id=cluster_id,
                    target_version=version,
                )[0]
            self._store.ensure_free(cluster_id)
            self._upgrade_refusal(cluster, obj, version)
            op_id = operation_id_for(request_id)
            if version_reached(self._version(obj), version):
                self._write_taints(
                    cluster,
                    add=None,
                    record=self._record(request_id, _UPGRADE, _SUCCEEDED, version),
                )
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
                started = self._start_curation(cluster, version, request_id, op_id, now)
            else:
                started = self._start_work(cluster, version, request_id, op_id, now)
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
                self._ledger(cluster, op)
        self._wake.set()
        return op

    def _start_curation(
        self, cluster: str, version: str, request_id: str, op_id: str, now: datetime
    ) -> datetime:
        """Creates or patches ClusterCurator <cluster>/<cluster>; returns the start time."""
        reset = False  # this call cleared the curator's status
        patch = curator.curator_patch(self.cfg, cluster, version, request_id, op_id, now)
        for _ in range(_RETRIES):
            try:
                current = self._hub.get(CLUSTER_CURATORS, cluster, cluster)
            except KubeNotFound:
                current = None
            except KubeError as exc:
                raise self._hub_unavailable("read the ClusterCurator", exc) from exc
            if current is not None:
                notes = annotations_of(current)
                if notes.get(ANNOTATION_REQUEST_ID) == request_id:  # ours, from before a restart
                    return parse_time(notes.get(ANNOTATION_STARTED_AT)) or now
                job = curator.running_job(current)
                if job and reset and curator.asks_for(current, patch):
                    # The controller acted on our reset: a reconcile queued by the last
                    # curation's end (its predicate passes a write that clears curatorJob) ran
                    # between our two writes, found no failed record and launched the curation
                    # we ask for. It is ours: annotated as ours, it is followed as ours.
                    rv = current["metadata"]["resourceVersion"]
                    mark = {"metadata": {**patch["metadata"], "resourceVersion": rv}}
                    try:
                        self._hub.merge_patch(CLUSTER_CURATORS, cluster, cluster, mark)
                    except KubeConflict:
                        continue
                    except KubeError as exc:
                        raise self._hub_unavailable("annotate the ClusterCurator", exc) from exc
                    return now
                if job:
                    raise FailedPrecondition(
                        f"ClusterCurator {cluster}/{cluster} is running curation job {job}; "
                        "wait until it ends, then retry",
                        reason=Reason.CLUSTER_BUSY,
                        retryable=True,
                    )
                step = curator.intermediate_update(current)
                if step:
                    raise FailedPrecondition(
                        f"ClusterCurator {cluster}/{cluster}: spec.upgrade.intermediateUpdate is "
                        f"{step} (an EUS upgrade): the curator controller ignores every update "
                        "of it and desiredUpdate cannot change; finish or remove that curator"
                    )
            try:
                if current is None:
                    body = {
                        "apiVersion": f"{CLUSTER_CURATORS.group}/{CLUSTER_CURATORS.version}",
                        "kind": "ClusterCurator",
                        **patch,
                    }
                    self._hub.create(CLUSTER_CURATORS, cluster, body)
                    return now
                version_read = current["metadata"]["resourceVersion"]
                if curator.needs_reset(current, version):
                    # Its own write: the controller drops it (status changed) and starts
                    # nothing, unless a reconcile queued before runs now (handled above).
                    cleared = {
                        **curator.RESET_PATCH,
                        "metadata": {"resourceVersion": version_read},
                    }
                    written = self._hub.merge_patch(CLUSTER_CURATORS, cluster, cluster, cleared)
                    reset = True
                    version_read = written["metadata"]["resourceVersion"]
                # The status untouched: the controller acts on this one.
                ask = {**patch, "metadata": {**patch["metadata"], "resourceVersion": version_read}}
                self._hub.merge_patch(CLUSTER_CURATORS, cluster, cluster, ask)
                return now
            except KubeConflict:
                continue
            except KubeError as exc:
                raise self._hub_unavailable("write the ClusterCurator", exc) from exc
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
                raise self._hub_unavailable("read the upgrade ManifestWork", exc) from exc
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
                raise self._hub_unavailable("write the upgrade ManifestWork", exc) from exc
        raise Unavailable(f"hub: ManifestWork {cluster}/{mw.name} kept changing; retry")

    # -- operations: adoption after a restart, and the follower -------------------------------

    def adopt(self) -> None:
        """Once, after the caches listed: puts the operations recorded on the hub back in the
        store (the ledgers, then upgrades our objects carry that no ledger holds yet)."""
        if self._adopted:
            return
        with self._adopt_lock:
            if self._adopted or not self.synced:
                return
            for cached in self._clusters.items():
                self._restore_ledger(str(cached.obj["metadata"]["name"]), read_ledger(cached.obj))
            for cluster, obj in self._upgrade_objects():
                self._adopt_upgrade(cluster, obj)
            self._adopted = True

    def _restore_ledger(self, cluster: str, records: Sequence[Record]) -> None:
        """Puts a cluster's recorded operations in the store, oldest first.

        Only an upgrade can be recorded RUNNING (its end is recorded when the follower sees
        it). Only the newest record can still run; an older RUNNING one lost its end (the
        plugin stopped between the end and its record, and the upgrade object moved on): it
        comes back FAILED, RESULT_LOST.
        """
        cluster_id = self.qualified(cluster)
        newest = records[-1].request_id if records else ""
        for stored in records:
            if self._store.lookup(stored.request_id) is not None:
                continue
            record = stored
            if stored.state == _RUNNING and stored.request_id != newest:
                record = replace(
                    stored,
                    state=_FAILED,
                    error_code="RESULT_LOST",
                    error_message="the plugin restarted before it recorded how this upgrade "
                    "ended, and a later operation replaced its upgrade object",
                )
            running = record.state == _RUNNING
            if running and self._store.in_flight(cluster_id) is not None:
                continue
            op, _ = self._store.start(
                request_id=record.request_id,
                kind=record.kind,
                cluster_id=cluster_id,
                target_version=record.target_version,
                initial_state=_RUNNING if record.state == _FAILED else record.state,
                op_id=record.operation_id,
            )
            if record.state == _FAILED:
                self._store.update(
                    op.id,
                    state=_FAILED,
                    error_code=record.error_code or "FAILED",
                    error_message=record.error_message or "failed (recorded on the hub)",
                )
            elif running and record.kind == _UPGRADE:
                started = parse_time(record.started) or datetime.now(UTC)
                with self._followed_lock:
                    self._followed[op.id] = _Followed(started, seen=True)

    def _adopt_upgrade(self, cluster: str, obj: Mapping[str, Any]) -> None:
        notes = annotations_of(obj)
        request_id = notes.get(ANNOTATION_REQUEST_ID)
        target = notes.get(ANNOTATION_TARGET_VERSION)
        cluster_id = self.qualified(cluster)
        if not request_id or not target or self._store.lookup(request_id) is not None:
            return
        if self._store.in_flight(cluster_id) is not None:
            return
        started = parse_time(notes.get(ANNOTATION_STARTED_AT)) or datetime.now(UTC)
        op, _ = self._store.start(
            request_id=request_id,
            kind=_UPGRADE,
            cluster_id=cluster_id,
            target_version=target,
            initial_state=_RUNNING,
            op_id=notes.get(ANNOTATION_OPERATION_ID) or operation_id_for(request_id),
        )
        with self._followed_lock:
            self._followed[op.id] = _Followed(started, seen=True)
        # An upgrade that ended before the restart is not written back to the ledger (it
        # was left out of it, or made room for newer records); one still running will be.
        self._evaluate(op, record=False)
        _LOG.info(
            "adopted an upgrade started before a restart",
            extra={"fields": {"cluster": cluster_id, "operation": op.id}},
        )

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

    def _mine(self, op: cluster_pb2.Operation) -> bool:
        return op.cluster_id.startswith(self.prefix) and "/" not in self._local(op.cluster_id)

    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_FOLLOW_TICK)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.synced:
                    self.adopt()
                for op in self._store.all_in_flight():
                    if self._mine(op):
                        self._evaluate(op)
            except Exception:  # the follower must survive anything one object does to it
                _LOG.exception("following operations failed; trying again")

    def _evaluate(self, op: cluster_pb2.Operation, record: bool = True) -> None:
        cluster_name = self._local(op.cluster_id)
        cluster = self._clusters.get("", cluster_name)
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
            updated = self._store.update(
                op.id,
                state=verdict.state,
                progress=verdict.progress,
                error_code=verdict.error_code if verdict.state == _FAILED else "",
                error_message=verdict.message if verdict.state == _FAILED else "",
            )
            if record and verdict.terminal and op.kind == _UPGRADE and cluster is not None:
                self._ledger(cluster_name, updated)  # a taint record needs no end: see adopt
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
        obj = self._upgrade_object(self._local(op.cluster_id))
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

    # -- preflight ---------------------------------------------------------------------------

    def preflight_upgrade(
        self, cluster: str, version: str, node_pools: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether UpgradeControlPlane to version would start now (nothing is written).

        UNAVAILABLE when the hub does not answer; NOT_FOUND for an unknown cluster.
        """
        self._require_reachable()
        cluster_id = self.qualified(cluster)
        obj = self._managed_cluster(cluster)
        if node_pools:
            return refused_never(
                "NODE_POOLS_NOT_SUPPORTED",
                "OCM reports no node pools: upgrade the control plane (the chosen method "
                "upgrades the whole cluster)",
            )
        if not version:
            return accepted()
        try:
            self._upgrade_refusal(cluster, obj, version)
        except FailedPrecondition as exc:
            return refused_never(exc.reason, exc.message)
        busy = self._store.in_flight(cluster_id)
        if busy is not None:
            return refused_later(
                Reason.CLUSTER_BUSY,
                f"cluster {cluster_id} has operation {busy.id} in flight; ask again when it ends",
            )
        if version_reached(self._version(obj), version):
            return accepted()  # nothing to do: UpgradeControlPlane answers SUCCEEDED at once
        available, why = inventory.availability(obj)
        if not available:
            return refused_later(
                Reason.CLUSTER_UNAVAILABLE,
                f"cluster {cluster_id} is not available ({why}); its agents cannot upgrade it",
            )
        if self._curators is None:
            return accepted()
        return self._curator_preflight(cluster, cluster_id, version)

    def _curator_preflight(
        self, cluster: str, cluster_id: str, version: str
    ) -> cluster_pb2.PreflightUpgradeResponse:
        # Read, not cached: the cache holds only curators this plugin wrote, and ACM's own
        # curator of the cluster is the one an upgrade would write.
        try:
            existing: dict[str, Any] | None = self._hub.get(CLUSTER_CURATORS, cluster, cluster)
        except KubeNotFound:
            existing = None
        except KubeError as exc:
            raise self._hub_unavailable("read the ClusterCurator", exc) from exc
        if existing is not None:
            job = curator.running_job(existing)
            if job:
                return refused_later(
                    Reason.CLUSTER_BUSY,
                    f"ClusterCurator {cluster}/{cluster} is running curation job {job}",
                )
            step = curator.intermediate_update(existing)
            if step:
                return refused_never(
                    "INTERMEDIATE_UPDATE",
                    f"ClusterCurator {cluster}/{cluster} carries intermediateUpdate {step}: "
                    "the curator controller ignores its updates",
                )
        try:
            info: dict[str, Any] | None = self._hub.get(MANAGED_CLUSTER_INFOS, cluster, cluster)
        except KubeNotFound:
            # NeedToUpgrade (pkg/jobs/utils/helpers.go) starts no first upgrade of a curator
            # without it; ACM's foundation agent creates it when the cluster is imported.
            return refused_later(
                "CLUSTER_INFO_MISSING",
                f"cluster {cluster_id} has no ManagedClusterInfo {cluster}/{cluster} on hub "
                f"{self.name}: the curator controller starts no upgrade without it",
            )
        except KubeError as exc:
            if exc.status in (401, 403):
                info = None  # not readable with this role: the curation decides
            else:
                raise self._hub_unavailable("read the ManagedClusterInfo", exc) from exc
        return curator.curator_preflight(cluster_id, version, self.cfg, info)

    # -- node pools and metrics: not offered -------------------------------------------------

    def upgrade_node_pool(self) -> cluster_pb2.Operation:
        """Not offered (outside the capabilities: the SDK server answers UNIMPLEMENTED first)."""
        raise Unimplemented("UpgradeNodePool: ManagedClusters report no node pools")

    # -- health ------------------------------------------------------------------------------

    def check_workloads(
        self, clusters: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), from the read-only health ManifestWork."""
        self._require_synced()
        for cluster in clusters:
            self._managed_cluster(cluster)
        results = []
        name = self.cfg.workloads.manifest_work_name
        wanted = {(w.namespace, w.name) for w in workloads}
        for cluster in clusters:
            cached = self._works.get(cluster, name)
            have = work.workloads_in(cached.obj if cached else None)
            if not wanted <= have:
                self._write_health_work(cluster, wanted)
            available = inventory.availability(self._managed_cluster(cluster))
            for workload in workloads:
                reading = work.read_workload(
                    cached.obj if cached else None,
                    available,
                    workload.namespace,
                    workload.name,
                    workload.min_healthy_replicas,
                )
                result = health_pb2.WorkloadResult(
                    cluster_id=self.qualified(cluster),
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

    def _write_health_work(self, cluster: str, wanted: set[tuple[str, str]]) -> None:
        """Adds the wanted Deployments to the cluster's health ManifestWork (keeping the others
        while under workloads.maxWorkloads)."""
        name = self.cfg.workloads.manifest_work_name
        with self._lock_for(cluster):
            for _ in range(_RETRIES):
                try:
                    current: dict[str, Any] | None = self._hub.get(MANIFEST_WORKS, cluster, name)
                except KubeNotFound:
                    current = None
                except KubeError as exc:
                    raise self._hub_unavailable("read the health ManifestWork", exc) from exc
                have = work.workloads_in(current)
                if wanted <= have:
                    return
                union = have | wanted
                keep = union if len(union) <= self.cfg.workloads.max_workloads else wanted
                body = work.health_work(self.cfg.workloads, cluster, sorted(keep))
                try:
                    if current is None:
                        self._hub.create(MANIFEST_WORKS, cluster, body)
                    else:
                        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                        self._hub.replace(MANIFEST_WORKS, cluster, name, body)
                    return
                except KubeConflict:
                    continue
                except KubeError as exc:
                    raise self._hub_unavailable("write the health ManifestWork", exc) from exc
        raise Unavailable(f"hub {self.name}: ManifestWork {cluster}/{name} kept changing; retry")
