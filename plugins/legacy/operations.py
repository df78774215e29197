"""The bridge's operations: mutations with request-id idempotency kept by the bridge, and the
poller that turns the upstream's GetOperationStatus into our operations' states and watches.

A mutation goes: same request_id seen → that operation; unknown cluster → NOT_FOUND; another
operation in flight → ABORTED naming it; nothing to do → SUCCEEDED at once; else the request is
written to the state file, the upstream is called, its (type, operationID) is written next to
it, and the operation starts in the SDK's OperationStore (journaled with --state). A bridge
that stops between writing the request and learning the upstream's answer finds the request
without an upstream id when it starts again; it never calls again for it (the original cannot
tell a repeat from a new request) but follows the cluster: SUCCEEDED once the cluster is as
asked, FAILED as OUTCOME_UNKNOWN when it is not within the grace period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.legacy._gen import plugin_pb2
from plugins.legacy.inventory import Inventory, Observed
from plugins.legacy.state import Pending, SentState, UpstreamRef
from plugins.legacy.upstream import UpstreamError
from plugins.sdk import (
    TERMINAL_STATES,
    Conflict,
    InvalidArgument,
    NotFound,
    OperationStore,
    PluginError,
    Reason,
    Unavailable,
    kind_name,
)

__all__ = ["Ask", "BridgeOperations", "Operations", "Poller"]

_LOG = logging.getLogger("plugins.legacy.operations")
_K = cluster_pb2.OperationKind
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED


@dataclass(frozen=True)
class Ask:
    """What one mutating request asks for."""

    kind: int  # an OperationKind
    cluster_id: str
    node_pool: str = ""
    version: str = ""

    def reached(self, observed: Observed) -> bool:
        """Whether the cluster is already as asked (plain string comparison of versions, as
        the original operator compared them)."""
        if self.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT:
            return not observed.in_service
        if self.kind == cluster_pb2.OPERATION_KIND_SERVICE_IN:
            return observed.in_service
        if self.kind == cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE:
            return observed.version.master.version == self.version
        return observed.pool_version(self.node_pool) == self.version

    def subject(self) -> str:
        where = f"node pool {self.node_pool} of cluster" if self.node_pool else "cluster"
        return f"{kind_name(self.kind)} of {where} {self.cluster_id}"


class BridgeOperations(OperationStore):
    """The SDK's OperationStore, plus the id an operation will get before it starts (the
    bridge writes it to its state file before calling the upstream)."""

    def id_for(self, request_id: str) -> str:
        """The id the operation of request_id gets (the same in every process)."""
        return self._new_id(request_id)


class Operations:
    """Starts, remembers and follows operations on the upstream; safe from any thread."""

    def __init__(
        self,
        inventory: Inventory,
        state: SentState,
        store: BridgeOperations,
        *,
        unknown_grace: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inventory = inventory
        self._upstream = inventory.upstream
        self._state = state
        self.store = store
        self._grace = unknown_grace
        self._clock = clock
        self._claims_lock = threading.Lock()
        self._claims: dict[str, tuple[str, str]] = {}  # cluster → (request_id, op id) calling
        self._waiting: dict[str, float] = {}  # op id → when its upstream state became unknown
        self._upstream_down = False
        self._recover()

    def _recover(self) -> None:
        """Matches what the state file says was sent with the operations the store reloaded."""
        for pending in self._state.all():
            op = self.store.lookup(pending.request_id)
            if op is not None and op.state in TERMINAL_STATES:
                self._state.drop(pending.op_id)  # ended before the record was dropped
                continue
            if op is None:  # stopped after the call, before the operation was recorded
                try:
                    op = self._adopt(pending)
                except PluginError as exc:
                    _LOG.error("cannot resume a request sent upstream: %s", exc.message)
                    continue
            if pending.upstream is None:
                self._waiting[op.id] = self._clock()
        for op in self.store.recovered_in_flight():
            if self._state.get(op.id) is None:  # no record of what was sent: follow the cluster
                self._waiting.setdefault(op.id, self._clock())

    def _adopt(self, pending: Pending) -> cluster_pb2.Operation:
        """Starts (in the store) the operation of a request the upstream may already run."""
        ask = Ask(pending.kind, pending.cluster_id, pending.node_pool, pending.version)
        op, _ = self._start(pending.request_id, ask, pending.op_id, _RUNNING)
        if pending.upstream is None:
            self._waiting.setdefault(op.id, self._clock())
        return op

    # -- mutations -------------------------------------------------------------------------

    def mutate(self, request_id: str, ask: Ask) -> cluster_pb2.Operation:
        """The operation of this request: the one it started before, or a new one."""
        if self.store.lookup(request_id) is not None:
            return self._same(request_id, ask)
        self._inventory.require(ask.cluster_id)
        op_id = self.store.id_for(request_id)
        with self._claim(ask, request_id, op_id):
            if self.store.lookup(request_id) is not None:
                return self._same(request_id, ask)
            sent = self._state.get(op_id)
            if sent is not None:  # sent before, but the store could not record it then
                if Ask(sent.kind, sent.cluster_id, sent.node_pool, sent.version) != ask:
                    raise InvalidArgument(
                        "request_id",
                        f"reused for a different request (it was sent for cluster "
                        f"{sent.cluster_id}); choose a new request_id per change",
                        reason=Reason.REQUEST_ID_REUSED,
                    )
                return self._adopt(sent)
            self.store.ensure_free(ask.cluster_id)
            observed = self._observe(ask)
            if ask.reached(observed):
                op, _ = self._start(request_id, ask, op_id, _SUCCEEDED)
                return op
            return self._call(request_id, ask, op_id)

    def _same(self, request_id: str, ask: Ask) -> cluster_pb2.Operation:
        # The store answers the operation of request_id, or InvalidArgument when the request
        # differs from the first one.
        op, _ = self._start(request_id, ask, None, _RUNNING)
        return op

    def _start(
        self, request_id: str, ask: Ask, op_id: str | None, state: int
    ) -> tuple[cluster_pb2.Operation, bool]:
        return self.store.start(
            request_id=request_id,
            kind=ask.kind,
            cluster_id=ask.cluster_id,
            node_pool=ask.node_pool,
            target_version=ask.version,
            initial_state=state,
            op_id=op_id,
        )

    @contextmanager
    def _claim(self, ask: Ask, request_id: str, op_id: str) -> Iterator[None]:
        """Holds the cluster while its mutation is sent to the upstream."""
        with self._claims_lock:
            holder = self._claims.get(ask.cluster_id)
            if any(rid == request_id for rid, _ in self._claims.values()):
                raise Unavailable(
                    f"request {request_id} is being sent to the upstream plugin now; retry "
                    "shortly with the same request_id",
                    retry_after=1.0,
                )
            if holder is not None:
                raise Conflict(
                    f"cluster {ask.cluster_id} has operation {holder[1]} being started; wait "
                    "until it ends, then retry",
                    holder[1],
                )
            self._claims[ask.cluster_id] = (request_id, op_id)
        try:
            yield
        finally:
            with self._claims_lock:
                del self._claims[ask.cluster_id]

    def _observe(self, ask: Ask) -> Observed:
        try:
            observed = self._inventory.observe(ask.cluster_id)
        except UpstreamError as exc:
            raise exc.to_plugin_error(f"cluster {ask.cluster_id}") from None
        if ask.node_pool and observed.pool_version(ask.node_pool) is None:
            pools = ", ".join(p.nodePoolID for p in observed.version.nodePools) or "none"
            raise NotFound(
                f"cluster {ask.cluster_id} has no node pool {ask.node_pool} (the upstream "
                f"plugin lists: {pools}); pass one of them",
                reason=Reason.NODE_POOL_NOT_FOUND,
            )
        return observed

    def _call(self, request_id: str, ask: Ask, op_id: str) -> cluster_pb2.Operation:
        pending = Pending(request_id, op_id, ask.kind, ask.cluster_id, ask.node_pool, ask.version)
        self._state.put(pending)  # written before the call (Unavailable: nothing sent)
        try:
            answer = self._send(ask)
        except UpstreamError as exc:
            if not exc.ambiguous:
                self._state.drop(op_id)  # refused or not reached: a retry may send it again
                raise exc.to_plugin_error(ask.subject()) from None
            # The upstream may have started it: never call again for this request; follow
            # the cluster instead.
            _LOG.warning(
                "upstream call outcome unknown; following the cluster",
                extra={"fields": {"operation": op_id, "error": str(exc)}},
            )
            return self._adopt(pending)
        ref = UpstreamRef(answer.type, answer.operationID)
        self._state.put(replace(pending, upstream=ref), must=False)
        op, _ = self._start(request_id, ask, op_id, _RUNNING)
        if not ref.operation_id:
            # Done at once, nothing to follow (the original operator read an empty
            # operationID as nothing in flight): the cluster's state tells the end.
            self._waiting.setdefault(op_id, self._clock())
        _LOG.info(
            "operation started",
            extra={
                "fields": {
                    "operation": op_id,
                    "request_id": request_id,
                    "cluster": ask.cluster_id,
                    "upstream_type": ref.type,
                    "upstream_operation": ref.operation_id,
                }
            },
        )
        return op

    def _send(self, ask: Ask) -> plugin_pb2.Operation:
        up = self._upstream
        if ask.kind == cluster_pb2.OPERATION_KIND_SERVICE_OUT:
            return up.service_out(ask.cluster_id)
        if ask.kind == cluster_pb2.OPERATION_KIND_SERVICE_IN:
            return up.service_in(ask.cluster_id)
        if ask.kind == cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE:
            return up.upgrade_master(ask.cluster_id, ask.version)
        return up.upgrade_node_pool(ask.cluster_id, ask.node_pool, ask.version)

    # -- reads -----------------------------------------------------------------------------

    def get(self, op_id: str) -> cluster_pb2.Operation:
        """GetOperation: NotFound for an id the bridge does not know."""
        return self.store.get(op_id)

    def watch(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """WatchOperations: every change the poller (or a mutation) makes."""
        return self.store.watch(cluster_ids, include_in_flight, context)

    # -- polling ---------------------------------------------------------------------------

    def poll_once(self) -> None:
        """Asks the upstream about every operation in flight and records what changed."""
        for op in self.store.all_in_flight():
            try:
                self._poll(op)
            except UpstreamError as exc:
                self._note_upstream(exc)
                if exc.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return  # the upstream is away: try everything again next time
                continue
            except PluginError as exc:
                _LOG.error("cannot record an operation's change: %s", exc.message)
                continue
            self._note_upstream(None)

    def _poll(self, op: cluster_pb2.Operation) -> None:
        sent = self._state.get(op.id)
        ref = sent.upstream if sent is not None else None
        ask = Ask(op.kind, op.cluster_id, op.node_pool, op.target_version)
        if ref is None:
            self._follow_unknown(op, ask, "OUTCOME_UNKNOWN", self._outcome_message(op))
            return
        if not ref.operation_id:
            self._follow_unknown(
                op,
                ask,
                "NOT_AS_ASKED",
                f"the upstream plugin answered {ref.type} without an operation id (done at "
                f"once) but the cluster was not as asked within {self._grace:g} s; check the "
                "cluster, then retry with a new request_id",
            )
            return
        status = self._upstream.get_operation_status(op.cluster_id, ref.operation_id, ref.type)
        if status == plugin_pb2.RUNNING:
            self._waiting.pop(op.id, None)
        elif status == plugin_pb2.DONE:
            self._finish(op.id, _SUCCEEDED)
        elif status == plugin_pb2.FAILED:
            self._finish(
                op.id,
                _FAILED,
                "UPSTREAM_FAILED",
                f"the upstream plugin reports its {ref.type} operation {ref.operation_id} "
                f"({ask.subject()}) FAILED; the original protocol carries no reason: see the "
                "upstream plugin's logs, then retry with a new request_id",
            )
        else:
            self._follow_unknown(
                op,
                ask,
                "OPERATION_UNKNOWN",
                f"the upstream plugin has answered UNKNOWN for its {ref.type} operation "
                f"{ref.operation_id} ({ask.subject()}) for {self._grace:g} s (it may have "
                "restarted and forgotten it) and the cluster is not as asked; check the "
                "cluster, then retry with a new request_id",
            )

    def _outcome_message(self, op: cluster_pb2.Operation) -> str:
        return (
            f"the bridge could not learn whether the upstream plugin started the "
            f"{kind_name(op.kind)} of cluster {op.cluster_id} (its call failed or the bridge "
            f"stopped during it), and the cluster was not as asked within {self._grace:g} s; "
            "check the cluster, then retry with a new request_id"
        )

    def _follow_unknown(self, op: cluster_pb2.Operation, ask: Ask, code: str, text: str) -> None:
        since = self._waiting.setdefault(op.id, self._clock())
        if ask.reached(self._inventory.observe(op.cluster_id)):
            self._finish(op.id, _SUCCEEDED)
        elif self._clock() - since >= self._grace:
            self._finish(op.id, _FAILED, code, text)

    def _finish(self, op_id: str, state: int, code: str = "", text: str = "") -> None:
        self._waiting.pop(op_id, None)
        op = self.store.update(op_id, state=state, error_code=code, error_message=text)
        self._state.drop(op_id)
        _LOG.info(
            "operation finished",
            extra={
                "fields": {
                    "operation": op_id,
                    "state": cluster_pb2.OperationState.Name(op.state),
                    "error_code": op.error_code,
                }
            },
        )

    def _note_upstream(self, error: Exception | None) -> None:
        down = error is not None
        if down != self._upstream_down:
            self._upstream_down = down
            if down:
                _LOG.warning("upstream plugin not answering while polling: %s", error)
            else:
                _LOG.info("upstream plugin answering again")


class Poller:
    """Runs Operations.poll_once every interval seconds in a thread until stop()."""

    def __init__(self, operations: Operations, interval: float) -> None:
        if interval <= 0:
            raise ValueError("--poll-interval: must be positive seconds")
        self._operations = operations
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="legacy-poller", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._operations.poll_once()
            except Exception:
                _LOG.exception("polling the upstream failed; trying again next interval")

    def stop(self) -> None:
        """Ends the thread (waits for a poll in progress)."""
        self._stop.set()
        self._thread.join(timeout=30)
