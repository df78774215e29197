"""Thread-safe in-memory operation registry implementing the contract's mutating-RPC rules."""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterator, Sequence

import grpc
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import Conflict, InvalidArgument, NotFound

__all__ = ["TERMINAL_STATES", "OperationStore", "kind_name"]

OPERATION_STATE_PENDING = cluster_pb2.OPERATION_STATE_PENDING
OPERATION_STATE_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING

TERMINAL_STATES: frozenset[int] = frozenset(
    {cluster_pb2.OPERATION_STATE_SUCCEEDED, cluster_pb2.OPERATION_STATE_FAILED}
)
"""States after which an operation never changes (SUCCEEDED, FAILED)."""

_KIND_NAMES: dict[int, str] = {
    cluster_pb2.OPERATION_KIND_SERVICE_OUT: "service-out",
    cluster_pb2.OPERATION_KIND_SERVICE_IN: "service-in",
    cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE: "control-plane upgrade",
    cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL: "node-pool upgrade",
}
_WAKE_SECONDS = 1.0  # how often a watcher re-checks its context when no update arrives


def kind_name(kind: int) -> str:
    """A short human name of an OperationKind ("service-out", "control-plane upgrade", ...)."""
    return _KIND_NAMES.get(kind, f"operation kind {kind}")


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _copy(op: cluster_pb2.Operation) -> cluster_pb2.Operation:
    clone = cluster_pb2.Operation()
    clone.CopyFrom(op)
    return clone


class _Watcher:
    """One WatchOperations stream: its cluster filter and its queue of updates."""

    __slots__ = ("clusters", "queue")

    def __init__(self, clusters: frozenset[str]) -> None:
        self.clusters = clusters
        # None is the wake-up sentinel: the stream was cancelled or the store closed.
        self.queue: queue.SimpleQueue[cluster_pb2.Operation | None] = queue.SimpleQueue()

    def wants(self, cluster_id: str) -> bool:
        return not self.clusters or cluster_id in self.clusters


class OperationStore:
    """Operations by id and by request_id, one in flight per cluster, and their watchers.

    Every method is safe to call from any thread. Returned operations are copies: changing
    them does not change the store.
    """

    def __init__(self, id_prefix: str = "op") -> None:
        self._prefix = id_prefix
        self._lock = threading.Lock()
        self._ops: dict[str, cluster_pb2.Operation] = {}
        self._by_request: dict[str, str] = {}
        self._in_flight: dict[str, str] = {}
        self._watchers: list[_Watcher] = []
        self._closed = False

    def _new_id(self, request_id: str) -> str:
        # Derived from the request_id, so the same request names the same operation in every
        # process; request_ids are unique per operation, hence so are these ids.
        digest = hashlib.sha256(request_id.encode("utf-8")).hexdigest()[:20]
        return f"{self._prefix}-{digest}"

    def start(
        self,
        *,
        request_id: str,
        kind: int,
        cluster_id: str,
        node_pool: str = "",
        target_version: str = "",
        initial_state: int = OPERATION_STATE_PENDING,
        op_id: str | None = None,
    ) -> tuple[cluster_pb2.Operation, bool]:
        """Returns (operation, created) for a mutating request.

        The same request_id returns the operation it started, with created=False
        (InvalidArgument when it comes with a different kind, cluster, pool or version).
        A different PENDING or RUNNING operation on the cluster raises Conflict naming it.
        Otherwise a new operation starts in initial_state (a terminal initial_state records a
        request with nothing to do: it gets its end time and never counts as in flight).
        """
        with self._lock:
            existing_id = self._by_request.get(request_id)
            if existing_id is not None:
                existing = self._ops[existing_id]
                same = (
                    existing.kind == kind
                    and existing.cluster_id == cluster_id
                    and existing.node_pool == node_pool
                    and existing.target_version == target_version
                )
                if not same:
                    raise InvalidArgument(
                        "request_id",
                        f"reused for a different request (it started operation {existing.id} "
                        f"on cluster {existing.cluster_id}); choose a new request_id per change",
                    )
                return _copy(existing), False
            self._raise_if_busy_locked(cluster_id)
            new_id = op_id or self._new_id(request_id)
            if new_id in self._ops:
                raise InvalidArgument(
                    "request_id", f"operation id {new_id} exists already; choose a new request_id"
                )
            op = cluster_pb2.Operation(
                id=new_id,
                kind=kind,  # type: ignore[arg-type]
                cluster_id=cluster_id,
                node_pool=node_pool,
                target_version=target_version,
                state=initial_state,  # type: ignore[arg-type]
                request_id=request_id,
            )
            now = _now()
            op.start_time.CopyFrom(now)
            if initial_state in TERMINAL_STATES:
                op.end_time.CopyFrom(now)
                if initial_state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
                    op.progress_percent = 100
            else:
                self._in_flight[cluster_id] = new_id
            self._ops[new_id] = op
            self._by_request[request_id] = new_id
            return self._publish_locked(op), True

    def update(
        self,
        op_id: str,
        *,
        state: int | None = None,
        progress: int | None = None,
        error_code: str = "",
        error_message: str = "",
    ) -> cluster_pb2.Operation:
        """Changes an operation and publishes it to watchers; returns the new state.

        A terminal state sets end_time (SUCCEEDED also progress 100) and frees the cluster
        for the next operation. A terminal operation never changes again: updating it
        returns it as it is (so pollers of a provider may report the end twice).
        """
        with self._lock:
            op = self._ops.get(op_id)
            if op is None:
                raise NotFound(f"operation {op_id} not found")
            if op.state in TERMINAL_STATES:
                return _copy(op)
            changed = False
            if state is not None and op.state != state:
                op.state = state  # type: ignore[assignment]
                changed = True
            if progress is not None:
                bounded = max(0, min(100, progress))
                if op.progress_percent != bounded:
                    op.progress_percent = bounded
                    changed = True
            if error_code and op.error_code != error_code:
                op.error_code = error_code
                changed = True
            if error_message and op.error_message != error_message:
                op.error_message = error_message
                changed = True
            if op.state in TERMINAL_STATES:
                op.end_time.CopyFrom(_now())
                if op.state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
                    op.progress_percent = 100
                if self._in_flight.get(op.cluster_id) == op.id:
                    del self._in_flight[op.cluster_id]
            if not changed:
                return _copy(op)
            return self._publish_locked(op)

    def get(self, op_id: str) -> cluster_pb2.Operation:
        """The operation with this id; NotFound when there is none."""
        with self._lock:
            op = self._ops.get(op_id)
            if op is None:
                raise NotFound(f"operation {op_id} not found")
            return _copy(op)

    def lookup(self, request_id: str) -> cluster_pb2.Operation | None:
        """The operation a request_id started, if any (for plugins that call a provider)."""
        with self._lock:
            op_id = self._by_request.get(request_id)
            return None if op_id is None else _copy(self._ops[op_id])

    def ensure_free(self, cluster_id: str) -> None:
        """Raises Conflict naming the cluster's PENDING or RUNNING operation, if it has one.

        For plugins that must check before calling their provider; start() checks again.
        """
        with self._lock:
            self._raise_if_busy_locked(cluster_id)

    def in_flight(self, cluster_id: str) -> cluster_pb2.Operation | None:
        """The cluster's PENDING or RUNNING operation, if any."""
        with self._lock:
            return self._busy_locked(cluster_id)

    def all_in_flight(self) -> list[cluster_pb2.Operation]:
        """Every PENDING or RUNNING operation, ordered by cluster id."""
        with self._lock:
            return [_copy(self._ops[self._in_flight[c]]) for c in sorted(self._in_flight)]

    def watch(
        self,
        cluster_ids: Sequence[str],
        include_in_flight: bool,
        context: grpc.ServicerContext,
    ) -> Iterator[cluster_pb2.Operation]:
        """Yields every update of the clusters' operations (all clusters when empty).

        With include_in_flight it starts with the current state of each matching PENDING or
        RUNNING operation. Registration and that snapshot happen atomically, so no update is
        lost or reordered. Ends when the context is cancelled or the store is closed.
        """
        watcher = _Watcher(frozenset(cluster_ids))
        with self._lock:
            if self._closed:
                return
            self._watchers.append(watcher)
            initial = (
                [
                    _copy(self._ops[op_id])
                    for cluster_id, op_id in sorted(self._in_flight.items())
                    if watcher.wants(cluster_id)
                ]
                if include_in_flight
                else []
            )
        context.add_callback(lambda: watcher.queue.put(None))
        try:
            yield from initial
            while context.is_active():
                try:
                    item = watcher.queue.get(timeout=_WAKE_SECONDS)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    def close(self) -> None:
        """Ends every watch stream (e.g. before the server stops); later watches end at once."""
        with self._lock:
            self._closed = True
            for watcher in self._watchers:
                watcher.queue.put(None)
            self._watchers.clear()

    def _raise_if_busy_locked(self, cluster_id: str) -> None:
        op_id = self._in_flight.get(cluster_id)
        if op_id is not None:
            busy = self._ops[op_id]
            raise Conflict(
                f"cluster {cluster_id} has operation {busy.id} ({kind_name(busy.kind)}) "
                "in flight; wait until it ends, then retry",
                busy.id,
            )

    def _busy_locked(self, cluster_id: str) -> cluster_pb2.Operation | None:
        op_id = self._in_flight.get(cluster_id)
        return None if op_id is None else _copy(self._ops[op_id])

    def _publish_locked(self, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
        snapshot = _copy(op)
        for watcher in self._watchers:
            if watcher.wants(snapshot.cluster_id):
                watcher.queue.put(snapshot)
        return _copy(snapshot)
