"""Thread-safe operation registry implementing the contract's mutating-RPC rules, resumable
watches (revisions, a bounded change log) and, optionally, a journal that survives restarts."""

from __future__ import annotations

import collections
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.sdk.errors import Conflict, InvalidArgument, NotFound, Reason, Unavailable
from plugins.sdk.journal import OperationJournal

__all__ = [
    "DEFAULT_RETENTION",
    "OP_CONTROL_PLANE",
    "OP_FAILED",
    "OP_NODE_POOL",
    "OP_RUNNING",
    "OP_SERVICE_IN",
    "OP_SERVICE_OUT",
    "OP_SUCCEEDED",
    "TERMINAL_STATES",
    "OperationStore",
    "WatchCursor",
    "kind_name",
    "open_cursor",
    "release_cursor",
]

_LOG = logging.getLogger("plugins.sdk.operations")

OPERATION_STATE_PENDING = cluster_pb2.OPERATION_STATE_PENDING
OPERATION_STATE_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING

# The contract's operation kinds and states under short names, one home for the aliases every
# provider plugin wrote (proto/fleetupgrade/plugin/v1/cluster.proto).
OP_CONTROL_PLANE = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
OP_NODE_POOL = cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL
OP_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
OP_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
OP_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
OP_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
OP_FAILED = cluster_pb2.OPERATION_STATE_FAILED

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

DEFAULT_RETENTION = 10_000
"""How many changes an OperationStore keeps for WatchOperations replay (since_revision)."""

# A revision is (incarnation << _SEQ_BITS) | sequence. The incarnation is the store's start in
# milliseconds since 2020 (41 bits last until 2089), so revisions of an earlier process are
# smaller than every revision of this one and cannot be mistaken for them; the 22-bit
# sequence counts changes (past 4,194,303 the store moves to a new incarnation).
_SEQ_BITS = 22
_SEQ_MASK = (1 << _SEQ_BITS) - 1
_EPOCH_MS = 1_577_836_800_000  # 2020-01-01T00:00:00Z


_LAST_INCARNATION = 0
_INCARNATION_LOCK = threading.Lock()


def _new_incarnation(after: int = 0) -> int:
    """An incarnation number greater than after and than any other of this process.

    A restarted process gets a later millisecond, so a greater number; stores created in
    the same millisecond of one process still get distinct ones.
    """
    global _LAST_INCARNATION  # noqa: PLW0603
    with _INCARNATION_LOCK:
        now = int(time.time() * 1000) - _EPOCH_MS
        _LAST_INCARNATION = max(now, after + 1, _LAST_INCARNATION + 1)
        return _LAST_INCARNATION


@dataclass
class WatchCursor:
    """Links one WatchOperations call to the OperationStore serving it.

    The SDK's ClusterServicer opens one per call (open_cursor) with the request's
    since_revision; OperationStore.watch finds it by the call's context, replays from it and
    reports the revision and resync flag of each operation it yields, so a backend that
    returns store.watch(...) is resumable without knowing about revisions.
    """

    since_revision: int = 0
    revision: int = 0  # of the operation last yielded
    resync: bool = False  # of the operation last yielded
    served: bool = False  # an OperationStore picked the cursor up
    #: The operation last yielded came live, not with the stream's start (the in-flight
    #: operations, a replay or a resync): WatchOperations ends_only sends only ends of these.
    live: bool = False


_CURSORS: dict[int, WatchCursor] = {}
_CURSORS_LOCK = threading.Lock()


def open_cursor(context: grpc.ServicerContext, since_revision: int) -> WatchCursor:
    """Registers the cursor of one WatchOperations call (release it when the call ends)."""
    cursor = WatchCursor(since_revision=since_revision)
    with _CURSORS_LOCK:
        _CURSORS[id(context)] = cursor
    return cursor


def release_cursor(context: grpc.ServicerContext) -> None:
    """Forgets the call's cursor."""
    with _CURSORS_LOCK:
        _CURSORS.pop(id(context), None)


def _cursor_of(context: grpc.ServicerContext) -> WatchCursor | None:
    with _CURSORS_LOCK:
        return _CURSORS.get(id(context))


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
    """One WatchOperations stream: its cluster filter and its queue of (revision, update)."""

    __slots__ = ("clusters", "queue")

    def __init__(self, clusters: frozenset[str]) -> None:
        self.clusters = clusters
        # None is the wake-up sentinel: the stream was cancelled or the store closed.
        self.queue: queue.SimpleQueue[tuple[int, cluster_pb2.Operation] | None] = (
            queue.SimpleQueue()
        )

    def wants(self, cluster_id: str) -> bool:
        return not self.clusters or cluster_id in self.clusters


class OperationStore:
    """Operations by id and by request_id, one in flight per cluster, and their watchers.

    Every method is safe to call from any thread. Returned operations are copies: changing
    them does not change the store.

    Every published change gets a revision, strictly increasing over the store's life and
    greater than any revision of an earlier process; the last `retention` changes are kept
    for WatchOperations replay (since_revision).

    With state_path the store is durable: each change is appended to that journal file
    (JSON lines; a new operation and a terminal state are fsynced before the call returns,
    progress is written without fsync) and a restart loads it, so request_id idempotency
    and GetOperation survive. Operations that were PENDING or RUNNING when the process
    ended come back as they were; recovered_in_flight() lists them so the backend can
    resume or fail them. The journal is compacted (rewritten atomically: temporary file,
    fsync, rename) when it grows past twice the operations it holds. Only one process may
    use a state_path at a time (an advisory lock on "<state_path>.lock").
    """

    def __init__(
        self,
        id_prefix: str = "op",
        *,
        state_path: str | Path | None = None,
        retention: int = DEFAULT_RETENTION,
    ) -> None:
        if retention < 1:
            raise ValueError("retention: must keep at least 1 change")
        self._prefix = id_prefix
        self._lock = threading.Lock()
        self._ops: dict[str, cluster_pb2.Operation] = {}
        self._by_request: dict[str, str] = {}
        self._in_flight: dict[str, str] = {}
        self._watchers: list[_Watcher] = []
        self._closed = False
        self._incarnation = _new_incarnation()
        self._revision = self._incarnation << _SEQ_BITS  # the last revision given out
        self._floor = self._revision  # replay needs since_revision >= this
        self._log: collections.deque[tuple[int, cluster_pb2.Operation]] = collections.deque(
            maxlen=retention
        )
        self._last_revision: dict[str, int] = {}
        self._state_path = Path(state_path) if state_path is not None else None
        self._journal: OperationJournal | None = None
        self._recovered: list[cluster_pb2.Operation] = []
        if self._state_path is not None:
            self._open_journal(self._state_path)

    # -- durability ------------------------------------------------------------------------

    @property
    def durable(self) -> bool:
        """True when operations are journaled to a state_path (declare DURABLE_OPERATIONS)."""
        return self._state_path is not None

    @property
    def revision(self) -> int:
        """The revision of the last change (before any change: this incarnation's base)."""
        with self._lock:
            return self._revision

    def recovered_in_flight(self) -> list[cluster_pb2.Operation]:
        """Operations loaded from the journal as PENDING or RUNNING, by cluster id.

        The process that ran them ended; the backend decides to resume (update them as the
        provider reports) or to fail them (update with state FAILED and an error).
        """
        with self._lock:
            return [_copy(op) for op in self._recovered]

    def _open_journal(self, path: Path) -> None:
        journal = OperationJournal(path)
        ops = journal.loaded
        self._incarnation = _new_incarnation(max(journal.incarnation, self._incarnation - 1))
        self._revision = self._floor = self._incarnation << _SEQ_BITS
        with self._lock:
            for op in sorted(ops.values(), key=_change_time):
                self._ops[op.id] = op
                if op.request_id:
                    self._by_request[op.request_id] = op.id
                if op.state not in TERMINAL_STATES:
                    self._in_flight[op.cluster_id] = op.id
                revision = self._next_revision_locked()
                self._last_revision[op.id] = revision
                self._append_log_locked(revision, _copy(op))
            self._recovered = [
                _copy(self._ops[self._in_flight[cid]]) for cid in sorted(self._in_flight)
            ]
            try:
                journal.compact(self._incarnation, self._ops.values())
            except OSError:
                journal.close()
                raise
            self._journal = journal
        if ops:
            _LOG.info(
                "operations loaded from the journal",
                extra={
                    "fields": {
                        "path": str(path),
                        "operations": len(ops),
                        "in_flight": len(self._recovered),
                    }
                },
            )

    def _journal_locked(self, op: cluster_pb2.Operation, must: bool) -> None:
        """Appends op's state; must: fsync, and raise Unavailable when it cannot be written.

        Terminal states are fsynced too; progress is written without (it survives a crash of
        the process, not of the machine).
        """
        journal = self._journal
        if journal is None:
            return
        try:
            journal.append(op, sync=must or op.state in TERMINAL_STATES)
        except OSError as exc:
            self._journal_error("cannot write the operation journal", exc)
            if must:
                raise Unavailable(
                    f"operation journal {self._state_path}: cannot write ({exc.strerror}); "
                    "free space or fix permissions, then retry with the same request_id"
                ) from None
            return
        if journal.needs_compaction(len(self._ops)):
            try:
                journal.compact(self._incarnation, self._ops.values())
            except OSError as exc:  # the appended journal stays valid; tried again later
                self._journal_error("cannot compact the operation journal", exc)

    def _journal_error(self, what: str, exc: OSError) -> None:
        _LOG.error(what, extra={"fields": {"path": str(self._state_path), "error": exc.strerror}})

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
                        reason=Reason.REQUEST_ID_REUSED,
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
            try:
                return self._publish_locked(op), True
            except Unavailable:
                del self._ops[new_id]
                del self._by_request[request_id]
                if self._in_flight.get(cluster_id) == new_id:
                    del self._in_flight[cluster_id]
                raise

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
                raise NotFound(f"operation {op_id} not found", reason=Reason.OPERATION_NOT_FOUND)
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
                raise NotFound(f"operation {op_id} not found", reason=Reason.OPERATION_NOT_FOUND)
            return _copy(op)

    def operations(self) -> list[cluster_pb2.Operation]:
        """Every stored operation, in the order of their last change (start or end time)."""
        with self._lock:
            return [_copy(op) for op in sorted(self._ops.values(), key=_change_time)]

    def forget(self, op_id: str) -> cluster_pb2.Operation:
        """Drops an operation as if it never existed; returns its last state.

        GetOperation answers NOT_FOUND, its request_id may start a new one, its cluster is
        free, and no watcher hears of it (a resync no longer replays it). For plugins whose
        provider loses operations, and for tests of callers facing one that does.
        """
        with self._lock:
            op = self._ops.pop(op_id, None)
            if op is None:
                raise NotFound(f"operation {op_id} not found", reason=Reason.OPERATION_NOT_FOUND)
            if self._by_request.get(op.request_id) == op_id:
                del self._by_request[op.request_id]
            if self._in_flight.get(op.cluster_id) == op_id:
                del self._in_flight[op.cluster_id]
            self._last_revision.pop(op_id, None)
            self._recovered = [r for r in self._recovered if r.id != op_id]
            if self._journal is not None:
                try:
                    self._journal.forget(op_id)
                except OSError as exc:
                    self._journal_error("cannot write the operation journal", exc)
            return op

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

        When the SDK's ClusterServicer serves the call, the request's since_revision applies
        (see changes()) and the revision of each yielded operation reaches the response.
        """
        cursor = _cursor_of(context)
        since = 0
        if cursor is not None:
            cursor.served = True
            since = cursor.since_revision
        for change, live in self._changes(cluster_ids, include_in_flight, context, since):
            if cursor is not None:
                cursor.revision = change.revision
                cursor.resync = change.resync
                cursor.live = live
            yield change.operation

    def changes(
        self,
        cluster_ids: Sequence[str],
        include_in_flight: bool,
        context: grpc.ServicerContext,
        since_revision: int = 0,
    ) -> Iterator[cluster_pb2.WatchOperationsResponse]:
        """Yields WatchOperationsResponse (operation, revision, resync) for the clusters.

        since_revision 0: starts with the in-flight operations (include_in_flight), then
        live. A since_revision this store still retains: first the retained changes after
        it, then live (include_in_flight is not needed and ignored). Any other
        since_revision (too old, another process's, from the future): the current state of
        every matching operation, resync=True on the first response. Revisions strictly
        increase along the stream; registration and the replay are atomic, so nothing is
        lost or reordered.
        """
        for change, _ in self._changes(cluster_ids, include_in_flight, context, since_revision):
            yield change

    def _changes(
        self,
        cluster_ids: Sequence[str],
        include_in_flight: bool,
        context: grpc.ServicerContext,
        since_revision: int,
    ) -> Iterator[tuple[cluster_pb2.WatchOperationsResponse, bool]]:
        """`changes`, each with whether it came live (not with the stream's start)."""
        watcher = _Watcher(frozenset(cluster_ids))
        resync = False
        with self._lock:
            if self._closed:
                return
            self._watchers.append(watcher)
            initial: list[tuple[int, cluster_pb2.Operation]]
            if since_revision and self._floor <= since_revision <= self._revision:
                initial = [
                    (rev, op)
                    for rev, op in self._log
                    if rev > since_revision and watcher.wants(op.cluster_id)
                ]
            elif since_revision:
                resync = True
                initial = sorted(
                    (
                        (rev, _copy(self._ops[op_id]))
                        for op_id, rev in self._last_revision.items()
                        if watcher.wants(self._ops[op_id].cluster_id)
                    ),
                    key=_by_revision,
                )
            elif include_in_flight:
                initial = sorted(
                    (
                        (self._last_revision.get(op_id, 0), _copy(self._ops[op_id]))
                        for cluster_id, op_id in self._in_flight.items()
                        if watcher.wants(cluster_id)
                    ),
                    key=_by_revision,
                )
            else:
                initial = []
        context.add_callback(lambda: watcher.queue.put(None))
        try:
            for revision, op in initial:
                yield (
                    cluster_pb2.WatchOperationsResponse(
                        operation=op, revision=revision, resync=resync
                    ),
                    False,
                )
                resync = False
            while context.is_active():
                try:
                    item = watcher.queue.get(timeout=_WAKE_SECONDS)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield (
                    cluster_pb2.WatchOperationsResponse(
                        operation=item[1], revision=item[0], resync=resync
                    ),
                    not resync,
                )
                resync = False
        finally:
            with self._lock:
                if watcher in self._watchers:
                    self._watchers.remove(watcher)

    @property
    def watching(self) -> int:
        """How many watch streams are registered now (one registers before it yields)."""
        with self._lock:
            return len(self._watchers)

    def close(self) -> None:
        """Ends every watch stream (e.g. before the server stops); later watches end at once.

        A durable store also closes its journal: later changes stay in memory only.
        """
        with self._lock:
            self._closed = True
            for watcher in self._watchers:
                watcher.queue.put(None)
            self._watchers.clear()
            if self._journal is not None:
                self._journal.close()
                self._journal = None

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

    def _next_revision_locked(self) -> int:
        sequence = (self._revision & _SEQ_MASK) + 1
        if sequence > _SEQ_MASK:
            self._incarnation = _new_incarnation(self._incarnation)
            sequence = 1
        self._revision = (self._incarnation << _SEQ_BITS) | sequence
        return self._revision

    def _append_log_locked(self, revision: int, snapshot: cluster_pb2.Operation) -> None:
        if self._log.maxlen is not None and len(self._log) == self._log.maxlen:
            self._floor = self._log[0][0]  # the evicted change can no longer be replayed
        self._log.append((revision, snapshot))

    def _publish_locked(self, op: cluster_pb2.Operation) -> cluster_pb2.Operation:
        """Journals the change (a new operation must be durable), gives it a revision, keeps
        it for replay and hands it to the watchers; returns a copy."""
        snapshot = _copy(op)
        self._journal_locked(snapshot, must=op.id not in self._last_revision)
        revision = self._next_revision_locked()
        self._last_revision[op.id] = revision
        self._append_log_locked(revision, snapshot)
        for watcher in self._watchers:
            if watcher.wants(snapshot.cluster_id):
                watcher.queue.put((revision, snapshot))
        return _copy(snapshot)


def _by_revision(change: tuple[int, cluster_pb2.Operation]) -> tuple[int, str]:
    return (change[0], change[1].cluster_id)


def _change_time(op: cluster_pb2.Operation) -> tuple[int, int, str]:
    stamp = op.end_time if op.HasField("end_time") else op.start_time
    return (stamp.seconds, stamp.nanos, op.id)
