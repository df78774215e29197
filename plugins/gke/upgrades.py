"""Upgrade requests against GKE: the request_id's operation found again (also after a
restart), GKE's in-flight operations adopted or named in an ABORTED, aliases resolved, GKE's
rules checked, then UpdateMaster / UpdateNodePool called once."""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import UTC, datetime
from typing import Protocol

from google.cloud import container_v1

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.api import ClusterBusy, GkeApi
from plugins.gke.config import GkeConfig
from plugins.gke.ids import ClusterRef, OperationRef, parse_operation_id
from plugins.gke.local import LocalOperations
from plugins.gke.operations import (
    ADOPTABLE_TYPES,
    GkeOperationStore,
    Mirrored,
    blocks,
    by_start,
    contract_state,
    describe,
    timestamp,
)
from plugins.gke.policy import (
    autopilot_refusal,
    check_control_plane,
    check_node_pool,
    exclusion_refusal,
    is_autopilot,
    resolve_control_plane,
    resolve_node_pool,
)
from plugins.gke.state import Binding, PluginState
from plugins.sdk import (
    OP_CONTROL_PLANE,
    OP_NODE_POOL,
    TERMINAL_STATES,
    Conflict,
    InvalidArgument,
    NotFound,
    PluginError,
    Unavailable,
    parse_version,
)

__all__ = ["FleetView", "UpgradeRequests"]

_LOG = logging.getLogger("plugins.gke.upgrades")


def _covers(zone: str, location: str) -> bool:
    """True when a zone GKE could not reach may hold operations of a cluster in location."""
    return zone == location or zone.startswith(location + "-") or location.startswith(zone + "-")


class FleetView(Protocol):
    """What upgrade requests use of the fleet: its clients, records and cluster selection."""

    @property
    def api(self) -> GkeApi: ...

    @property
    def config(self) -> GkeConfig: ...

    @property
    def state(self) -> PluginState: ...

    @property
    def store(self) -> GkeOperationStore: ...

    @property
    def local(self) -> LocalOperations: ...

    def cluster_ref(self, cluster_id: str) -> ClusterRef: ...

    def cluster_lock(self, cluster_id: str) -> threading.Lock: ...

    def selected_cluster(self, ref: ClusterRef) -> container_v1.Cluster: ...

    def mirror(
        self, gke_op: container_v1.Operation, project: str, *, force: bool = False
    ) -> cluster_pb2.Operation | None: ...

    def get_operation(self, op_id: str) -> cluster_pb2.Operation: ...


class UpgradeRequests:
    """UpgradeControlPlane and UpgradeNodePool by the contract's rules, over a fleet."""

    def __init__(self, fleet: FleetView) -> None:
        self._fleet = fleet

    def _existing(
        self, request_id: str, kind: int, cluster_id: str, node_pool: str, version: str
    ) -> cluster_pb2.Operation | None:
        op = self._fleet.store.lookup(request_id)
        binding = self._fleet.state.binding(request_id)
        if op is None:
            if binding is None:
                return None
            if parse_operation_id(binding.op_id) is None:
                return None  # a local operation the store does not know: forgotten
            try:
                op = self._fleet.get_operation(binding.op_id)
            except NotFound:
                return None
            op = self._fleet.store.bind(request_id, op.id, binding.version)
        same = (
            op.kind == kind
            and op.cluster_id == cluster_id
            and op.node_pool == node_pool
            and (
                not version
                or op.target_version == version
                or (binding is not None and binding.requested == version)
            )
        )
        if not same:
            raise InvalidArgument(
                "request_id",
                f"reused for a different request (it started operation {op.id} on cluster "
                f"{op.cluster_id}); choose a new request_id per change",
            )
        if op.state not in TERMINAL_STATES and parse_operation_id(op.id) is not None:
            return self._fleet.get_operation(op.id)
        return op

    def gke_in_flight(
        self, ref: ClusterRef
    ) -> tuple[list[tuple[container_v1.Operation, Mirrored]], list[container_v1.Operation]]:
        """(in flight, done) GKE operations on the cluster, oldest first by start time
        (ListOperations has no documented order). Unavailable when GKE could not reach a zone
        that may hold the cluster's operations: a busy cluster would look free."""
        listing = self._fleet.api.list_operations(ref.parent)
        missing = [z for z in listing.missing_zones if _covers(z, ref.location)]
        if missing:
            raise Unavailable(
                f"ListOperations {ref.parent}: GKE could not reach zone(s) {', '.join(missing)} "
                f"of cluster {ref.id}, so its running operations are unknown; retry"
            )
        running: list[tuple[container_v1.Operation, Mirrored]] = []
        done: list[container_v1.Operation] = []
        for gke_op in by_start(listing.operations):
            info = describe(gke_op, ref.project)
            if info is None or info.cluster != ref.name or info.location != ref.location:
                continue
            if info.in_flight:
                running.append((gke_op, info))
            else:
                done.append(gke_op)
        return running, done

    def _busy(self, cluster_id: str, running: list[Mirrored]) -> Conflict:
        """ABORTED naming every operation in flight on the cluster (the oldest first)."""
        names = "; ".join(f"{info.op_id} ({info.what})" for info in running)
        return Conflict(
            f"cluster {cluster_id} has GKE operation(s) in flight: {names}; GKE runs one "
            "cluster operation at a time: wait until they end, then retry",
            running[0].op_id,
        )

    def _gke_busy(self, ref: ClusterRef, exc: ClusterBusy) -> PluginError:
        """GKE's own "another operation is running" answer (one started between the plugin's
        look and its call): ABORTED naming it, and the operation mirrored. When GKE said so by
        reason only, the operation is found in ListOperations (UNAVAILABLE if none is)."""
        if exc.operation_id:
            op_id = OperationRef(ref.project, ref.location, exc.operation_id).id
            with contextlib.suppress(PluginError):  # named all the same
                self._fleet.mirror(self._fleet.api.get_operation(op_id), ref.project, force=True)
        else:
            running, _ = self.gke_in_flight(ref)
            if not running:
                return Unavailable(
                    f"cluster {ref.id}: GKE answered that another operation is running "
                    f"({exc.message}) but lists none in flight; retry"
                )
            for gke_op, _info in running:
                self._fleet.mirror(gke_op, ref.project, force=True)
            op_id = running[0][1].op_id
        return Conflict(
            f"cluster {ref.id} is running GKE operation {op_id} (GKE answered "
            f"FAILED_PRECONDITION: {exc.message.split('GKE answered: ', 1)[-1]}); wait until "
            "it ends, then retry",
            op_id,
        )

    def _bound_elsewhere(self, op_id: str, request_id: str) -> bool:
        stored = self._fleet.store.known(op_id)
        if stored is not None and stored.request_id and stored.request_id != request_id:
            return True
        bound = self._fleet.state.request_of(op_id)
        return bound is not None and bound[0] != request_id

    def _adopt(
        self,
        request_id: str,
        gke_op: container_v1.Operation,
        info: Mirrored,
        cluster_id: str,
        version: str,
        requested: str = "",
    ) -> cluster_pb2.Operation:
        binding = Binding(
            info.op_id, info.kind, cluster_id, info.node_pool, version, True, requested
        )
        self._fleet.state.bind(request_id, binding)
        project = cluster_id.split("/")[1]
        op = self._fleet.mirror(gke_op, project, force=True)
        assert op is not None
        _LOG.info(
            "request bound to a GKE operation found in flight",
            extra={"fields": {"request_id": request_id, "operation": info.op_id}},
        )
        return self._fleet.store.bind(request_id, op.id, version)

    def upgrade(
        self, kind: int, request_id: str, cluster_id: str, node_pool: str, requested: str
    ) -> cluster_pb2.Operation:
        """UpgradeControlPlane (kind CP) or UpgradeNodePool (kind NP) by the contract's rules.

        requested may be one of GKE's aliases; it is resolved from GetServerConfig to the
        explicit version GKE would pick, which is what the operation targets.
        """
        ref = self._fleet.cluster_ref(cluster_id)
        with self._fleet.cluster_lock(cluster_id):
            existing = self._existing(request_id, kind, cluster_id, node_pool, requested)
            if existing is not None:
                return existing
            cluster = self._fleet.selected_cluster(ref)
            pool = None
            if kind == OP_NODE_POOL:
                if is_autopilot(cluster):
                    raise autopilot_refusal(cluster_id)
                pool = next((p for p in cluster.node_pools if p.name == node_pool), None)
                if pool is None:
                    raise NotFound(f"node pool {node_pool} not found in cluster {cluster_id}")
            config = self._fleet.api.server_config(ref.parent)
            version = (
                resolve_control_plane(cluster, config, requested)
                if pool is None
                else resolve_node_pool(cluster, config, requested)
            )
            alias = requested if requested != version else ""
            running, done = self.gke_in_flight(ref)
            for gke_op, info in running:
                same = info.kind == kind and (
                    kind == OP_CONTROL_PLANE or info.node_pool == node_pool
                )
                same = same and info.type_name in ADOPTABLE_TYPES
                if same and not self._bound_elsewhere(info.op_id, request_id):
                    return self._adopt(request_id, gke_op, info, cluster_id, version, alias)
            pools = [node_pool] if pool is not None else []
            blocking = [(op, info) for op, info in running if blocks(info, pools)]
            if blocking:
                for gke_op, info in blocking:
                    if info.kind:
                        self._fleet.mirror(gke_op, ref.project, force=True)
                raise self._busy(cluster_id, [info for _, info in blocking])
            self._fleet.store.ensure_free(cluster_id)
            current = pool.version if pool is not None else cluster.current_master_version
            if version == current:
                recent = self._recent_done(ref, done, kind, node_pool, request_id)
                if recent is not None:
                    return self._adopt(request_id, *recent, cluster_id, version, alias)
                return self._fleet.local.done_at_once(
                    request_id, kind, cluster_id, node_pool, version, alias
                )
            if pool is None:
                check_control_plane(cluster_id, cluster, version, config, ref.location)
            else:
                check_node_pool(cluster_id, cluster, pool, version, config, ref.location)
            if self._fleet.config.upgrades.respect_maintenance_exclusions:
                minor = parse_version(version)[:2] != parse_version(current)[:2]
                refusal = exclusion_refusal(cluster_id, cluster, minor=minor, node=pool is not None)
                if refusal is not None:
                    raise refusal
            try:
                if pool is None:
                    gke_op = self._fleet.api.update_master(ref, version)
                else:
                    image_type = pool.config.image_type or config.default_image_type
                    gke_op = self._fleet.api.update_node_pool(ref, pool.name, version, image_type)
            except ClusterBusy as exc:
                raise self._gke_busy(ref, exc) from None
            started = describe(gke_op, ref.project)
            if started is None:
                raise PluginError(f"GKE answered an operation without a target for {cluster_id}")
            self._fleet.state.bind(
                request_id,
                Binding(started.op_id, kind, cluster_id, node_pool, version, requested=alias),
            )
            _LOG.info(
                "GKE upgrade started",
                extra={
                    "fields": {
                        "request_id": request_id,
                        "operation": started.op_id,
                        "cluster": cluster_id,
                        "node_pool": node_pool,
                        "version": version,
                        "requested": requested,
                    }
                },
            )
            op = self._fleet.mirror(gke_op, ref.project, force=True)
            assert op is not None
            return op

    def _recent_done(
        self,
        ref: ClusterRef,
        done: list[container_v1.Operation],
        kind: int,
        node_pool: str,
        request_id: str,
    ) -> tuple[container_v1.Operation, Mirrored] | None:
        """The newest successful GKE operation of this kind and target that ended within the
        adoption window and serves no other request."""
        window = self._fleet.config.operations.adopt_done_within_seconds
        if window <= 0:
            return None
        now = datetime.now(UTC).timestamp()
        newest_first = sorted(
            done, key=lambda op: timestamp(op.end_time).ToNanoseconds(), reverse=True
        )
        for gke_op in newest_first:
            info = describe(gke_op, ref.project)
            if (
                info is None
                or info.kind != kind
                or (kind == OP_NODE_POOL and info.node_pool != node_pool)
            ):
                continue
            state, _, _ = contract_state(gke_op)
            if state != cluster_pb2.OPERATION_STATE_SUCCEEDED:
                continue
            ended = timestamp(gke_op.end_time).ToDatetime(tzinfo=UTC).timestamp()
            if now - ended > window:
                continue
            if self._bound_elsewhere(info.op_id, request_id):
                continue
            return gke_op, info
        return None
