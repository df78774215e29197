"""MemberClusters as the contract's clusters: inventory from the watch cache, and service-out /
service-in as our NoSchedule taint, each operation recorded on its MemberCluster (oplog.py) so
that it and its request id survive a plugin restart."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.kubefleet import inventory, oplog
from plugins.kubefleet.backoff import WriteBackoff
from plugins.kubefleet.caches import hub_unavailable
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.objects import ANNOTATION_OPERATIONS, MEMBER_CLUSTERS
from plugins.sdk import (
    TERMINAL_STATES,
    Conflict,
    Informer,
    InvalidArgument,
    Kube,
    KubeError,
    KubeNotFound,
    NotFound,
    OperationStore,
    Unavailable,
    check_page_size,
    decode_page_token,
    encode_page_token,
    require_listed,
)

__all__ = ["Members", "operation_id"]

_RETRIES = 6
_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED
_RECORD_KIND: dict[int, str] = {_SERVICE_OUT: "ServiceOut", _SERVICE_IN: "ServiceIn"}


def operation_id(request_id: str) -> str:
    """The operation id of a request id: the same in every process (the store's own rule)."""
    return f"kubefleet-{hashlib.sha256(request_id.encode('utf-8')).hexdigest()[:20]}"


class Members:
    """The MemberCluster cache's clusters and this plugin's taint operations on them."""

    def __init__(
        self,
        cfg: KubeFleetConfig,
        kube: Kube,
        informer: Informer,
        wake: Callable[[], None],
        writes: WriteBackoff,
    ) -> None:
        self.cfg = cfg
        self._kube = kube
        self._members = informer
        self._wake = wake
        self._writes = writes
        self._store = OperationStore(id_prefix="kubefleet")
        self._restored = False
        self._restore_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _lock_for(self, cluster_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster_id, threading.Lock())

    def close_streams(self) -> None:
        """Ends open WatchOperations streams."""
        self._store.close()

    def member(self, cluster_id: str) -> dict[str, Any]:
        """The cached MemberCluster; NotFound naming it."""
        cached = self._members.get("", cluster_id)
        if cached is None:
            raise NotFound(f"cluster {cluster_id} not found: no MemberCluster of that name")
        return cached.obj

    def _to_cluster(self, obj: Mapping[str, Any]) -> cluster_pb2.Cluster:
        current = self._store.in_flight(str(obj["metadata"]["name"]))
        return inventory.to_cluster(
            obj, self.cfg.taint, self.cfg.version_source, self.cfg.heartbeat_timeout, current
        )

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of MemberClusters, ordered by name, from the watch cache."""
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
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
        return self._to_cluster(self.member(cluster_id))

    def taint_operation(
        self, request_id: str, cluster_id: str, *, add: bool
    ) -> cluster_pb2.Operation:
        """The operation of request_id: recorded on the MemberCluster in the same conditional
        patch as the taint change (or alone, when the taint is as wanted already), then kept
        in the store; a restarted plugin finds it there (_restore)."""
        kind = _SERVICE_OUT if add else _SERVICE_IN
        with self._lock_for(cluster_id):
            self.restore()
            obj = self.member(cluster_id)
            if self._store.lookup(request_id) is not None:
                return self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)[0]
            self._store.ensure_free(cluster_id)
            done = inventory.has_our_taint(obj, self.cfg.taint) == add
            op_id = operation_id(request_id)
            record = oplog.OpRecord(
                op_id, request_id, _RECORD_KIND[kind], "Succeeded" if done else "Running"
            )
            self._write_taints(cluster_id, add=add, record=record)
            op, _ = self._store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                initial_state=_SUCCEEDED if done else _RUNNING,
                op_id=op_id,
            )
        self._wake()
        return op

    def restore(self) -> None:
        """Once the MemberClusters are listed: the operations recorded on them, into the store
        (oldest first; a recorded Running one is followed again by the reconcile thread)."""
        if self._restored or not self._members.synced:
            return
        with self._restore_lock:
            if self._restored:
                return
            for cached in self._members.items():
                cluster_id = str(cached.obj["metadata"]["name"])
                for record in oplog.read(cached.obj):
                    try:
                        self._store.start(
                            request_id=record.requestId,
                            kind=record.kind_value,
                            cluster_id=cluster_id,
                            initial_state=_RUNNING,
                            op_id=record.id,
                        )
                    except (InvalidArgument, Conflict):
                        continue  # a malformed or overlapping record: the newer one stands
                    if record.state != "Running":
                        self._store.update(
                            record.id,
                            state=record.state_value,
                            error_code=record.errorCode,
                            error_message=record.errorMessage,
                        )
            self._restored = True

    def _write_taints(self, cluster_id: str, *, add: bool, record: oplog.OpRecord) -> None:
        """Read-modify-write of spec.taints and the operation record, conditional on the
        resourceVersion read (one merge patch: both are written or neither)."""
        action = "add the service-out taint" if add else "remove the service-out taint"

        def change(fresh: dict[str, Any]) -> dict[str, Any] | None:
            taints = list((fresh.get("spec") or {}).get("taints") or [])
            new = (
                inventory.with_our_taint(taints, self.cfg.taint)
                if add
                else inventory.without_our_taint(taints, self.cfg.taint)
            )
            records = oplog.with_record(oplog.read(fresh), record)
            patch: dict[str, Any] = {
                "metadata": {"annotations": {ANNOTATION_OPERATIONS: oplog.encode(records)}}
            }
            if new is not None:
                patch["spec"] = {"taints": new}
            return patch

        try:
            written = self._kube.patch_latest(MEMBER_CLUSTERS, "", cluster_id, change, _RETRIES)
        except KubeNotFound:
            raise NotFound(
                f"cluster {cluster_id} not found: no MemberCluster of that name"
            ) from None
        except KubeError as exc:
            raise hub_unavailable(action, exc) from exc
        if not written:
            raise Unavailable(
                f"hub: MemberCluster {cluster_id} kept changing while trying to {action}"
            )

    def _record_ends(self) -> None:
        """Writes the end of operations whose record on the MemberCluster still says Running
        (level-triggered: a failed write is tried again next pass)."""
        for cached in self._members.items():
            obj = cached.obj
            cluster_id = str(obj["metadata"]["name"])
            for record in oplog.read(obj):
                if record.state != "Running":
                    continue
                try:
                    op = self._store.get(record.id)
                except NotFound:
                    continue
                if op.state not in TERMINAL_STATES:
                    continue
                key = f"record/{cluster_id}"
                if not self._writes.may_write(key):
                    continue
                ended = oplog.OpRecord.of(op)

                def change(fresh: dict[str, Any], ended: oplog.OpRecord = ended) -> dict[str, Any]:
                    records = oplog.with_record(oplog.read(fresh), ended)
                    return {
                        "metadata": {"annotations": {ANNOTATION_OPERATIONS: oplog.encode(records)}}
                    }

                try:
                    self._kube.patch_latest(MEMBER_CLUSTERS, "", cluster_id, change, _RETRIES)
                except KubeNotFound:
                    continue
                except KubeError as exc:
                    self._writes.failed(key, "record the end of an operation", exc)
                    continue
                self._writes.succeeded(key)

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation's current state (NotFound for ids this plugin never gave, nor recorded
        on a MemberCluster)."""
        self._require_listed()
        return self._store.get(op_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Every update of the clusters' operations until the caller cancels."""
        self._require_listed()
        return self._store.watch(cluster_ids, include_in_flight, context)

    def _require_listed(self) -> None:
        """Unavailable until the MemberClusters (and so the recorded operations) are listed."""
        require_listed([self._members], "hub")
        self.restore()

    def follow_operations(self) -> None:
        """From the reconcile thread: ends the operations the cache shows done, and writes
        their ends on the MemberClusters."""
        self.restore()
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
        if self._restored:
            self._record_ends()
