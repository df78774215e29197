"""Service-out and service-in as our taint on a ManagedCluster, and the ledger written with it.

Every write to a ManagedCluster goes through `Taints.write`: one conditional read-modify-write
of spec.taints and the operation ledger annotation (ledger.py), so the hub never shows a taint
without its operation's record. A taint operation is recorded Succeeded in that same write
(the write is the change); the store says RUNNING until the watch cache shows the taint, and
the follower (follower.py) then ends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm import inventory
from plugins.ocm.caches import RETRIES, HubCaches
from plugins.ocm.hub import MANAGED_CLUSTERS
from plugins.ocm.ledger import ANNOTATION_OPERATIONS, Record, operation_id_for, with_record
from plugins.ocm.objects import format_time
from plugins.sdk import Kube, KubeError, KubeNotFound, NotFound, OperationStore, Unavailable

__all__ = ["Taints"]

_LOG = logging.getLogger("plugins.ocm.taints")

_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED


class Taints:
    """Our taint and the operation ledger on the hub's ManagedClusters.

    require_synced: raises Unavailable until the hub is listed and its operations adopted;
    wake: asks the follower to look at the caches again.
    """

    def __init__(
        self,
        hub: Kube,
        caches: HubCaches,
        store: OperationStore,
        require_synced: Callable[[], None],
        wake: Callable[[], None],
    ) -> None:
        self.cfg = caches.cfg
        self._hub = hub
        self._caches = caches
        self._store = store
        self._require_synced = require_synced
        self._wake = wake

    def operation(self, request_id: str, cluster: str, kind: int) -> cluster_pb2.Operation:
        """Starts (or finds) the service-out or service-in of the cluster."""
        cluster_id = self._caches.qualified(cluster)
        with self._caches.lock_for(cluster):
            self._require_synced()
            obj = self._caches.managed_cluster(cluster)
            if self._store.lookup(request_id) is not None:
                return self._store.start(request_id=request_id, kind=kind, cluster_id=cluster_id)[0]
            self._store.ensure_free(cluster_id)
            done = inventory.has_our_taint(obj, self.cfg.taint) == (kind == _SERVICE_OUT)
            state = _SUCCEEDED if done else _RUNNING
            # Recorded on the hub first, in the same write as the taint: the record says
            # Succeeded (the write is the change); the store says RUNNING until the watch
            # cache shows it, so ListClusters agrees with the operation's end.
            self.write(
                cluster,
                add=None if done else kind == _SERVICE_OUT,
                record=self.record(request_id, kind, _SUCCEEDED),
            )
            op, _ = self._store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                initial_state=state,
                op_id=operation_id_for(request_id),
            )
        self._wake()
        return op

    def record(self, request_id: str, kind: int, state: int, target: str = "") -> Record:
        """A ledger record of an operation starting now (ended now when state is terminal)."""
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

    def write(self, cluster: str, *, add: bool | None, record: Record | None) -> None:
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
            for _ in range(RETRIES):
                try:
                    written = self._hub.patch_latest(MANAGED_CLUSTERS, "", cluster, change, RETRIES)
                    break
                except KubeError as exc:
                    if exc.status == 400 and "TimeAdded" in exc.message:
                        continue
                    raise
        except KubeNotFound:
            raise self._caches.not_found(cluster) from None
        except KubeError as exc:
            raise self._caches.unavailable(action, exc) from exc
        if not written:
            raise Unavailable(
                f"hub {self._caches.name}: ManagedCluster {cluster} kept changing while trying to "
                f"{action}; retry"
            )

    def ledger(self, cluster: str, op: cluster_pb2.Operation) -> None:
        """Records an operation's new state in its cluster's ledger (best effort: a failure
        is logged; the upgrade object's annotations still carry the last upgrade)."""
        try:
            self.write(cluster, add=None, record=Record.of(op))
        except (NotFound, Unavailable) as exc:
            _LOG.warning(
                "could not record the operation on the hub",
                extra={"fields": {"operation": op.id, "error": exc.message}},
            )
