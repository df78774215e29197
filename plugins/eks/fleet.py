"""The EKS fleet behind the contract: the selected clusters of the account's regions and their
managed node groups, upgrades as EKS updates (UpdateClusterVersion, UpdateNodegroupVersion,
followed with DescribeUpdate), preflight from EKS's offers, rules and upgrade insights, and
traffic through Route 53 weighted records (mode route53) or recorded only (mode none)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.eks import rules
from plugins.eks.api import EksApi, InUse
from plugins.eks.config import EksConfig
from plugins.eks.ids import (
    ClusterRef,
    UpdateRef,
    client_token,
    parse_cluster_id,
    parse_operation_id,
)
from plugins.eks.traffic import Drain, Route53Traffic
from plugins.sdk import (
    OP_CONTROL_PLANE,
    OP_NODE_POOL,
    OP_SERVICE_IN,
    OP_SERVICE_OUT,
    OP_SUCCEEDED,
    TERMINAL_STATES,
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OperationStore,
    PluginError,
    Reason,
    page_request,
    verdict_of_check,
)

__all__ = ["EksFleet"]

_LOG = logging.getLogger("plugins.eks.fleet")
_BUSY_RETRY_SECONDS = 30.0
_MESSAGE_LIMIT = 300

# Nodegroup.status (NodegroupStatus enum) as the contract's pool status.
_POOL_STATUS: dict[str, int] = {
    "ACTIVE": cluster_pb2.NODE_POOL_STATUS_READY,
    "CREATING": cluster_pb2.NODE_POOL_STATUS_UPGRADING,
    "UPDATING": cluster_pb2.NODE_POOL_STATUS_UPGRADING,
    "DEGRADED": cluster_pb2.NODE_POOL_STATUS_ERROR,
    "CREATE_FAILED": cluster_pb2.NODE_POOL_STATUS_ERROR,
    "DELETE_FAILED": cluster_pb2.NODE_POOL_STATUS_ERROR,
}
# Cluster.status in which the cluster serves ("Your cluster continues to function during
# the update": UpdateClusterVersion).
_SERVING = frozenset({"ACTIVE", "UPDATING"})


def update_state(update: Mapping[str, Any]) -> tuple[int, str, str]:
    """(state, error_code, error_message) of an EKS Update: InProgress → RUNNING, Successful →
    SUCCEEDED, Failed → FAILED (UPGRADE_FAILED), Cancelled → FAILED (CANCELLED); the message
    names the update and EKS's first ErrorDetail (errorCode: errorMessage)."""
    status = str(update.get("status", ""))
    if status == "Successful":
        return OP_SUCCEEDED, "", ""
    if status not in ("Failed", "Cancelled"):
        return cluster_pb2.OPERATION_STATE_RUNNING, "", ""
    errors = update.get("errors") or []
    detail = ""
    if errors:
        first = errors[0]
        detail = f": {first.get('errorCode', 'Unknown')}: {first.get('errorMessage', '')}"
    code = "CANCELLED" if status == "Cancelled" else "UPGRADE_FAILED"
    message = f"EKS update {update.get('id', '')} {status.lower()}{detail}"
    return cluster_pb2.OPERATION_STATE_FAILED, code, message[:_MESSAGE_LIMIT]


def _updating(cluster: Mapping[str, Any], nodegroups: Mapping[str, Any]) -> bool:
    """EKS says an update runs: the cluster or a node group in status UPDATING."""
    return cluster.get("status") == "UPDATING" or any(
        ng.get("status") == "UPDATING" for ng in nodegroups.values()
    )


def _update_version(update: Mapping[str, Any]) -> str:
    for param in update.get("params") or []:
        if param.get("type") == "Version":
            return str(param.get("value", ""))
    return ""


class EksFleet:
    """Everything the ClusterService servicer needs, over the EKS API."""

    def __init__(self, config: EksConfig, api: EksApi) -> None:
        self.config = config
        self.api = api
        state = config.operations.state_file or None
        self.store = OperationStore("eks-op", state_path=state)
        self._stop = threading.Event()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._poller: threading.Thread | None = None
        self.traffic: Route53Traffic | None = None
        if config.traffic.mode == "route53":
            self.traffic = Route53Traffic(config, api.session)
        self._drains: dict[str, Drain] = {}  # service operations in flight

    # --------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Follows the operations in flight (those of the journal too) with DescribeUpdate."""
        self._poller = threading.Thread(target=self._poll, name="eks-updates", daemon=True)
        self._poller.start()

    def close(self) -> None:
        self._stop.set()
        self.store.close()
        if self._poller is not None:
            self._poller.join(timeout=5)
        if self.traffic is not None:
            self.traffic.close()
        self.api.close()

    def _poll(self) -> None:
        while not self._stop.wait(self.config.operations.poll_seconds):
            for op in self.store.all_in_flight():
                ref = parse_operation_id(op.id)
                try:
                    if ref is None:
                        self._follow_drain(op)
                    else:
                        self._refresh(ref)
                except PluginError as exc:
                    _LOG.warning("following EKS update %s failed; retrying: %s", op.id, exc)
                except Exception:
                    _LOG.exception("following EKS update %s failed; retrying", op.id)

    def _lock(self, cluster_id: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(cluster_id, threading.Lock())

    # ------------------------------------------------------------------- selection

    def _ref(self, cluster_id: str) -> ClusterRef:
        ref = parse_cluster_id(cluster_id)
        if (
            ref is None
            or ref.account != self.config.account
            or ref.region not in self.config.regions
            or (self.config.clusters.names and ref.name not in self.config.clusters.names)
        ):
            raise NotFound(
                f"cluster {cluster_id} is not in the plugin's inventory",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return ref

    def _selected(self, cluster: Mapping[str, Any]) -> bool:
        tags = cluster.get("tags") or {}
        return all(tags.get(k) == v for k, v in self.config.clusters.match_tags.items())

    def _describe(self, ref: ClusterRef) -> dict[str, Any]:
        """DescribeCluster of a selected cluster; NotFound for anything else."""
        cluster: dict[str, Any] = self.api.call(
            ref.region, "describe_cluster", "cluster", name=ref.name
        )["cluster"]
        if cluster.get("arn") != ref.id or not self._selected(cluster):
            raise NotFound(
                f"cluster {ref.id} is not in the plugin's inventory",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return cluster

    def _nodegroups(self, ref: ClusterRef) -> dict[str, dict[str, Any]]:
        """The cluster's managed node groups by name (ListNodegroups, DescribeNodegroup)."""
        found: dict[str, dict[str, Any]] = {}
        for name in self.api.pages(
            ref.region, "list_nodegroups", "nodegroups", "cluster", clusterName=ref.name
        ):
            found[name] = self.api.call(
                ref.region,
                "describe_nodegroup",
                "node group",
                clusterName=ref.name,
                nodegroupName=name,
            )["nodegroup"]
        return found

    def _listing(self) -> dict[str, tuple[ClusterRef, dict[str, Any]]]:
        found: dict[str, tuple[ClusterRef, dict[str, Any]]] = {}
        names = set(self.config.clusters.names)
        for region in self.config.regions:
            for name in self.api.pages(region, "list_clusters", "clusters"):
                if names and name not in names:
                    continue
                ref = ClusterRef("aws", region, self.config.account, name)
                try:
                    cluster = self.api.call(region, "describe_cluster", "cluster", name=name)
                except NotFound:
                    continue  # deleted between the list and the describe
                arn = parse_cluster_id(str(cluster["cluster"].get("arn", "")))
                if arn is None or arn.account != self.config.account:
                    _LOG.warning("cluster %s is not of account %s; left out", name, ref.account)
                    continue
                if self._selected(cluster["cluster"]):
                    found[arn.id] = (arn, cluster["cluster"])
        return found

    # ------------------------------------------------------------------- inventory

    def _contract_cluster(
        self, ref: ClusterRef, cluster: Mapping[str, Any], nodegroups: Mapping[str, Any]
    ) -> cluster_pb2.Cluster:
        status = str(cluster.get("status", ""))
        available = status in _SERVING
        reasons = [] if available else [f"EKS status {status or 'unknown'}"]
        in_service, problem = self._service_state(ref.id)
        if problem:
            available = False
            reasons.append(problem)
        result = cluster_pb2.Cluster(
            id=ref.id,
            labels=dict(cluster.get("tags") or {}),
            control_plane_version=str(cluster.get("version", "")),
            node_pools=[
                cluster_pb2.NodePool(
                    name=name,
                    version=str(ng.get("version", "")),
                    status=_POOL_STATUS.get(  # type: ignore[arg-type]
                        str(ng.get("status", "")), cluster_pb2.NODE_POOL_STATUS_UNSPECIFIED
                    ),
                )
                for name, ng in sorted(nodegroups.items())
            ],
            available=available,
            unavailable_reason="; ".join(reasons),
            in_service=in_service,
        )
        current = self.store.in_flight(ref.id)
        if current is None and _updating(cluster, nodegroups):
            # Someone else's update (console, eksctl, Terraform): reported, so the caller
            # leaves the cluster alone until it ends.
            foreign = self._foreign_update(ref, cluster, nodegroups)
            if foreign:
                current = self.get_operation(foreign)
        if current is not None:
            result.current_operation.CopyFrom(current)
        return result

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of the selected clusters whose tags include match_labels, by ARN."""
        paging = page_request(page_size, page_token)  # refused before anything is read
        listing = self._listing()
        page = paging.page(
            cid
            for cid, (_, cluster) in listing.items()
            if all((cluster.get("tags") or {}).get(k) == v for k, v in match_labels.items())
        )
        clusters = [
            self._contract_cluster(listing[c][0], listing[c][1], self._nodegroups(listing[c][0]))
            for c in page.keys
        ]
        return cluster_pb2.ListClustersResponse(
            clusters=clusters,
            next_page_token=page.next_page_token,
            total_size=page.total_size,
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """One selected cluster; NotFound for anything else."""
        ref = self._ref(cluster_id)
        cluster = self._describe(ref)
        return cluster_pb2.GetClusterResponse(
            cluster=self._contract_cluster(ref, cluster, self._nodegroups(ref))
        )

    # ------------------------------------------------------------------ operations

    def _refresh(self, ref: UpdateRef) -> cluster_pb2.Operation:
        """The stored operation of an EKS update after DescribeUpdate."""
        update = self._describe_update(ref)
        state, code, message = update_state(update)
        return self.store.update(ref.id, state=state, error_code=code, error_message=message)

    def _describe_update(self, ref: UpdateRef) -> dict[str, Any]:
        params: dict[str, Any] = {"name": ref.cluster.name, "updateId": ref.update_id}
        if ref.nodegroup:
            params["nodegroupName"] = ref.nodegroup
        try:
            update: dict[str, Any] = self.api.call(
                ref.cluster.region, "describe_update", "update", **params
            )["update"]
        except NotFound:
            raise NotFound(
                f"operation {ref.id} not found", reason=Reason.OPERATION_NOT_FOUND
            ) from None
        return update

    def get_operation(self, op_id: str) -> cluster_pb2.Operation:
        """The operation: the stored one (refreshed while in flight), else the EKS update the
        id names (an update this plugin did not start, or started before its journal)."""
        ref = parse_operation_id(op_id)
        try:
            stored = self.store.get(op_id)
        except NotFound:
            stored = None
        if stored is not None:
            if stored.state in TERMINAL_STATES or ref is None:
                return stored
            return self._refresh(ref)
        if ref is None:
            raise NotFound(f"operation {op_id} not found", reason=Reason.OPERATION_NOT_FOUND)
        try:
            self._ref(ref.cluster.id)
        except NotFound:
            raise NotFound(
                f"operation {op_id} not found", reason=Reason.OPERATION_NOT_FOUND
            ) from None
        return self._unstored(ref, self._describe_update(ref))

    @staticmethod
    def _unstored(ref: UpdateRef, update: Mapping[str, Any]) -> cluster_pb2.Operation:
        state, code, message = update_state(update)
        op = cluster_pb2.Operation(
            id=ref.id,
            kind=OP_NODE_POOL if ref.nodegroup else OP_CONTROL_PLANE,
            cluster_id=ref.cluster.id,
            node_pool=ref.nodegroup,
            target_version=_update_version(update),
            state=state,  # type: ignore[arg-type]
            error_code=code,
            error_message=message,
        )
        created = update.get("createdAt")
        if created is not None:
            op.start_time.FromDatetime(created)
        return op

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Changes of the plugin's operations (EKS's arrive at each poll)."""
        return self.store.watch(cluster_ids, include_in_flight, context)

    def _in_flight_update(self, ref: ClusterRef) -> str:
        """The id of an EKS update InProgress on the cluster or one of its node groups: the
        plugin's own, else one EKS lists (ListUpdates, DescribeUpdate), looking first where
        the status says UPDATING (that status is eventually consistent, so then everywhere)."""
        own = self.store.in_flight(ref.id)
        if own is not None:
            return own.id
        cluster = self._describe(ref)
        return self._foreign_update(ref, cluster, self._nodegroups(ref))

    def _foreign_update(
        self, ref: ClusterRef, cluster: Mapping[str, Any], nodegroups: Mapping[str, Any]
    ) -> str:
        """An update InProgress that EKS lists for the cluster or its node groups (ListUpdates,
        DescribeUpdate), "" when there is none."""
        statuses = {"": cluster.get("status")} | {
            name: ng.get("status") for name, ng in nodegroups.items()
        }
        for group in sorted(statuses, key=lambda g: (statuses[g] != "UPDATING", g)):
            extra = {"nodegroupName": group} if group else {}
            ids = list(
                self.api.pages(
                    ref.region, "list_updates", "updateIds", "cluster", name=ref.name, **extra
                )
            )
            for update_id in reversed(ids):  # the newest last (EKS lists by creation)
                candidate = UpdateRef(ref, group, update_id)
                if self._describe_update(candidate).get("status") == "InProgress":
                    return candidate.id
        return ""

    # -------------------------------------------------------------------- upgrades

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeControlPlane as UpdateClusterVersion (caller: unused)."""
        return self._upgrade(OP_CONTROL_PLANE, request_id, cluster_id, "", version)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """UpgradeNodePool as UpdateNodegroupVersion (caller: unused)."""
        return self._upgrade(OP_NODE_POOL, request_id, cluster_id, node_pool, version)

    def _upgrade(
        self, kind: int, request_id: str, cluster_id: str, pool: str, version: str
    ) -> cluster_pb2.Operation:
        ref = self._ref(cluster_id)

        def start(
            initial_state: int = cluster_pb2.OPERATION_STATE_PENDING, op_id: str | None = None
        ) -> cluster_pb2.Operation:
            op, _ = self.store.start(
                request_id=request_id,
                kind=kind,
                cluster_id=cluster_id,
                node_pool=pool,
                target_version=version,
                initial_state=initial_state,
                op_id=op_id,
            )
            return op

        with self._lock(cluster_id):
            if self.store.lookup(request_id) is not None:
                op = start()  # the stored one; InvalidArgument if reused differently
                update_ref = parse_operation_id(op.id)
                if op.state in TERMINAL_STATES or update_ref is None:
                    return op
                return self._refresh(update_ref)
            cluster = self._describe(ref)
            nodegroups = self._nodegroups(ref)
            target = rules.eks_version("version", version)
            if kind == OP_CONTROL_PLANE:
                if rules.same_minor(cluster["version"], version):
                    return start(OP_SUCCEEDED)  # nothing to do: at the target
                rules.check_control_plane(cluster, nodegroups, version, self._offered(ref))
                self._check_insights(ref, target)
            else:
                rules.check_pool(cluster, nodegroups, pool, version)
                if rules.same_minor(nodegroups[pool]["version"], version):
                    return start(OP_SUCCEEDED)  # nothing to do: at the target
                rules.check_pool_health(nodegroups[pool])
            self.store.ensure_free(cluster_id)
            update = self._start_update(ref, pool, target, request_id)
            if _update_version(update) != target:
                raise InvalidArgument(
                    "request_id",
                    f"reused for a different request (its EKS update {update.get('id')} "
                    f"targets {_update_version(update)}); choose a new request_id per change",
                    reason=Reason.REQUEST_ID_REUSED,
                )
            update_ref = UpdateRef(ref, pool, str(update["id"]))
            op = start(cluster_pb2.OPERATION_STATE_RUNNING, update_ref.id)
            state, code, message = update_state(update)
            return self.store.update(op.id, state=state, error_code=code, error_message=message)

    def _start_update(
        self, ref: ClusterRef, pool: str, version: str, request_id: str
    ) -> dict[str, Any]:
        """UpdateClusterVersion / UpdateNodegroupVersion with the request's clientRequestToken:
        the same request_id finds the update it started, in any process, and starts none."""
        token = client_token(request_id)
        try:
            if pool:
                answer = self.api.call(
                    ref.region,
                    "update_nodegroup_version",
                    "node group",
                    clusterName=ref.name,
                    nodegroupName=pool,
                    version=version,
                    clientRequestToken=token,
                )
            else:
                answer = self.api.call(
                    ref.region,
                    "update_cluster_version",
                    "cluster",
                    name=ref.name,
                    version=version,
                    clientRequestToken=token,
                )
        except InUse:
            running = self._in_flight_update(ref)
            if running:
                raise Conflict(
                    f"cluster {ref.id} has EKS update {running} in progress; follow it, then "
                    "ask again",
                    running,
                ) from None
            raise FailedPrecondition(
                f"EKS reports cluster {ref.id} busy (ResourceInUseException); asked again later",
                reason=Reason.CLUSTER_BUSY,
                retry_after=_BUSY_RETRY_SECONDS,
            ) from None
        update: dict[str, Any] = answer["update"]
        return update

    def _offered(self, ref: ClusterRef) -> set[str]:
        """Versions EKS offers in the region (DescribeClusterVersions, supported ones only)."""
        return {
            str(v["clusterVersion"])
            for v in self.api.pages(ref.region, "describe_cluster_versions", "clusterVersions")
            if str(v.get("status", "")).lower() != "unsupported"
            and str(v.get("versionStatus", "")).upper() != "UNSUPPORTED"
        }

    def _check_insights(self, ref: ClusterRef, target: str) -> None:
        """An ERROR UPGRADE_READINESS insight for the target refuses it (for now: insights
        refresh), with the insight's reason; EKS itself answers InvalidStateException."""
        blocking = list(
            self.api.pages(
                ref.region,
                "list_insights",
                "insights",
                "cluster",
                clusterName=ref.name,
                filter={
                    "categories": ["UPGRADE_READINESS"],
                    "kubernetesVersions": [target],
                    "statuses": ["ERROR"],
                },
            )
        )
        blocking = [i for i in blocking if i.get("insightStatus", {}).get("status") == "ERROR"]
        if not blocking:
            return
        first = self.api.call(
            ref.region, "describe_insight", "cluster", clusterName=ref.name, id=blocking[0]["id"]
        )["insight"]
        reason = str(first.get("insightStatus", {}).get("reason", "")) or "no reason given"
        more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
        raise FailedPrecondition(
            f"EKS upgrade insight {first.get('name', first.get('id'))!r} is ERROR for "
            f"{target}: {reason[:_MESSAGE_LIMIT]}{more}; fix it, then EKS refreshes the insight",
            retry_after=self.config.preflight.insight_retry_seconds,
        )

    # ---------------------------------------------------------------------- traffic

    def _service_state(self, cluster_id: str) -> tuple[bool, str]:
        """(in service, problem): Route 53's weights in mode route53 (a cluster without
        configured records is in service: nothing of it is drained); else the last recorded
        ServiceOut / ServiceIn."""
        if self.traffic is not None and self.config.traffic.route53 is not None:
            if cluster_id in self.config.traffic.route53.records:
                return self.traffic.state(cluster_id)
            return True, ""
        last = [
            op
            for op in self.store.operations()
            if op.cluster_id == cluster_id
            and op.kind in (OP_SERVICE_OUT, OP_SERVICE_IN)
            and op.state == OP_SUCCEEDED
        ]
        return not last or last[-1].kind == OP_SERVICE_IN, ""

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """ServiceOut: weight 0 on the cluster's Route 53 records, or recorded (caller: unused)."""
        return self._service(OP_SERVICE_OUT, request_id, cluster_id)

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """ServiceIn: the records' weights restored, or recorded (caller: unused)."""
        return self._service(OP_SERVICE_IN, request_id, cluster_id)

    def _service(self, kind: int, request_id: str, cluster_id: str) -> cluster_pb2.Operation:
        ref = self._ref(cluster_id)

        def start(state: int) -> cluster_pb2.Operation:
            op, _ = self.store.start(
                request_id=request_id, kind=kind, cluster_id=cluster_id, initial_state=state
            )
            return op

        with self._lock(cluster_id):
            if self.store.lookup(request_id) is not None:
                return start(OP_SUCCEEDED)  # the stored one; InvalidArgument if reused differently
            self._describe(ref)
            if self.traffic is None:
                return start(OP_SUCCEEDED)
            self.store.ensure_free(cluster_id)
            drain = self.traffic.change(cluster_id, out=kind == OP_SERVICE_OUT)
            if drain is None:
                return start(OP_SUCCEEDED)  # the weights are as asked already
            op = start(cluster_pb2.OPERATION_STATE_RUNNING)
            self._drains[op.id] = drain
            return op

    def _follow_drain(self, op: cluster_pb2.Operation) -> None:
        """Ends a service operation once its Route 53 changes are INSYNC and drained. One
        recovered from the journal (its change ids died with the process) sets the weights
        again (an UPSERT of the same weights is harmless) and follows that change."""
        if op.kind not in (OP_SERVICE_OUT, OP_SERVICE_IN):
            return
        if self.traffic is None:  # recovered after a switch to mode none: only recorded
            self.store.update(op.id, state=OP_SUCCEEDED)
            return
        drain = self._drains.get(op.id)
        try:
            if drain is None:
                drain = self.traffic.change(op.cluster_id, out=op.kind == OP_SERVICE_OUT)
                if drain is None:
                    self.store.update(op.id, state=OP_SUCCEEDED)
                    return
                self._drains[op.id] = drain
            if self.traffic.done(drain):
                self.store.update(op.id, state=OP_SUCCEEDED)
                self._drains.pop(op.id, None)
        except FailedPrecondition as exc:
            self.store.update(
                op.id,
                state=cluster_pb2.OPERATION_STATE_FAILED,
                error_code="DRAIN_FAILED",
                error_message=exc.message[:_MESSAGE_LIMIT],
            )
            self._drains.pop(op.id, None)

    # -------------------------------------------------------------------- preflight

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """The verdict of the rules the upgrades enforce: never-as-asked refusals first, then
        what may pass later (an update in progress, an upgrade insight, node group health).
        Read-only: Describe*/List* calls only."""
        ref = self._ref(cluster_id)
        cluster = self._describe(ref)
        nodegroups = self._nodegroups(ref)
        cp = control_plane_version

        def never() -> None:
            if cp:
                rules.check_control_plane(cluster, nodegroups, cp, self._offered(ref))
            for pool, version in sorted(node_pool_versions.items()):
                rules.check_pool(cluster, nodegroups, pool, version, cp)

        def later() -> None:
            if _updating(cluster, nodegroups) or self.store.in_flight(ref.id) is not None:
                running = self._in_flight_update(ref) or "an EKS update"
                raise Conflict(f"cluster {ref.id} has {running} in progress", running)
            if cp and not rules.same_minor(cluster["version"], cp):
                self._check_insights(ref, rules.eks_version("control_plane_version", cp))
            for pool, version in sorted(node_pool_versions.items()):
                if not rules.same_minor(nodegroups[pool]["version"], version):
                    rules.check_pool_health(nodegroups[pool])

        verdict = verdict_of_check(never)
        if verdict.verdict != cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED:
            return verdict
        return verdict_of_check(later)

    # ------------------------------------------------------------------------ probe

    def probe(self) -> tuple[bool, str]:
        """(ready, why not): EKS answers ListClusters in the first configured region."""
        try:
            self.api.call(self.config.regions[0], "list_clusters", maxResults=1)
        except PluginError as exc:
            return False, f"EKS is not reachable: {exc.message}"
        return True, ""
