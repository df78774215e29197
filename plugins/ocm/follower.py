"""Operations after they start: adopted back after a restart, and followed to their end.

One thread per hub, woken by any cache change and by a short tick (for timeouts), evaluates
every in-flight operation of the hub: a taint operation ends when the cache shows the taint;
an upgrade by its ClusterCurator or ManifestWork (curator.py, work.py) and the cluster's
version. An upgrade's end is recorded in the cluster's ledger (taints.py writes it). Before a
restarted plugin answers, `adopt` puts the operations recorded on the hub back in the store:
the ledgers first, then upgrades our objects carry that no ledger holds yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm import curator, inventory, work
from plugins.ocm.caches import HubCaches
from plugins.ocm.ledger import Record, operation_id_for, read_ledger
from plugins.ocm.objects import (
    ANNOTATION_OPERATION_ID,
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    ANNOTATION_TARGET_VERSION,
    Verdict,
    annotations_of,
    parse_time,
    timed_out,
)
from plugins.ocm.taints import Taints
from plugins.sdk import OperationStore

__all__ = ["Follower"]

_LOG = logging.getLogger("plugins.ocm.follower")
_FOLLOW_TICK = 0.5  # seconds between re-evaluations when no cache changes (for timeouts)

_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_UPGRADE = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED


@dataclass
class _Followed:
    """What the follower needs about an upgrade besides the Operation itself."""

    started: datetime
    seen: bool = False


class Follower:
    """The hub's in-flight operations: adoption after a restart, and the follow thread.

    wake: the event every cache change sets; the thread waits on it.
    """

    def __init__(
        self,
        caches: HubCaches,
        store: OperationStore,
        taints: Taints,
        wake: threading.Event,
    ) -> None:
        self.cfg = caches.cfg
        self._caches = caches
        self._store = store
        self._taints = taints
        self._wake = wake
        self._stop = threading.Event()
        self._followed: dict[str, _Followed] = {}
        self._followed_lock = threading.Lock()
        self._adopted = False
        self._adopt_lock = threading.Lock()
        self._thread = threading.Thread(target=self._follow_loop, name="ocm-follow", daemon=True)

    def start(self) -> None:
        """Starts the follow thread."""
        self._thread.start()

    def stop(self) -> None:
        """Asks the follow thread to end (join waits for it)."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Waits up to timeout for the follow thread to end."""
        self._thread.join(timeout=timeout)

    def follow(self, op_id: str, started: datetime, *, seen: bool = False) -> None:
        """Follows an upgrade from started; seen: its upgrade object was seen already (one
        adopted after a restart), so its disappearance fails the upgrade."""
        with self._followed_lock:
            self._followed[op_id] = _Followed(started, seen)

    @property
    def adopted(self) -> bool:
        """True once the operations recorded on the hub are back in the store."""
        return self._adopted

    def adopt(self) -> None:
        """Once, after the caches listed: puts the operations recorded on the hub back in the
        store (the ledgers, then upgrades our objects carry that no ledger holds yet)."""
        if self._adopted:
            return
        with self._adopt_lock:
            if self._adopted or not self._caches.synced:
                return
            for cached in self._caches.clusters.items():
                self._restore_ledger(str(cached.obj["metadata"]["name"]), read_ledger(cached.obj))
            for cluster, obj in self._caches.upgrade_objects():
                self._adopt_upgrade(cluster, obj)
            self._adopted = True

    def _restore_ledger(self, cluster: str, records: Sequence[Record]) -> None:
        """Puts a cluster's recorded operations in the store, oldest first.

        Only an upgrade can be recorded RUNNING (its end is recorded when the follower sees
        it). Only the newest record can still run; an older RUNNING one lost its end (the
        plugin stopped between the end and its record, and the upgrade object moved on): it
        comes back FAILED, RESULT_LOST.
        """
        cluster_id = self._caches.qualified(cluster)
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
                self.follow(op.id, started, seen=True)

    def _adopt_upgrade(self, cluster: str, obj: Mapping[str, Any]) -> None:
        notes = annotations_of(obj)
        request_id = notes.get(ANNOTATION_REQUEST_ID)
        target = notes.get(ANNOTATION_TARGET_VERSION)
        cluster_id = self._caches.qualified(cluster)
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
        self.follow(op.id, started, seen=True)
        # An upgrade that ended before the restart is not written back to the ledger (it
        # was left out of it, or made room for newer records); one still running will be.
        self._evaluate(op, record=False)
        _LOG.info(
            "adopted an upgrade started before a restart",
            extra={"fields": {"cluster": cluster_id, "operation": op.id}},
        )

    def _follow_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(_FOLLOW_TICK)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self._caches.synced:
                    self.adopt()
                for op in self._store.all_in_flight():
                    if self._caches.mine(op.cluster_id):
                        self._evaluate(op)
            except Exception:  # the follower must survive anything one object does to it
                _LOG.exception("following operations failed; trying again")

    def _evaluate(self, op: cluster_pb2.Operation, record: bool = True) -> None:
        cluster_name = self._caches.local(op.cluster_id)
        cluster = self._caches.clusters.get("", cluster_name)
        if op.kind in (_SERVICE_OUT, _SERVICE_IN):
            if cluster is None:
                verdict = Verdict(_FAILED, 0, "CLUSTER_GONE", "the ManagedCluster was deleted")
            elif inventory.has_our_taint(cluster.obj, self.cfg.taint) == (op.kind == _SERVICE_OUT):
                if op.kind == _SERVICE_OUT and self._caches.selecting(cluster_name):
                    # Out only once the placement controller has dropped it (asynchronously)
                    # from every Placement that does not tolerate the taint; the orchestrator's
                    # step timeout bounds the wait.
                    verdict = Verdict(_RUNNING, 50)
                else:
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
                self._taints.ledger(cluster_name, updated)  # a taint record needs no end: see adopt
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
        obj = self._caches.upgrade_object(self._caches.local(op.cluster_id))
        what = "ClusterCurator" if self._caches.curators is not None else "upgrade ManifestWork"
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
        version = self._caches.version(cluster)
        if self._caches.curators is not None:
            return curator.curator_verdict(
                obj, version, op.target_version, followed.started, now, self.cfg
            )
        return work.work_verdict(obj, version, op.target_version, followed.started, now, self.cfg)
