"""The simulated fleet: cluster state, operations that advance on timers, faults, health data."""

from __future__ import annotations

import bisect
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import grpc
from google.protobuf import timestamp_pb2

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.sdk import (
    TERMINAL_STATES,
    FailedPrecondition,
    NotFound,
    OperationStore,
    Reason,
    RevisionLog,
    check_page_size,
    compare_versions,
    decode_page_token,
    encode_page_token,
    is_newer_version,
    kind_name,
    parse_version,
    verdict_of_check,
)
from plugins.sim.config import (
    DEFAULT_STEP_SECONDS,
    AvailabilityFlap,
    ClusterSpec,
    ConfigError,
    Defaults,
    Faults,
    FleetConfig,
    MaintenanceWindowSpec,
    OutOfBandUpgrade,
    StepKind,
    WorkloadSpec,
)
from plugins.sim.faults import RpcFaults
from plugins.sim.health import Workload, render_query, verdict, workload_of
from plugins.sim.monitor import ClusterView, InvariantMonitor, StepKey
from plugins.sim.scheduler import Scheduler

__all__ = ["Fleet", "RpcFaults", "render_query"]

_LOG = logging.getLogger("plugins.sim.fleet")

_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN
_CP = cluster_pb2.OPERATION_KIND_UPGRADE_CONTROL_PLANE
_NP = cluster_pb2.OPERATION_KIND_UPGRADE_NODE_POOL
_PENDING = cluster_pb2.OPERATION_STATE_PENDING
_RUNNING = cluster_pb2.OPERATION_STATE_RUNNING
_SUCCEEDED = cluster_pb2.OPERATION_STATE_SUCCEEDED
_FAILED = cluster_pb2.OPERATION_STATE_FAILED
_READY = cluster_pb2.NODE_POOL_STATUS_READY
_UPGRADING = cluster_pb2.NODE_POOL_STATUS_UPGRADING

_STEP_OF_KIND: dict[int, StepKind] = {
    _OUT: "serviceOut",
    _IN: "serviceIn",
    _CP: "controlPlane",
    _NP: "nodePool",
}
_ERROR_CODES: dict[StepKind, str] = {
    "serviceOut": "SERVICE_OUT_FAILED",
    "serviceIn": "SERVICE_IN_FAILED",
    "controlPlane": "UPGRADE_FAILED",
    "nodePool": "UPGRADE_FAILED",
}
# Why a cluster is unavailable, by source; a cluster is available when it has no reason.
_DOWN_UPGRADE = "upgrade"
_DOWN_FLAP = "flap"
_DOWN_ADMIN = "admin"
_FLAP_REASON = "simulated availability flap (fault availabilityFlaps)"
_METHOD_OF_KIND: dict[int, str] = {
    _OUT: "ServiceOut",
    _IN: "ServiceIn",
    _CP: "UpgradeControlPlane",
    _NP: "UpgradeNodePool",
}
_WINDOW_KINDS = {
    "window": cluster_pb2.MAINTENANCE_WINDOW_KIND_WINDOW,
    "exclusion": cluster_pb2.MAINTENANCE_WINDOW_KIND_EXCLUSION,
}
_LABEL_CACHE_MAX = 256


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


@dataclass(slots=True)
class _Pool:
    version: str
    status: int


class _Cluster:
    """One cluster's mutable state and its cached GetClusterResponse (rebuilt after a change)."""

    __slots__ = (
        "cluster_id",
        "cp_version",
        "down",
        "health_time",
        "in_service",
        "labels",
        "metrics",
        "op",
        "pools",
        "response",
        "step_seconds",
        "windows",
        "workloads",
    )

    def __init__(self, spec: ClusterSpec) -> None:
        self.cluster_id = spec.id
        self.labels: dict[str, str] = dict(spec.labels)
        self.cp_version = spec.control_plane_version
        self.pools: dict[str, _Pool] = {p.name: _Pool(p.version, _READY) for p in spec.node_pools}
        self.in_service = spec.in_service
        self.down: dict[str, str] = {}
        if not spec.available:
            self.down[_DOWN_ADMIN] = "unavailable in the fleet file"
        self.step_seconds = spec.step_seconds
        self.windows: tuple[MaintenanceWindowSpec, ...] = spec.maintenance_windows
        self.workloads: dict[tuple[str, str], Workload] = {}
        self.metrics: dict[str, float] = {}
        self.health_time = _now()
        self.op: cluster_pb2.Operation | None = None
        self.response: cluster_pb2.GetClusterResponse | None = None

    def view(self) -> ClusterView:
        return ClusterView(
            available_in_service=self.in_service and not self.down,
            control_plane_version=self.cp_version,
            node_pool_versions=tuple(p.version for p in self.pools.values()),
        )

    def build_response(self) -> cluster_pb2.GetClusterResponse:
        response = cluster_pb2.GetClusterResponse()
        pb = response.cluster
        pb.id = self.cluster_id
        pb.labels.update(self.labels)
        pb.control_plane_version = self.cp_version
        for name, pool in self.pools.items():
            pb.node_pools.add(name=name, version=pool.version, status=pool.status)
        pb.available = not self.down
        pb.unavailable_reason = "; ".join(self.down[k] for k in sorted(self.down))
        pb.in_service = self.in_service
        if self.op is not None:
            pb.current_operation.CopyFrom(self.op)
        for window in self.windows:
            entry = pb.maintenance_windows.add(
                kind=_WINDOW_KINDS[window.kind],
                name=window.name,
                recurrence=window.recurrence,
                scope=window.scope,
            )
            entry.start_time.FromDatetime(window.start)
            entry.end_time.FromDatetime(window.end)
        return response


@dataclass(slots=True)
class _Run:
    """An operation in flight: what it changes and how it ends."""

    cluster_id: str
    kind: int
    node_pool: str
    version: str
    failure: tuple[str, str] | None  # (error_code, error_message) when it is to fail
    hang: bool = False  # never ends by itself (fault hangStep)
    forget: bool = False  # forgotten when it would end (fault forgetStep)
    ends_at: float = math.inf  # time.monotonic() of its end


class Fleet:
    """The clusters, their operations and health, and the faults, behind one lock.

    Operations go PENDING → RUNNING (at 10% of the step's duration) → SUCCEEDED/FAILED (at
    100%), driven by one Scheduler thread. A control plane is unavailable while its upgrade
    runs; a node pool is UPGRADING while its upgrade runs.
    """

    def __init__(
        self,
        config: FleetConfig,
        *,
        monitor: InvariantMonitor | None = None,
        step_seconds: float | None = None,
        seed: int | None = None,
        op_prefix: str = "sim",
        state_path: str | Path | None = None,
    ) -> None:
        self.monitor = monitor or InvariantMonitor()
        self.operations = OperationStore(op_prefix, state_path=state_path)
        self._lock = threading.RLock()
        self._scheduler = Scheduler()
        self._closing = threading.Event()
        self._rng = random.Random(seed)
        self._seed = seed
        self._step_override = step_seconds
        self._clusters: dict[str, _Cluster] = {}
        self._ids: list[str] = []
        # The inventory's revisions (ListClusters changed_since; a restarted plugin answers
        # an older revision with every cluster).
        self._revisions = RevisionLog()
        self._label_cache: dict[frozenset[tuple[str, str]], list[str]] = {}
        self._runs: dict[str, _Run] = {}
        self._flap_generation = 0
        self._defaults = Defaults()
        self._fleet_metrics: dict[str, float] = {}
        self._fail_left: dict[tuple[str, int, str], int] = {}
        self._oob_generation = 0
        self._config = config
        self.rpc_faults = RpcFaults(0.0, (), (), seed, self._closing)
        # What a journal from an earlier run did to each cluster: SUCCEEDED operations in
        # the order they ended, applied when the cluster is loaded.
        self._replay: dict[str, list[cluster_pb2.Operation]] = {}
        for op in self.operations.operations():
            if op.state == _SUCCEEDED:
                self._replay.setdefault(op.cluster_id, []).append(op)
        self.apply_config(config)
        self._replay.clear()
        self._resume_recovered()

    # -- configuration ---------------------------------------------------------------------

    def apply_config(self, config: FleetConfig) -> None:
        """Loads a fleet file's content; on reload, existing clusters keep their simulated
        versions, traffic state and operations, and take labels, step durations, health
        data and faults from the file. New clusters are added; missing ones stay."""
        specs = config.all_clusters()
        added: list[ClusterView] = []
        with self._lock:
            self._config = config
            self._defaults = config.defaults
            self._fleet_metrics = dict(config.metrics)
            for spec in specs:
                cluster = self._clusters.get(spec.id)
                if cluster is None:
                    cluster = _Cluster(spec)
                    for op in self._replay.get(spec.id, ()):
                        _apply_success(cluster, op.kind, op.node_pool, op.target_version)
                    self._clusters[spec.id] = cluster
                    self._touch(cluster)
                    added.append(cluster.view())
                else:
                    cluster.labels = dict(spec.labels)
                    cluster.step_seconds = spec.step_seconds
                    cluster.windows = spec.maintenance_windows
                    self._touch(cluster)
                self._load_health(cluster, spec)
            if added:
                self._ids = sorted(self._clusters)
            self._label_cache.clear()
            self._start_faults(config.faults)
        if added:
            self.monitor.add_clusters(added)

    def set_faults(self, faults: Faults) -> None:
        """Replaces the faults now (admin PUT /faults), leaving clusters and health data as
        they are; counters (times) start over, flaps and out-of-band upgrades are rescheduled.
        ConfigError when a fault names a cluster the fleet does not have."""
        unknown = sorted(
            {
                cluster_id
                for group in (
                    faults.fail_step,
                    faults.hang_step,
                    faults.forget_step,
                    faults.refuse_versions,
                    faults.unhealthy_after_upgrade,
                    faults.availability_flaps,
                    faults.out_of_band_upgrades,
                )
                for rule in group
                for cluster_id in rule.clusters
                if cluster_id not in self._clusters
            }
        )
        if unknown:
            raise ConfigError(
                f"faults: unknown cluster id(s) {', '.join(unknown)}; use ids the fleet has"
            )
        with self._lock:
            self._config = self._config.model_copy(update={"faults": faults})
            self._start_faults(faults)

    def _start_faults(self, faults: Faults) -> None:
        self._fail_left = {}
        self._restart_flaps(faults.availability_flaps)
        self.rpc_faults = RpcFaults(
            faults.unavailable_rate,
            faults.unavailable_methods,
            faults.hang_rpc,
            self._seed,
            self._closing,
            faults.rpc_errors,
        )
        self._schedule_out_of_band(faults.out_of_band_upgrades)

    def _load_health(self, cluster: _Cluster, spec: ClusterSpec) -> None:
        workloads = spec.workloads if spec.workloads is not None else self._defaults.workloads
        cluster.workloads = {(w.namespace, w.name): workload_of(w) for w in workloads}
        if spec.metrics is not None:
            cluster.metrics = dict(spec.metrics)
        else:
            args = {"cluster": cluster.cluster_id, **cluster.labels}
            cluster.metrics = {render_query(q, args): v for q, v in self._defaults.metrics.items()}
        cluster.health_time = _now()

    def _restart_flaps(self, flaps: Sequence[AvailabilityFlap]) -> None:
        self._flap_generation += 1
        generation = self._flap_generation
        for cluster in self._clusters.values():
            if _DOWN_FLAP in cluster.down:
                self._change(cluster, lambda c: c.down.pop(_DOWN_FLAP, None))
        for flap in flaps:
            for cluster_id in flap.clusters:
                first = self._rng.uniform(0, flap.period)
                self._scheduler.call_later(
                    first, partial(self._flap, cluster_id, flap, generation, True)
                )

    def _flap(
        self, cluster_id: str, flap: AvailabilityFlap, generation: int, going_down: bool
    ) -> None:
        with self._lock:
            if generation != self._flap_generation or self._closing.is_set():
                return
            cluster = self._clusters[cluster_id]
            if going_down:
                self._change(cluster, lambda c: c.down.__setitem__(_DOWN_FLAP, _FLAP_REASON))
                delay = flap.down if flap.down is not None else flap.period
            else:
                self._change(cluster, lambda c: c.down.pop(_DOWN_FLAP, None))
                delay = flap.period
            self._scheduler.call_later(
                delay, partial(self._flap, cluster_id, flap, generation, not going_down)
            )

    def _schedule_out_of_band(self, upgrades: Sequence[OutOfBandUpgrade]) -> None:
        self._oob_generation += 1
        generation = self._oob_generation
        for upgrade in upgrades:
            self._scheduler.call_later(
                upgrade.after, partial(self._out_of_band, upgrade, generation)
            )

    def _out_of_band(self, upgrade: OutOfBandUpgrade, generation: int) -> None:
        with self._lock:
            if generation != self._oob_generation or self._closing.is_set():
                return
        for cluster_id in upgrade.clusters:
            pools = None
            if upgrade.node_pool_version is not None:
                pools = dict.fromkeys(self._clusters[cluster_id].pools, upgrade.node_pool_version)
            self.set_versions(cluster_id, upgrade.control_plane_version, pools)

    def _resume_recovered(self) -> None:
        """Operations a journal left PENDING or RUNNING run again from the start of their
        step (their failure faults drawn anew); a cluster no longer in the fleet fails them."""
        for op in self.operations.recovered_in_flight():
            with self._lock:
                cluster = self._clusters.get(op.cluster_id)
                if cluster is None:
                    self.operations.update(
                        op.id,
                        state=_FAILED,
                        error_code="CLUSTER_NOT_FOUND",
                        error_message=f"cluster {op.cluster_id} is no longer in the fleet",
                    )
                    continue
                step = StepKey(op.cluster_id, op.kind, op.node_pool, op.target_version)
                self.monitor.operation_resumed(step)
                self._run(cluster, op, _STEP_OF_KIND[op.kind])
        recovered = self.operations.recovered_in_flight()
        if recovered:
            _LOG.info(
                "resumed operations from the journal", extra={"fields": {"count": len(recovered)}}
            )

    def close(self) -> None:
        """Stops the timers and ends every watch stream."""
        self._closing.set()
        self._scheduler.stop()
        self.operations.close()

    # -- reading ---------------------------------------------------------------------------

    @property
    def cluster_count(self) -> int:
        """How many clusters the fleet has."""
        return len(self._ids)

    def _get(self, cluster_id: str) -> _Cluster:
        cluster = self._clusters.get(cluster_id)
        if cluster is None:
            raise NotFound(f"cluster {cluster_id} not found", reason=Reason.CLUSTER_NOT_FOUND)
        return cluster

    def _response(self, cluster: _Cluster) -> cluster_pb2.GetClusterResponse:
        response = cluster.response
        if response is None:
            with self._lock:
                response = cluster.response
                if response is None:
                    response = cluster.build_response()
                    cluster.response = response
        return response

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """The GetCluster answer (shared: callers must not change it); NotFound if unknown."""
        return self._response(self._get(cluster_id))

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the clusters whose labels include match_labels, by id."""
        with self._lock:
            return self._page(self._matching(match_labels), page_size, page_token, False)

    def list_changes(
        self, changed_since: str, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the clusters changed since a revision of this process (by id, labels
        matched); every cluster when the revision is not one it can answer since. None ever
        leaves this fleet, so removed_cluster_ids stays empty."""
        with self._lock:
            changed = self._revisions.changed_since(changed_since)
            if changed is None:
                return self._page(self._matching(match_labels), page_size, page_token, False)
            if match_labels:
                wanted = list(match_labels.items())
                changed = [
                    c
                    for c in changed
                    if all(self._clusters[c].labels.get(k) == v for k, v in wanted)
                ]
            return self._page(changed, page_size, page_token, True)

    def _page(
        self, ids: list[str], page_size: int, page_token: str, changes_only: bool
    ) -> cluster_pb2.ListClustersResponse:
        """One page of these ids (sorted), with the revision it was read at (under the lock)."""
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
        start = bisect.bisect_right(ids, after) if after else 0
        page_ids = ids[start : start + size]
        clusters = [self._response(self._clusters[i]).cluster for i in page_ids]
        more = start + size < len(ids)
        return cluster_pb2.ListClustersResponse(
            clusters=clusters,
            next_page_token=encode_page_token(page_ids[-1]) if more and page_ids else "",
            total_size=len(ids),
            revision=self._revisions.revision,
            changes_only=changes_only,
        )

    def _matching(self, match_labels: Mapping[str, str]) -> list[str]:
        if not match_labels:
            return self._ids
        key = frozenset(match_labels.items())
        ids = self._label_cache.get(key)
        if ids is None:
            wanted = list(key)
            ids = [
                i for i in self._ids if all(self._clusters[i].labels.get(k) == v for k, v in wanted)
            ]
            if len(self._label_cache) >= _LABEL_CACHE_MAX:
                self._label_cache.clear()
            self._label_cache[key] = ids
        return ids

    def before_rpc(self, method: str, context: grpc.ServicerContext) -> None:
        """Applies the fleet file's RPC faults (if any) to a call of method; runs first."""
        faults = self.rpc_faults
        if faults.active:
            faults.before(method, context)

    def get_operation(self, operation_id: str) -> cluster_pb2.Operation:
        """An operation by id; NotFound if unknown."""
        return self.operations.get(operation_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Operation updates until the caller cancels (see OperationStore.watch)."""
        return self.operations.watch(cluster_ids, include_in_flight, context)

    # -- mutating --------------------------------------------------------------------------

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Starts (or repeats) taking a cluster out of service."""
        return self._mutate(request_id, cluster_id, caller, _OUT, "", "")

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Starts (or repeats) putting a cluster back in service."""
        return self._mutate(request_id, cluster_id, caller, _IN, "", "")

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Starts (or repeats) a control-plane upgrade."""
        return self._mutate(request_id, cluster_id, caller, _CP, "", version)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Starts (or repeats) a node-pool upgrade."""
        return self._mutate(request_id, cluster_id, caller, _NP, node_pool, version)

    def _mutate(
        self, request_id: str, cluster_id: str, caller: str, kind: int, pool: str, version: str
    ) -> cluster_pb2.Operation:
        store = self.operations
        with self._lock:
            cluster = self._get(cluster_id)
            self.monitor.mutating_call(caller)
            start = partial(
                store.start,
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                node_pool=pool,
                target_version=version,
            )
            if store.lookup(request_id) is not None:
                # The same request again (or InvalidArgument if it differs): starts nothing.
                return start()[0]
            store.ensure_free(cluster_id)
            nothing_to_do = self._check(cluster, kind, pool, version)
            op, _ = start(initial_state=_SUCCEEDED if nothing_to_do else _PENDING)
            step = StepKey(cluster_id, kind, pool, version)
            self.monitor.operation_started(step, in_flight=not nothing_to_do)
            if not nothing_to_do:
                self._run(cluster, op, _STEP_OF_KIND[kind])
        self.rpc_faults.after(_METHOD_OF_KIND[kind])
        return op

    def _run(self, cluster: _Cluster, op: cluster_pb2.Operation, step_kind: StepKind) -> None:
        """Schedules op's progress and end (or its hang / forgetting, as the faults say)."""
        pool = op.node_pool
        run = _Run(
            cluster.cluster_id,
            op.kind,
            pool,
            op.target_version,
            self._take_failure(cluster, step_kind, pool),
            hang=self._take_rule(
                "hangStep", self._config.faults.hang_step, cluster, step_kind, pool
            )
            is not None,
            forget=self._take_rule(
                "forgetStep", self._config.faults.forget_step, cluster, step_kind, pool
            )
            is not None,
        )
        self._runs[op.id] = run
        self._change(cluster, lambda c: setattr(c, "op", op))
        duration = self._duration(cluster, step_kind)
        self._scheduler.call_later(0.1 * duration, partial(self._advance, op.id, 10))
        self._scheduler.call_later(0.55 * duration, partial(self._advance, op.id, 55))
        if not run.hang:
            run.ends_at = time.monotonic() + duration
            self._scheduler.call_later(duration, partial(self._finish, op.id))

    def _check(
        self,
        cluster: _Cluster,
        kind: int,
        pool: str,
        version: str,
        control_plane: str | None = None,
    ) -> bool:
        """Raises what the provider would refuse; True when the request has nothing to do.

        control_plane: the control-plane version a node pool is judged against (default:
        the cluster's current one; preflight passes the target).
        """
        cid = cluster.cluster_id
        if kind == _OUT:
            return not cluster.in_service
        if kind == _IN:
            return cluster.in_service
        if kind == _CP:
            current = cluster.cp_version
            order = compare_versions(version, current)
            if order == 0:
                return True
            if order < 0:
                raise FailedPrecondition(
                    f"cluster {cid}: control plane is at {current}; downgrading it to "
                    f"{version} is not supported",
                    reason=Reason.DOWNGRADE_NOT_SUPPORTED,
                )
            now, then = parse_version(current), parse_version(version)
            if then.major != now.major or then.minor > now.minor + 1:
                raise FailedPrecondition(
                    f"cluster {cid}: control plane is at {current}; upgrade one minor version "
                    f"at a time (next: {now.major}.{now.minor + 1})",
                    reason=Reason.MINOR_VERSION_SKIP,
                )
            self._check_refusals(cluster, "controlPlane", version)
            return False
        entry = cluster.pools.get(pool)
        if entry is None:
            names = ", ".join(cluster.pools) or "none"
            raise NotFound(
                f"cluster {cid} has no node pool {pool!r} (node pools: {names})",
                reason=Reason.NODE_POOL_NOT_FOUND,
            )
        control_plane = control_plane or cluster.cp_version
        if is_newer_version(version, control_plane):
            raise FailedPrecondition(
                f"cluster {cid}: node pool {pool} cannot be newer than the control plane "
                f"({control_plane}); upgrade the control plane to {version} first",
                reason=Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
            )
        if compare_versions(version, entry.version) == 0:
            return True
        self._check_refusals(cluster, "nodePool", version)
        return False

    def _check_refusals(self, cluster: _Cluster, step: StepKind, version: str) -> None:
        """The fault refuseVersions and enforced maintenance exclusions, for an upgrade."""
        cid = cluster.cluster_id
        for rule in self._config.faults.refuse_versions:
            if step not in rule.steps or (rule.clusters and cid not in rule.clusters):
                continue
            if any(compare_versions(version, v) == 0 for v in rule.versions):
                raise FailedPrecondition(
                    rule.message
                    or f"cluster {cid}: version {version} is refused ({rule.reason}; fault "
                    "refuseVersions)",
                    reason=rule.reason,
                    retry_after=rule.retry_after,
                )
        now = datetime.now(UTC)
        for window in cluster.windows:
            if window.refuse_upgrades and window.start <= now < window.end:
                raise FailedPrecondition(
                    f"cluster {cid}: maintenance exclusion {window.name or '(unnamed)'} is open "
                    f"until {window.end.isoformat()}; upgrades are refused until then",
                    reason=Reason.MAINTENANCE_EXCLUSION,
                    retry_after=(window.end - now).total_seconds(),
                )

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether UpgradeControlPlane / UpgradeNodePool would accept these targets now.

        The same rules as the mutations (_check), node pools judged against the
        control-plane target, or the current control plane when none is given (pools only);
        a cluster with an operation in flight is REFUSED_LATER
        (CLUSTER_BUSY, retry after the operation's expected end). Starts nothing.
        """
        with self._lock:
            cluster = self._get(cluster_id)

            def check() -> None:
                control_plane = cluster.cp_version
                if control_plane_version:
                    self._check(cluster, _CP, "", control_plane_version)
                    if is_newer_version(control_plane_version, control_plane):
                        control_plane = control_plane_version
                for name, version in sorted(node_pool_versions.items()):
                    self._check(cluster, _NP, name, version, control_plane)
                busy = self.operations.in_flight(cluster_id)
                if busy is not None:
                    run = self._runs.get(busy.id)
                    left = run.ends_at - time.monotonic() if run is not None else math.inf
                    raise FailedPrecondition(
                        f"cluster {cluster_id} has operation {busy.id} "
                        f"({kind_name(busy.kind)}) in flight; ask again when it ends",
                        reason=Reason.CLUSTER_BUSY,
                        retry_after=max(0.0, left) if math.isfinite(left) else 0.0,
                    )

            return verdict_of_check(check)

    def _take_rule(
        self, group: str, rules: Sequence[object], cluster: _Cluster, step: StepKind, pool: str
    ) -> int | None:
        """The index of the first rule of a step-fault group that hits this operation now
        (counting it against the rule's times), or None."""
        for index, rule in enumerate(rules):
            if getattr(rule, "step", None) != step or cluster.cluster_id not in getattr(
                rule, "clusters", ()
            ):
                continue
            node_pool = getattr(rule, "node_pool", "")
            if node_pool and node_pool != pool:
                continue
            times = getattr(rule, "times", None)
            if times is not None:
                key = (group, index, cluster.cluster_id)
                left = self._fail_left.get(key, times)
                if left <= 0:
                    continue
                self._fail_left[key] = left - 1
            return index
        return None

    def _take_failure(self, cluster: _Cluster, step: StepKind, pool: str) -> tuple[str, str] | None:
        rules = self._config.faults.fail_step
        index = self._take_rule("failStep", rules, cluster, step, pool)
        if index is None:
            return None
        rule = rules[index]
        what = kind_name(_KIND_OF_STEP[step]) + (f" of node pool {pool}" if pool else "")
        message = rule.message or (
            f"simulated failure: {what} on cluster {cluster.cluster_id} failed (fault failStep)"
        )
        return (rule.error_code or _ERROR_CODES[step], message)

    def _duration(self, cluster: _Cluster, step: StepKind) -> float:
        seconds = cluster.step_seconds.get(step)
        if seconds is None:
            if self._step_override is not None:
                seconds = self._step_override
            else:
                default = self._defaults.step_seconds.get(step)
                seconds = DEFAULT_STEP_SECONDS[step] if default is None else default
        jitter = self._defaults.jitter
        if jitter:
            seconds *= 1.0 + self._rng.uniform(-jitter, jitter)
        return max(0.0, seconds)

    def _change(self, cluster: _Cluster, mutate: Callable[[_Cluster], object]) -> None:
        """Applies mutate(cluster) (under the lock), drops the cache, tells the monitor."""
        before = cluster.view()
        mutate(cluster)
        self._touch(cluster)
        self.monitor.cluster_changed(before, cluster.view())

    def _touch(self, cluster: _Cluster) -> None:
        """A cluster's answer changed (under the lock): its cache goes, a revision counts it."""
        cluster.response = None
        self._revisions.touch(cluster.cluster_id)

    def _advance(self, op_id: str, progress: int) -> None:
        with self._lock:
            run = self._runs.get(op_id)
            if run is None:
                return
            op = self.operations.update(op_id, state=_RUNNING, progress=progress)
            cluster = self._clusters[run.cluster_id]

            def _running(c: _Cluster) -> None:
                c.op = op
                if run.kind == _CP:
                    c.down[_DOWN_UPGRADE] = f"control plane upgrading to {run.version}"
                elif run.kind == _NP:
                    c.pools[run.node_pool].status = _UPGRADING

            self._change(cluster, _running)

    def _finish(
        self, op_id: str, outcome: tuple[int, str, str] | None = None, forget: bool | None = None
    ) -> None:
        """Ends a running operation as its run says (or as outcome: state, code, message)."""
        with self._lock:
            run = self._runs.pop(op_id, None)
            if run is None:
                return
            cluster = self._clusters[run.cluster_id]
            forgotten = run.forget if forget is None else forget
            if outcome is not None:
                state, code, message = outcome
            elif run.failure is not None:
                state, (code, message) = _FAILED, run.failure
            else:
                state, code, message = _SUCCEEDED, "", ""
            succeeded = state == _SUCCEEDED and not forgotten
            if forgotten:
                self.operations.forget(op_id)
            elif state == _SUCCEEDED:
                self.operations.update(op_id, state=_SUCCEEDED)
            else:
                self.operations.update(op_id, state=_FAILED, error_code=code, error_message=message)

            def _ended(c: _Cluster) -> None:
                c.op = None
                c.down.pop(_DOWN_UPGRADE, None)
                if run.kind == _NP:
                    c.pools[run.node_pool].status = _READY
                if succeeded:
                    _apply_success(c, run.kind, run.node_pool, run.version)
                    if run.kind == _CP:
                        self._after_upgrade(c)

            self._change(cluster, _ended)
            step = StepKey(run.cluster_id, run.kind, run.node_pool, run.version)
            self.monitor.operation_ended(step, succeeded)

    # -- adversary (admin endpoint, faults) ------------------------------------------------

    def end_operation(
        self, op_id: str, *, succeed: bool, error_code: str = "", error_message: str = ""
    ) -> cluster_pb2.Operation:
        """Ends a running (e.g. hung) operation now: SUCCEEDED with its effect, or FAILED."""
        with self._lock:
            if op_id not in self._runs:
                op = self.operations.get(op_id)  # NotFound when unknown
                if op.state in TERMINAL_STATES:
                    return op
                raise FailedPrecondition(f"operation {op_id} is not running in this sim")
            outcome = (
                (_SUCCEEDED, "", "")
                if succeed
                else (
                    _FAILED,
                    error_code or "OPERATION_ENDED_BY_ADMIN",
                    error_message or "ended as FAILED through the admin endpoint",
                )
            )
            self._finish(op_id, outcome, forget=False)
            return self.operations.get(op_id)

    def forget_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The plugin forgets the operation (GetOperation: NOT_FOUND); a running one stops
        without changing its cluster."""
        with self._lock:
            if op_id in self._runs:
                op = self.operations.get(op_id)
                self._finish(op_id, forget=True)
                return op
            return self.operations.forget(op_id)

    def set_versions(
        self,
        cluster_id: str,
        control_plane_version: str | None = None,
        node_pool_versions: Mapping[str, str] | None = None,
    ) -> None:
        """Someone else changes the cluster's versions (no operation, no rules): drift."""
        for name, value in [("controlPlaneVersion", control_plane_version)] + [
            (f"nodePools.{p}", v) for p, v in (node_pool_versions or {}).items()
        ]:
            if value is not None:
                try:
                    parse_version(value)
                except ValueError:
                    raise FailedPrecondition(
                        f"{name}: {value!r} is not a version; write it like 1.29.4"
                    ) from None
        with self._lock:
            cluster = self._get(cluster_id)
            unknown = sorted(set(node_pool_versions or {}) - set(cluster.pools))
            if unknown:
                raise NotFound(
                    f"cluster {cluster_id} has no node pool {unknown[0]!r} "
                    f"(node pools: {', '.join(cluster.pools) or 'none'})"
                )

            def _drift(c: _Cluster) -> None:
                if control_plane_version is not None:
                    c.cp_version = control_plane_version
                for pool, version in (node_pool_versions or {}).items():
                    c.pools[pool].version = version

            self._change(cluster, _drift)

    def _after_upgrade(self, cluster: _Cluster) -> None:
        for rule in self._config.faults.unhealthy_after_upgrade:
            if cluster.cluster_id in rule.clusters:
                for workload in cluster.workloads.values():
                    workload.health = 0.0
                    workload.healthy_replicas = 0
                cluster.metrics.update(rule.metrics)
                cluster.health_time = _now()

    # -- health ----------------------------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), clusters in request order."""
        with self._lock:
            clusters = [self._get(cid) for cid in cluster_ids]
            results = []
            for cluster in clusters:
                for wanted in workloads:
                    results.append(
                        verdict(cluster.cluster_id, cluster.health_time, cluster.workloads, wanted)
                    )
            return results

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str
    ) -> health_pb2.QueryMetricResponse:
        """The value the fleet file (or admin) set for the rendered query, or no data.

        The cluster is cluster_id, else args["cluster"]; placeholders take args, then the
        cluster's id and labels. Without a cluster the fleet-wide metrics answer.
        """
        with self._lock:
            target = cluster_id or args.get("cluster", "")
            if target:
                cluster = self._get(target)
                values = {"cluster": cluster.cluster_id, **cluster.labels, **args}
                table = cluster.metrics
                observed = cluster.health_time
                where = f"cluster {cluster.cluster_id}"
            else:
                values = dict(args)
                table = self._fleet_metrics
                observed = _now()
                where = "the fleet"
            rendered = render_query(query, values)
            value = table.get(rendered)
            if value is None:
                value = table.get(query)
            if value is None:
                return health_pb2.QueryMetricResponse(
                    has_data=False, message=f"no data for query {rendered!r} on {where}"
                )
            return health_pb2.QueryMetricResponse(
                has_data=True, value=value, observed_time=observed
            )

    def set_health(
        self,
        cluster_id: str,
        *,
        workloads: Sequence[WorkloadSpec] | None = None,
        metrics: Mapping[str, float | None] | None = None,
        available: bool | None = None,
        unavailable_reason: str = "",
    ) -> None:
        """Admin change: replace the workloads, merge metrics (None deletes one), and mark
        the cluster (un)available."""
        with self._lock:
            cluster = self._get(cluster_id)
            if workloads is not None:
                cluster.workloads = {(w.namespace, w.name): workload_of(w) for w in workloads}
            for query, value in (metrics or {}).items():
                if value is None:
                    cluster.metrics.pop(query, None)
                else:
                    cluster.metrics[query] = float(value)
            if workloads is not None or metrics:
                cluster.health_time = _now()
            if available is not None:
                reason = unavailable_reason or "marked unavailable through the admin endpoint"

                def _availability(c: _Cluster) -> None:
                    if available:
                        c.down.pop(_DOWN_ADMIN, None)
                    else:
                        c.down[_DOWN_ADMIN] = reason

                self._change(cluster, _availability)

    def set_fleet_metrics(self, metrics: Mapping[str, float | None]) -> None:
        """Admin change of the fleet-wide metrics (None deletes one)."""
        with self._lock:
            for query, value in metrics.items():
                if value is None:
                    self._fleet_metrics.pop(query, None)
                else:
                    self._fleet_metrics[query] = float(value)

    def health_of(self, cluster_id: str) -> dict[str, object]:
        """The cluster's state and health data as JSON-ready data (admin GET)."""
        with self._lock:
            cluster = self._get(cluster_id)
            return {
                "id": cluster.cluster_id,
                "labels": dict(cluster.labels),
                "controlPlaneVersion": cluster.cp_version,
                "nodePools": [
                    {"name": name, "version": pool.version} for name, pool in cluster.pools.items()
                ],
                "available": not cluster.down,
                "unavailableReason": "; ".join(cluster.down[k] for k in sorted(cluster.down)),
                "inService": cluster.in_service,
                "workloads": [
                    {
                        "namespace": ns,
                        "name": name,
                        "kind": w.kind,
                        "healthyReplicas": w.healthy_replicas,
                        "health": "unknown" if w.health is None else w.health,
                    }
                    for (ns, name), w in cluster.workloads.items()
                ],
                "metrics": dict(cluster.metrics),
                "currentOperation": cluster.op.id if cluster.op is not None else None,
            }


_KIND_OF_STEP: dict[StepKind, int] = {step: kind for kind, step in _STEP_OF_KIND.items()}


def _apply_success(cluster: _Cluster, kind: int, pool: str, version: str) -> None:
    """What a SUCCEEDED operation did to its cluster."""
    if kind == _OUT:
        cluster.in_service = False
    elif kind == _IN:
        cluster.in_service = True
    elif kind == _CP:
        cluster.cp_version = version
    elif kind == _NP and pool in cluster.pools:
        cluster.pools[pool].version = version
