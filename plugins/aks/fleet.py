"""The AKS fleet behind the contract: the selected managed clusters and their inventory, upgrades
started as ARM long-running operations and followed to their end, preflight from each cluster's
upgrade profile, and (traffic mode recordOnly) a recorded service state."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import grpc
from azure.core.exceptions import HttpResponseError
from azure.core.polling import LROPoller

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.aks.api import AksApi, Json, error_code, operation_failed
from plugins.aks.config import AksConfig
from plugins.aks.ids import ClusterRef, parse_cluster_id
from plugins.aks.operations import ArmOperation, ArmOperations
from plugins.aks.rules import (
    SETTLED,
    busy_refusal,
    cluster_version,
    judge,
    pool_profiles,
    pool_version,
)
from plugins.aks.windows import maintenance_windows
from plugins.sdk import (
    OP_CONTROL_PLANE,
    OP_FAILED,
    OP_NODE_POOL,
    OP_RUNNING,
    OP_SERVICE_IN,
    OP_SERVICE_OUT,
    OP_SUCCEEDED,
    NotFound,
    OperationStore,
    PluginError,
    Reason,
    page_request,
    verdict_of,
    verdict_of_check,
    version_meets,
)

__all__ = ["AksFleet"]

_LOG = logging.getLogger("plugins.aks.fleet")
MAINTENANCE_TTL = 300.0
"""Seconds a cluster's maintenance configurations are reused before ARM is asked again."""


def _pool_status(state: str) -> cluster_pb2.NodePoolStatus.ValueType:
    if state == "Succeeded":
        return cluster_pb2.NODE_POOL_STATUS_READY
    if state in ("Failed", "Canceled"):
        return cluster_pb2.NODE_POOL_STATUS_ERROR
    return cluster_pb2.NODE_POOL_STATUS_UPGRADING


@dataclass
class _Follow:
    """An operation followed to its end: by its ARM poller, or by its resource's state."""

    ref: ClusterRef
    arm: ArmOperation
    poller: LROPoller[Any] | None
    resume_at: float = 0.0  # after a failed poll: when to resume the poller from its token


class AksFleet:
    """Everything the ClusterService servicer needs, over Azure Resource Manager."""

    def __init__(self, config: AksConfig, api: AksApi) -> None:
        self.config = config
        self.api = api
        state = config.operations.state_file
        self.store = OperationStore("aks-op", state_path=state or None)
        self.arm = ArmOperations(f"{state}.arm.json" if state else "")
        self._explicit = {
            ref.id: ref for ref in (parse_cluster_id(i) for i in config.clusters.ids) if ref
        }
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._follows: dict[str, _Follow] = {}
        self._follows_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._maintenance_cache: dict[str, tuple[float, list[Json]]] = {}
        self._maintenance_lock = threading.Lock()

    # --------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Resumes the operations a previous process left in flight, then follows them."""
        for op in self.store.recovered_in_flight():
            ref = parse_cluster_id(op.cluster_id)
            arm = self.arm.get(op.id)
            if ref is None:
                continue
            if arm is None:
                kind = "cluster" if op.kind == OP_CONTROL_PLANE else "pool"
                arm = ArmOperation(op.cluster_id, kind, op.node_pool, op.target_version)
            self._follow(op.id, ref, arm, self._resume(ref, arm))
        self._thread = threading.Thread(target=self._run, name="aks-operations", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self.store.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.api.close()

    def _resume(self, ref: ClusterRef, arm: ArmOperation) -> LROPoller[Any] | None:
        if not arm.token:
            return None
        try:
            return self.api.resume(ref, arm.kind, arm.pool, arm.token)
        except Exception:  # a token this SDK cannot read: follow the resource instead
            _LOG.exception("cannot resume an ARM poller; following the resource's state")
            return None

    def _follow(
        self, op_id: str, ref: ClusterRef, arm: ArmOperation, poller: LROPoller[Any] | None
    ) -> None:
        with self._follows_lock:
            self._follows[op_id] = _Follow(ref, arm, poller)

    def _run(self) -> None:
        tick = min(self.config.operations.poll_seconds, 0.5)
        last_resource_check = 0.0
        while not self._stop.wait(tick):
            with self._follows_lock:
                follows = list(self._follows.items())
            by_resource = time.monotonic() - last_resource_check >= (
                self.config.operations.poll_seconds
            )
            if by_resource:
                last_resource_check = time.monotonic()
            for op_id, follow in follows:
                try:
                    if follow.poller is not None:
                        self._check_poller(op_id, follow)
                    elif follow.arm.token:
                        if time.monotonic() >= follow.resume_at:
                            follow.poller = self._resume(follow.ref, follow.arm)
                            if follow.poller is None:  # unreadable: follow the resource
                                follow.arm = replace(follow.arm, token="")
                    elif by_resource:
                        self._check_resource(op_id, follow)
                except PluginError as exc:
                    _LOG.warning("following operation %s: %s", op_id, exc.message)
                except Exception:
                    _LOG.exception("following operation %s failed; retrying", op_id)

    def _end(self, op_id: str, state: int, code: str = "", message: str = "") -> None:
        self.store.update(op_id, state=state, error_code=code, error_message=message)
        with self._follows_lock:
            self._follows.pop(op_id, None)
        self.arm.drop(op_id)

    def _check_poller(self, op_id: str, follow: _Follow) -> None:
        poller = follow.poller
        if poller is None or not poller.done():
            return
        try:
            result = poller.result(timeout=0)
        except Exception as exc:
            if isinstance(exc, HttpResponseError) and operation_failed(exc):
                code = error_code(exc) or "OperationFailed"
                self._end(
                    op_id,
                    OP_FAILED,
                    code,
                    f"AKS operation ended {code}; see the cluster's activity log in Azure",
                )
            elif isinstance(exc, HttpResponseError) and exc.status_code == 404:
                # ARM no longer knows the operation's status: its resource tells.
                follow.poller = None
                follow.arm = replace(follow.arm, token="")
            else:
                # Throttled, a 5xx, no connection, no token while polling: this says nothing
                # about the operation, which goes on in ARM; poll anew from its token later.
                _LOG.warning(
                    "polling ARM for %s failed (%s); resuming later", op_id, type(exc).__name__
                )
                follow.poller = None
                follow.resume_at = time.monotonic() + self.config.operations.poll_seconds
            return
        reached = self._reached(follow.arm, result.as_dict() if result is not None else None)
        self._judge_end(op_id, follow.arm, reached)

    def _reached(self, arm: ArmOperation, body: Json | None) -> str:
        """The version the operation's resource runs now ("" for a node image upgrade)."""
        if arm.kind == "nodeImage":
            return ""
        if body is None:
            ref = parse_cluster_id(arm.cluster_id)
            if ref is None:
                return ""
            if arm.kind == "cluster":
                body = self.api.get_cluster(ref).as_dict()
            else:
                body = self.api.get_pool(ref, arm.pool).as_dict()
        if arm.kind == "cluster":
            return cluster_version(body)
        return pool_version(body.get("properties") or {})

    def _judge_end(self, op_id: str, arm: ArmOperation, reached: str) -> None:
        if arm.kind == "nodeImage" or (reached and version_meets(reached, arm.target)):
            self._end(op_id, OP_SUCCEEDED)
            return
        self._end(
            op_id,
            OP_FAILED,
            "TARGET_NOT_REACHED",
            f"AKS reported the operation done with {arm.pool or 'the control plane'} at "
            f"{reached or 'an unknown version'}, short of {arm.target}",
        )

    def _check_resource(self, op_id: str, follow: _Follow) -> None:
        """No poller (a restart without its token): the resource's provisioningState tells."""
        arm = follow.arm
        cluster = self.api.get_cluster(follow.ref).as_dict()
        state = str((cluster.get("properties") or {}).get("provisioningState") or "")
        reached = cluster_version(cluster)
        if arm.kind != "cluster":
            pool = pool_profiles(cluster).get(arm.pool) or {}
            state = str(pool.get("provisioningState") or "")
            reached = pool_version(pool)
        if state not in SETTLED:
            return
        if state != "Succeeded":
            self._end(
                op_id,
                OP_FAILED,
                "PROVISIONING_" + state.upper(),
                f"AKS reports provisioningState {state}; see the cluster's activity log",
            )
            return
        self._judge_end(op_id, arm, reached)

    def cluster_lock(self, cluster_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster_id, threading.Lock())

    # ------------------------------------------------------------------- selection

    def _scopes(self) -> list[tuple[str, str]]:
        scopes = {(ref.subscription, ref.group) for ref in self._explicit.values()}
        scopes |= {
            (d.subscription.lower(), d.resource_group.lower())
            for d in self.config.clusters.discover
        }
        whole = {sub for sub, group in scopes if not group}
        return sorted((s, g) for s, g in scopes if not g or s not in whole)

    def _may_select(self, ref: ClusterRef) -> bool:
        if ref.id in self._explicit:
            return True
        return any(
            d.subscription.lower() == ref.subscription
            and d.resource_group.lower() in ("", ref.group)
            for d in self.config.clusters.discover
        )

    def _selected(self, ref: ClusterRef, cluster: Json) -> bool:
        if ref.id in self._explicit:
            return True
        tags = cluster.get("tags") or {}
        return any(
            d.subscription.lower() == ref.subscription
            and d.resource_group.lower() in ("", ref.group)
            and all(tags.get(k) == v for k, v in d.match_tags.items())
            for d in self.config.clusters.discover
        )

    def cluster_ref(self, cluster_id: str) -> ClusterRef:
        """The cluster a request names, in the inventory's one spelling only: runs meet by
        cluster id (holdings, floors, one owner), so two spellings of one cluster must not
        both be accepted."""
        ref = parse_cluster_id(cluster_id)
        if ref is not None and ref.id != cluster_id and self._may_select(ref):
            raise NotFound(
                f"cluster {cluster_id} is not in the plugin's inventory; ARM ids are "
                f"case-insensitive and the plugin spells this one {ref.id}",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        if ref is None or not self._may_select(ref):
            raise NotFound(
                f"cluster {cluster_id} is not in the plugin's inventory",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return ref

    def _listing(self) -> dict[str, tuple[ClusterRef, Json]]:
        found: dict[str, tuple[ClusterRef, Json]] = {}
        for subscription, group in self._scopes():
            for cluster in self.api.list_clusters(subscription, group):
                ref = parse_cluster_id(str(cluster.get("id") or ""))
                if ref is not None and self._may_select(ref) and self._selected(ref, cluster):
                    found[ref.id] = (ref, cluster)
        return found

    def _read(self, ref: ClusterRef) -> Json:
        """The cluster's ARM body, if the plugin selects it; NotFound else."""
        try:
            cluster = self.api.get_cluster(ref).as_dict()
        except NotFound:
            raise NotFound(
                f"cluster {ref.id} is not in the plugin's inventory",
                reason=Reason.CLUSTER_NOT_FOUND,
            ) from None
        if not self._selected(ref, cluster):
            raise NotFound(
                f"cluster {ref.id} is not in the plugin's inventory",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return cluster

    # ------------------------------------------------------------------- inventory

    def service_states(self) -> dict[str, bool]:
        """recordOnly: each cluster's last service change, from the (journaled) operations."""
        state: dict[str, bool] = {}
        for op in self.store.operations():
            if op.kind in (OP_SERVICE_OUT, OP_SERVICE_IN) and op.state == OP_SUCCEEDED:
                state[op.cluster_id] = op.kind == OP_SERVICE_IN
        return state

    def _maintenance(self, ref: ClusterRef) -> list[Json]:
        """The cluster's maintenance configurations, read at most every MAINTENANCE_TTL
        seconds (they change rarely; a page of 500 clusters would otherwise cost 500 reads)."""
        now = time.monotonic()
        with self._maintenance_lock:
            cached = self._maintenance_cache.get(ref.id)
        if cached is not None and cached[0] > now:
            return cached[1]
        configs = self.api.maintenance_configurations(ref)
        with self._maintenance_lock:
            self._maintenance_cache[ref.id] = (now + MAINTENANCE_TTL, configs)
        return configs

    def _prefetch_maintenance(self, refs: Sequence[ClusterRef]) -> None:
        """Reads the page's stale maintenance configurations in parallel (ARM answers each
        in ~100 ms; one by one a large page would not fit ListClusters' deadline)."""
        now = time.monotonic()
        with self._maintenance_lock:
            stale = [r for r in refs if self._maintenance_cache.get(r.id, (0.0, []))[0] <= now]
        if len(stale) > 1:
            with ThreadPoolExecutor(max_workers=8, thread_name_prefix="aks-maint") as pool:
                list(pool.map(self._maintenance, stale))

    def _contract_cluster(
        self, ref: ClusterRef, cluster: Json, service: Mapping[str, bool]
    ) -> cluster_pb2.Cluster:
        props = cluster.get("properties") or {}
        state = str(props.get("provisioningState") or "")
        power = str((props.get("powerState") or {}).get("code") or "Running")
        reasons = []
        if state != "Succeeded":
            reasons.append(f"AKS provisioningState {state or 'unknown'}")
        if power != "Running":
            reasons.append(f"AKS powerState {power}")
        result = cluster_pb2.Cluster(
            id=ref.id,
            labels={str(k): str(v) for k, v in (cluster.get("tags") or {}).items()},
            control_plane_version=cluster_version(cluster),
            node_pools=[
                cluster_pb2.NodePool(
                    name=name,
                    version=pool_version(pool),
                    status=_pool_status(str(pool.get("provisioningState") or "")),
                )
                for name, pool in sorted(pool_profiles(cluster).items())
            ],
            available=not reasons,
            unavailable_reason="; ".join(reasons),
            in_service=service.get(ref.id, True),
            maintenance_windows=maintenance_windows(self._maintenance(ref)),
        )
        current = self.store.in_flight(ref.id)
        if current is not None:
            result.current_operation.CopyFrom(current)
        return result

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the selected clusters whose tags include match_labels, by id."""
        paging = page_request(page_size, page_token)  # refused before anything is read
        listing = self._listing()
        page = paging.page(
            cid
            for cid, (_, cluster) in listing.items()
            if all((cluster.get("tags") or {}).get(k) == v for k, v in match_labels.items())
        )
        service = self.service_states()
        self._prefetch_maintenance([listing[cid][0] for cid in page.keys])
        return cluster_pb2.ListClustersResponse(
            clusters=[self._contract_cluster(*listing[cid], service) for cid in page.keys],
            next_page_token=page.next_page_token,
            total_size=page.total_size,
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """One selected cluster; NotFound for anything else."""
        ref = self.cluster_ref(cluster_id)
        cluster = self._read(ref)
        return cluster_pb2.GetClusterResponse(
            cluster=self._contract_cluster(ref, cluster, self.service_states())
        )

    # ------------------------------------------------------------------ operations

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        return self.store.get(op_id)

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        return self.store.watch(cluster_ids, include_in_flight, context)

    # -------------------------------------------------------------------- upgrades

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeControlPlane: a control-plane-only managed cluster PUT (caller: unused)."""
        return self._upgrade(OP_CONTROL_PLANE, request_id, cluster_id, "", version)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeNodePool: an agent pool PUT with orchestratorVersion, or (pool already at
        the version, upgrades.nodeImageWhenCurrent) a node image upgrade (caller: unused)."""
        return self._upgrade(OP_NODE_POOL, request_id, cluster_id, node_pool, version)

    def _upgrade(
        self, kind: int, request_id: str, cluster_id: str, pool: str, version: str
    ) -> cluster_pb2.Operation:
        ref = self.cluster_ref(cluster_id)
        cluster_id = ref.id
        with self.cluster_lock(cluster_id):
            if self.store.lookup(request_id) is not None:
                op, _ = self.store.start(
                    request_id=request_id,
                    kind=kind,
                    cluster_id=cluster_id,
                    node_pool=pool,
                    target_version=version,
                )
                return op
            self.store.ensure_free(cluster_id)
            model = self.api.get_cluster(ref)
            cluster = model.as_dict()
            if not self._selected(ref, cluster):
                raise NotFound(
                    f"cluster {cluster_id} is not in the plugin's inventory",
                    reason=Reason.CLUSTER_NOT_FOUND,
                )
            profile = self.api.upgrade_profile(ref)
            targets = {pool: version} if pool else {}
            refusal = judge(cluster_id, cluster, profile, "" if pool else version, targets)
            if refusal is not None:
                raise refusal
            live = pool_profiles(cluster)
            if pool and pool not in live:
                raise NotFound(
                    f"node pool {pool} not found in cluster {cluster_id}",
                    reason=Reason.NODE_POOL_NOT_FOUND,
                )
            current = pool_version(live[pool]) if pool else cluster_version(cluster)
            arm_kind = "pool" if pool else "cluster"
            if version_meets(current, version):
                if not (pool and self._node_image_due(ref, pool)):
                    done, _ = self.store.start(
                        request_id=request_id,
                        kind=kind,
                        cluster_id=cluster_id,
                        node_pool=pool,
                        target_version=version,
                        initial_state=OP_SUCCEEDED,
                    )
                    return done
                busy = busy_refusal(cluster, cluster_id)
                if busy is not None:
                    raise busy
                arm_kind = "nodeImage"
            poller: LROPoller[Any]
            if arm_kind == "cluster":
                poller = self.api.begin_control_plane(ref, model, version)
            elif arm_kind == "pool":
                poller = self.api.begin_node_pool(ref, self.api.get_pool(ref, pool), pool, version)
            else:
                poller = self.api.begin_node_image(ref, pool)
            op, _ = self.store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                node_pool=pool,
                target_version=version,
                initial_state=OP_RUNNING,
            )
            arm = ArmOperation(cluster_id, arm_kind, pool, version, poller.continuation_token())
            self.arm.put(op.id, arm)
            self._follow(op.id, ref, arm, poller)
            _LOG.info(
                "ARM operation started",
                extra={
                    "fields": {
                        "operation": op.id,
                        "cluster": cluster_id,
                        "kind": arm_kind,
                        "pool": pool,
                        "version": version,
                    }
                },
            )
            return op

    def _node_image_due(self, ref: ClusterRef, pool: str) -> bool:
        """upgrades.nodeImageWhenCurrent and the pool's node image is not AKS's latest
        (agentPools/{pool}/upgradeProfiles/default latestNodeImageVersion)."""
        if not self.config.upgrades.node_image_when_current:
            return False
        current, latest = self.api.node_images(ref, pool)
        return bool(latest) and latest != current

    # ---------------------------------------------------------------------- traffic

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        return self._service(OP_SERVICE_OUT, request_id, cluster_id)

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        return self._service(OP_SERVICE_IN, request_id, cluster_id)

    def _service(self, kind: int, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        """traffic.mode recordOnly: the change is recorded (journaled) and done; no traffic
        moves. The servicer never calls this in mode unsupported (no capability)."""
        ref = self.cluster_ref(cluster_id)
        with self.cluster_lock(ref.id):
            if self.store.lookup(request_id) is None:
                self._read(ref)
            op, _ = self.store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=ref.id,
                initial_state=OP_SUCCEEDED,
            )
            return op

    # -------------------------------------------------------------------- preflight

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """The same rules as the upgrades (rules.judge) on the cluster and its upgrade profile,
        then this plugin's operation in flight. Read-only."""
        ref = self.cluster_ref(cluster_id)
        cluster = self._read(ref)
        profile = self.api.upgrade_profile(ref)
        refusal = judge(ref.id, cluster, profile, control_plane_version, node_pool_versions)
        if isinstance(refusal, NotFound):
            raise refusal
        if refusal is not None and not refusal.retryable:
            return verdict_of(refusal)  # never as asked, even while the cluster is busy

        def check() -> None:
            self.store.ensure_free(ref.id)
            if refusal is not None:
                raise refusal

        return verdict_of_check(check)

    # ------------------------------------------------------------------------ probe

    def probe(self) -> tuple[bool, str]:
        """(ready, why not): ARM answers a cluster listing of the first configured scope."""
        scopes = self._scopes()
        if not scopes:
            return False, "no clusters configured"
        try:
            self.api.list_clusters(*scopes[0])
        except PluginError as exc:
            return False, f"Azure Resource Manager is not reachable: {exc.message}"
        return True, ""
