"""The GKE fleet behind the contract: the selected clusters and their inventory, GKE's
operations mirrored as contract operations (polled, watched), and the RPCs routed to the
upgrade requests (upgrades.py), the plugin's own operations (local.py) and preflight."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc
from google.cloud import container_v1

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.api import GkeApi
from plugins.gke.config import GkeConfig
from plugins.gke.ids import ClusterRef, parse_cluster_id, parse_operation_id
from plugins.gke.local import LocalOperations
from plugins.gke.operations import (
    GkeOperationStore,
    Mirrored,
    blocks,
    by_start,
    contract_state,
    describe,
    progress_percent,
    timestamp,
)
from plugins.gke.policy import (
    is_autopilot,
    upgrade_plan,
)
from plugins.gke.preflight import blue_green_notice, busy_verdict, judge, verdict
from plugins.gke.state import Binding, PluginState
from plugins.gke.traffic import ServiceState, Traffic, build_traffic
from plugins.gke.upgrades import UpgradeRequests
from plugins.gke.windows import maintenance_windows
from plugins.sdk import (
    OP_CONTROL_PLANE,
    OP_NODE_POOL,
    OP_SERVICE_IN,
    OP_SERVICE_OUT,
    TERMINAL_STATES,
    InvalidArgument,
    NotFound,
    PluginError,
    kind_name,
    page_request,
    version_meets,
)

__all__ = ["GkeFleet"]

_LOG = logging.getLogger("plugins.gke.fleet")
_ClusterStatus = container_v1.Cluster.Status
_PoolStatus = container_v1.NodePool.Status
_OpStatus = container_v1.Operation.Status

_POOL_STATUS: dict[int, int] = {
    _PoolStatus.RUNNING: cluster_pb2.NODE_POOL_STATUS_READY,
    _PoolStatus.PROVISIONING: cluster_pb2.NODE_POOL_STATUS_UPGRADING,
    _PoolStatus.RECONCILING: cluster_pb2.NODE_POOL_STATUS_UPGRADING,
    _PoolStatus.STOPPING: cluster_pb2.NODE_POOL_STATUS_UPGRADING,
    _PoolStatus.RUNNING_WITH_ERROR: cluster_pb2.NODE_POOL_STATUS_ERROR,
    _PoolStatus.ERROR: cluster_pb2.NODE_POOL_STATUS_ERROR,
}
_FULL_LISTING_EVERY = 12  # poll ticks between ListClusters / ListOperations re-reads


def _status_name(value: int) -> str:
    try:
        return str(_ClusterStatus(value).name)
    except ValueError:
        return str(value)


class GkeFleet:
    """Everything the ClusterService servicer needs, over the GKE and compute APIs."""

    def __init__(self, config: GkeConfig, api: GkeApi, state: PluginState | None = None) -> None:
        self.config = config
        self.api = api
        self.state = state if state is not None else PluginState(config.operations.state_file)
        self.store = GkeOperationStore(id_prefix="gke-op")
        self._stop = threading.Event()
        self.traffic: Traffic = build_traffic(config.traffic, api, self.state, self._stop)
        self._explicit = {
            ref.id: ref for ref in (parse_cluster_id(i) for i in config.clusters.ids) if ref
        }
        self._known: dict[str, ClusterRef] = dict(self._explicit)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.local = LocalOperations(self.store, self.state, self.traffic)
        self.upgrades = UpgradeRequests(self)
        self._poller: threading.Thread | None = None
        self._lost: set[str] = set()  # in-flight operations GetOperation no longer finds
        self.local.resume()

    # --------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Reads GKE once (operations in flight become visible at once), then polls."""
        try:
            self._listing()
            self._refresh_operations(self._parents())
        except PluginError as exc:
            _LOG.warning("first read of GKE failed; the poller retries: %s", exc.message)
        self._poller = threading.Thread(target=self._poll, name="gke-operations", daemon=True)
        self._poller.start()

    def close(self) -> None:
        """Stops polling and running work, ends watch streams, closes the API sessions."""
        self._stop.set()
        self.store.close()
        self.local.close()
        if self._poller is not None:
            self._poller.join(timeout=5)
        self.api.close()

    def _poll(self) -> None:
        """Each tick asks GetOperation for the GKE operations in flight; every
        _FULL_LISTING_EVERY ticks it re-lists clusters and operations (to find operations GKE
        started by itself). ListOperations has no filter or paging, so it is not read whole
        where GetOperation suffices."""
        tick = 0
        while not self._stop.wait(self.config.operations.poll_seconds):
            tick += 1
            try:
                if tick % _FULL_LISTING_EVERY == 0:
                    self._listing()
                    self._refresh_operations(self._parents())
                else:
                    self._refresh_in_flight()
            except PluginError as exc:
                _LOG.warning("polling GKE operations failed; retrying: %s", exc.message)
            except Exception:
                _LOG.exception("polling GKE operations failed; retrying")

    def _refresh_in_flight(self) -> None:
        for op_id in self.store.in_flight_ids():
            ref = parse_operation_id(op_id)
            if ref is None:
                continue  # the plugin's own (traffic) operation: it reports itself
            try:
                self.mirror(self.api.get_operation(op_id), ref.project, force=True)
            except NotFound:
                if op_id not in self._lost:  # once: it stays in flight until GKE says more
                    self._lost.add(op_id)
                    _LOG.warning("GKE no longer knows operation %s", op_id)

    def cluster_lock(self, cluster_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster_id, threading.Lock())

    # ------------------------------------------------------------------- selection

    def _parents(self) -> list[str]:
        parents = {ref.parent for ref in self._explicit.values()}
        parents.update(
            f"projects/{d.project}/locations/{d.location}" for d in self.config.clusters.discover
        )
        return sorted(parents)

    def _may_select(self, ref: ClusterRef) -> bool:
        if ref.id in self._explicit:
            return True
        return any(
            d.project == ref.project and d.location in ("-", ref.location)
            for d in self.config.clusters.discover
        )

    def _selected(self, ref: ClusterRef, cluster: container_v1.Cluster) -> bool:
        if ref.id in self._explicit:
            return True
        labels = dict(cluster.resource_labels)
        return any(
            d.project == ref.project
            and d.location in ("-", ref.location)
            and all(labels.get(k) == v for k, v in d.match_labels.items())
            for d in self.config.clusters.discover
        )

    def cluster_ref(self, cluster_id: str) -> ClusterRef:
        ref = parse_cluster_id(cluster_id)
        if ref is None or not self._may_select(ref):
            raise NotFound(f"cluster {cluster_id} is not in the plugin's inventory")
        return ref

    def _listing(self) -> dict[str, tuple[ClusterRef, container_v1.Cluster]]:
        found: dict[str, tuple[ClusterRef, container_v1.Cluster]] = {}
        for parent in self._parents():
            project = parent.split("/")[1]
            for cluster in self.api.list_clusters(parent):
                ref = ClusterRef(project, cluster.location, cluster.name)
                if self._selected(ref, cluster):
                    found[ref.id] = (ref, cluster)
        self._known = {cid: ref for cid, (ref, _) in found.items()}
        return found

    def selected_cluster(self, ref: ClusterRef) -> container_v1.Cluster:
        try:
            cluster = self.api.get_cluster(ref)
        except NotFound:
            raise NotFound(f"cluster {ref.id} is not in the plugin's inventory") from None
        if not self._selected(ref, cluster):
            raise NotFound(f"cluster {ref.id} is not in the plugin's inventory")
        self._known[ref.id] = ref
        return cluster

    # ------------------------------------------------------------------- inventory

    def _contract_cluster(
        self, ref: ClusterRef, cluster: container_v1.Cluster, service: ServiceState
    ) -> cluster_pb2.Cluster:
        status = int(cluster.status)
        available = status == _ClusterStatus.RUNNING
        reasons = []
        if not available:
            reasons.append(f"GKE status {_status_name(status)}")
            if cluster.status_message:
                reasons[-1] += f": {cluster.status_message}"
        if service.problem:
            available = False
            reasons.append(service.problem)
        # Autopilot: GKE upgrades the nodes itself, so no pool is offered for manual upgrade.
        pools = [] if is_autopilot(cluster) else list(cluster.node_pools)
        result = cluster_pb2.Cluster(
            id=ref.id,
            labels=dict(cluster.resource_labels),
            control_plane_version=cluster.current_master_version,
            node_pools=[_contract_pool(pool) for pool in pools],
            available=available,
            unavailable_reason="; ".join(reasons),
            in_service=service.in_service,
            maintenance_windows=maintenance_windows(cluster),
        )
        current = self.store.in_flight(ref.id)
        if current is not None:
            result.current_operation.CopyFrom(current)
        return result

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the selected clusters whose labels include match_labels, by id."""
        paging = page_request(page_size, page_token)  # refused before anything is read
        listing = self._listing()
        self._refresh_operations(self._parents())
        page = paging.page(
            cid
            for cid, (_, cluster) in listing.items()
            if all(cluster.resource_labels.get(k) == v for k, v in match_labels.items())
        )
        service = self.traffic.in_service(page.keys) if page.keys else {}
        clusters = [self._contract_cluster(*listing[cid], service[cid]) for cid in page.keys]
        return cluster_pb2.ListClustersResponse(
            clusters=clusters,
            next_page_token=page.next_page_token,
            total_size=page.total_size,
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """One selected cluster; NotFound for anything else."""
        ref = self.cluster_ref(cluster_id)
        cluster = self.selected_cluster(ref)
        self._refresh_operations([ref.parent])
        return cluster_pb2.GetClusterResponse(
            cluster=self._contract_cluster(ref, cluster, self.traffic.in_service([ref.id])[ref.id])
        )

    # ----------------------------------------------------------- operations of GKE

    def _refresh_operations(self, parents: Iterable[str]) -> None:
        for parent in parents:
            project = parent.split("/")[1]
            listing = self.api.list_operations(parent)
            if listing.missing_zones:
                # Operations there are missing from the answer; none is taken for ended
                # (an operation ends only when GKE reports it DONE).
                _LOG.warning(
                    "ListOperations %s: GKE could not reach zones %s",
                    parent,
                    ", ".join(listing.missing_zones),
                )
            for gke_op in by_start(listing.operations):
                self.mirror(gke_op, project)

    def mirror(
        self, gke_op: container_v1.Operation, project: str, *, force: bool = False
    ) -> cluster_pb2.Operation | None:
        """Records a GKE operation the plugin follows (its own, a bound one, or one in flight
        on a selected cluster; any with force) and returns its contract form."""
        info = describe(gke_op, project)
        if info is None or not info.kind:
            return None
        cluster_id = ClusterRef(project, info.location, info.cluster).id
        stored = self.store.known(info.op_id)
        bound = self.state.request_of(info.op_id)
        followed = force or stored is not None or bound is not None
        if not followed and (not info.in_flight or cluster_id not in self._known):
            return None
        if stored is not None and stored.state in TERMINAL_STATES:
            return stored
        state, code, message = contract_state(gke_op, info.op_id)
        op = cluster_pb2.Operation(
            id=info.op_id,
            kind=info.kind,  # type: ignore[arg-type]
            cluster_id=cluster_id,
            node_pool=info.node_pool,
            state=state,  # type: ignore[arg-type]
            progress_percent=progress_percent(gke_op),
            error_code=code,
            error_message=message,
        )
        if bound is not None:
            op.request_id, binding = bound
            op.target_version = binding.version
            if binding.adopted and state == cluster_pb2.OPERATION_STATE_SUCCEEDED:
                self._check_adopted_target(op, binding)
        op.start_time.CopyFrom(timestamp(gke_op.start_time))
        if op.state in TERMINAL_STATES:
            op.end_time.CopyFrom(timestamp(gke_op.end_time))
        return self.store.record(op)

    def _check_adopted_target(self, op: cluster_pb2.Operation, binding: Binding) -> None:
        """An adopted operation was not started for the request: succeed only if what it
        reached meets the requested version (an auto-upgrade may land past it)."""
        ref = parse_cluster_id(binding.cluster_id)
        if ref is None:
            return
        cluster = self.api.get_cluster(ref)
        reached = cluster.current_master_version
        if binding.node_pool:
            pool = next((p for p in cluster.node_pools if p.name == binding.node_pool), None)
            reached = pool.version if pool is not None else ""
        if not reached or not version_meets(reached, binding.version):
            op.state = cluster_pb2.OPERATION_STATE_FAILED
            op.error_code = "TARGET_NOT_REACHED"
            op.error_message = (
                f"GKE operation {op.id} ended with {binding.node_pool or 'the control plane'} "
                f"at {reached or 'an unknown version'}, short of {binding.version}; it was "
                "already running when the request came, so ask again"
            )

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation's current state: GKE's for GKE operations, the plugin's own else."""
        ref = parse_operation_id(op_id)
        stored = self.store.known(op_id)
        if ref is None or (stored is not None and stored.state in TERMINAL_STATES):
            if stored is None:
                raise NotFound(f"operation {op_id} not found")
            return stored
        try:
            gke_op = self.api.get_operation(op_id)
        except NotFound:
            raise NotFound(f"operation {op_id} not found") from None
        mirrored = self.mirror(gke_op, ref.project, force=True)
        if mirrored is None:
            raise NotFound(
                f"operation {op_id} is a GKE operation of a kind this plugin does not report"
            )
        return mirrored

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Updates of operations (GKE's arrive at each poll) until the caller cancels."""
        return self.store.watch(cluster_ids, include_in_flight, context)

    # -------------------------------------------------------------------- upgrades

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeControlPlane by the contract's rules (caller: unused)."""
        return self.upgrades.upgrade(OP_CONTROL_PLANE, request_id, cluster_id, "", version)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeNodePool by the contract's rules (caller: unused)."""
        return self.upgrades.upgrade(OP_NODE_POOL, request_id, cluster_id, node_pool, version)

    # ---------------------------------------------------------------------- traffic

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """ServiceOut by the contract's rules (caller: unused)."""
        return self._service(OP_SERVICE_OUT, request_id, cluster_id)

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """ServiceIn by the contract's rules (caller: unused)."""
        return self._service(OP_SERVICE_IN, request_id, cluster_id)

    def _service(self, kind: int, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """ServiceOut (kind OUT) or ServiceIn (kind IN) by the contract's rules."""
        ref = self.cluster_ref(cluster_id)
        with self.cluster_lock(cluster_id):
            existing = self.store.lookup(request_id)
            if existing is not None:
                if existing.kind != kind or existing.cluster_id != cluster_id:
                    raise InvalidArgument(
                        "request_id",
                        f"reused for a different request (it started operation {existing.id} "
                        f"on cluster {existing.cluster_id}); choose a new request_id per change",
                    )
                return existing
            self.selected_cluster(ref)
            self._refresh_operations([ref.parent])
            self.store.ensure_free(cluster_id)
            return self.local.service_change(kind, request_id, cluster_id)

    # -------------------------------------------------------------------- preflight

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """PreflightUpgrade: GKE's rules against GetServerConfig and the cluster (REFUSED_NEVER),
        then the operations in flight and the opt-in exclusion policy (REFUSED_LATER); an
        ACCEPTED answer notes a blue-green pool's expected soak (BLUE_GREEN_UPGRADE).
        Read-only: ListOperations and GetServerConfig, never a mutation."""
        ref = self.cluster_ref(cluster_id)
        cluster = self.selected_cluster(ref)
        config = self.api.server_config(ref.parent)
        changing: list[str] = []
        refusal = judge(
            cluster_id,
            cluster,
            config,
            ref.location,
            control_plane_version,
            node_pool_versions,
            respect_exclusions=self.config.upgrades.respect_maintenance_exclusions,
            changing=changing,
        )
        if refusal is None or refusal.retryable:
            running, _ = self.upgrades.gke_in_flight(ref)
            infos = [info for _, info in running if blocks(info, node_pool_versions)]
            own = self.store.in_flight(cluster_id)
            if own is not None and all(info.op_id != own.id for info in infos):
                infos.append(
                    Mirrored(
                        own.id,
                        ref.location,
                        ref.name,
                        own.node_pool,
                        own.kind,
                        kind_name(own.kind),
                        True,
                    )
                )
            busy = busy_verdict(cluster_id, infos)
            if busy is not None:
                return busy
        if refusal is None:
            notice = blue_green_notice(cluster_id, cluster, changing)
            if notice is not None:
                return notice
        return verdict(refusal)

    # ------------------------------------------------------------------------ probe

    def probe(self) -> tuple[bool, str]:
        """(ready, why not): GKE answers a cluster listing of the first configured location."""
        parents = self._parents()
        if not parents:
            return False, "no clusters configured"
        started = time.monotonic()
        try:
            self.api.list_clusters(parents[0])
        except PluginError as exc:
            return False, f"GKE is not reachable: {exc.message}"
        _LOG.debug("probe ok", extra={"fields": {"seconds": round(time.monotonic() - started, 3)}})
        return True, ""


def _contract_pool(pool: container_v1.NodePool) -> cluster_pb2.NodePool:
    """A node pool as the contract reports it, with its upgrade strategy and soak."""
    strategy, soak = upgrade_plan(pool)
    return cluster_pb2.NodePool(
        name=pool.name,
        version=pool.version,
        status=_POOL_STATUS.get(  # type: ignore[arg-type]
            int(pool.status), cluster_pb2.NODE_POOL_STATUS_UNSPECIFIED
        ),
        upgrade_strategy=strategy,
        upgrade_soak_seconds=soak,
    )
