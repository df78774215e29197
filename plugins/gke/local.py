"""The plugin's own operations, next to GKE's: requests that had nothing to do, and service
changes (drain / restore) run in the background, kept in the store and the state file so a
restarted plugin answers them and resumes the unfinished ones."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.operations import GkeOperationStore
from plugins.gke.state import Binding, PluginState
from plugins.gke.traffic import Stopping, Traffic
from plugins.sdk import OP_SERVICE_IN, OP_SERVICE_OUT, TERMINAL_STATES, PluginError, kind_name

__all__ = ["LocalOperations"]

_LOG = logging.getLogger("plugins.gke.local")


class LocalOperations:
    """Operations the plugin runs itself (ids gke-op-…), recorded in store and state."""

    def __init__(self, store: GkeOperationStore, state: PluginState, traffic: Traffic) -> None:
        self._store = store
        self._state = state
        self._traffic = traffic
        self._executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gke-traffic")

    def resume(self) -> None:
        """Loads the kept operations into the store and resumes unfinished service changes."""
        for op in self._state.operations():
            stored = self._store.record(op)
            if stored.state not in TERMINAL_STATES and stored.kind in (
                OP_SERVICE_OUT,
                OP_SERVICE_IN,
            ):
                _LOG.info(
                    "resuming a service change after restart",
                    extra={"fields": {"operation": op.id, "cluster": op.cluster_id}},
                )
                self._executor.submit(self._run, stored.id, stored.kind, stored.cluster_id)

    def close(self) -> None:
        """Waits for running service changes (the traffic layer stops them at a safe point)."""
        self._executor.shutdown(wait=True, cancel_futures=True)

    def done_at_once(
        self,
        request_id: str,
        kind: int,
        cluster_id: str,
        node_pool: str = "",
        version: str = "",
        requested: str = "",
    ) -> cluster_pb2.Operation:
        """A request with nothing to do: an operation SUCCEEDED from the start (requested: the
        alias it was asked with, so a repeat with the same alias finds it)."""
        op, _ = self._store.start(
            request_id=request_id,
            kind=kind,
            cluster_id=cluster_id,
            node_pool=node_pool,
            target_version=version,
            initial_state=cluster_pb2.OPERATION_STATE_SUCCEEDED,
        )
        self._state.save_operation(op)
        if requested:
            self._state.bind(
                request_id, Binding(op.id, kind, cluster_id, node_pool, version, False, requested)
            )
        return op

    def service_change(self, kind: int, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """ServiceOut (kind OUT) or ServiceIn (kind IN) of a free cluster: at once when there
        is nothing to do or the traffic mode is immediate, else a background operation."""
        needed = (
            self._traffic.needs_out(cluster_id)
            if kind == OP_SERVICE_OUT
            else self._traffic.needs_in(cluster_id)
        )
        if not needed:
            return self.done_at_once(request_id, kind, cluster_id)
        if self._traffic.immediate:
            self._change(kind, cluster_id, request_id)
            return self.done_at_once(request_id, kind, cluster_id)
        op, _ = self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)
        self._state.save_operation(op)
        self._executor.submit(self._run, op.id, kind, cluster_id)
        return op

    def _change(self, kind: int, cluster_id: str, request_id: str, op_id: str = "") -> None:
        def progress(percent: int) -> None:
            if op_id:
                self._store.update(op_id, progress=percent)

        if kind == OP_SERVICE_OUT:
            self._traffic.service_out(cluster_id, request_id, progress)
        else:
            self._traffic.service_in(cluster_id, request_id, progress)

    def _run(self, op_id: str, kind: int, cluster_id: str) -> None:
        op = self._store.get(op_id)
        code = "SERVICE_OUT_FAILED" if kind == OP_SERVICE_OUT else "SERVICE_IN_FAILED"
        try:
            running = self._store.update(op_id, state=cluster_pb2.OPERATION_STATE_RUNNING)
            self._state.save_operation(running)
            self._change(kind, cluster_id, op.request_id, op_id)
        except Stopping:
            _LOG.info(
                "service change interrupted by shutdown; it resumes after a restart",
                extra={"fields": {"operation": op_id}},
            )
            return
        except PluginError as exc:
            final = self._store.update(
                op_id,
                state=cluster_pb2.OPERATION_STATE_FAILED,
                error_code=code,
                error_message=f"{kind_name(kind)} of {cluster_id} failed: {exc.message}",
            )
        except Exception:
            _LOG.exception("service change failed", extra={"fields": {"operation": op_id}})
            final = self._store.update(
                op_id,
                state=cluster_pb2.OPERATION_STATE_FAILED,
                error_code=code,
                error_message=f"{kind_name(kind)} of {cluster_id} failed: internal error "
                "(see the plugin's log)",
            )
        else:
            final = self._store.update(op_id, state=cluster_pb2.OPERATION_STATE_SUCCEEDED)
        self._state.save_operation(final)
