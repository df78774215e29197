"""One OCM plugin in front of several hubs: cluster ids, routing, and the merged inventory.

OcmHubs is the backend the gRPC servicers call. With one hub, cluster ids are ManagedCluster
names, as they always were; with several (e.g. kealm virtual hubs, one per tenant), ids are
HUB/CLUSTER and every call goes to that hub. The hubs share one OperationStore (operation ids
come from request ids, which are unique), so GetOperation and WatchOperations need no routing.
A hub that stops answering marks only its own clusters unavailable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import grpc

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm.config import OcmConfig
from plugins.ocm.fleet import OcmFleet
from plugins.sdk import (
    InvalidArgument,
    Kube,
    NotFound,
    OperationStore,
    Reason,
    Unavailable,
    Unimplemented,
    check_page_size,
    decode_page_token,
    encode_page_token,
)

__all__ = ["OcmHubs"]


class OcmHubs:
    """Every configured hub, as one ClusterService / HealthService backend."""

    def __init__(self, cfg: OcmConfig, hubs: Mapping[str, Kube]) -> None:
        if not hubs:
            raise ValueError("hubs: at least one hub is needed")
        self.cfg = cfg
        self.store = OperationStore(id_prefix="ocm")
        self.multi = len(hubs) > 1
        self.fleets: dict[str, OcmFleet] = {
            name: OcmFleet(
                cfg, kube, store=self.store, name=name, prefix=f"{name}/" if self.multi else ""
            )
            for name, kube in hubs.items()
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Starts every hub's caches and follower."""
        for fleet in self.fleets.values():
            fleet.start()

    def wait_synced(self, timeout: float) -> bool:
        """True once every hub has been listed (waits up to timeout for each, in turn)."""
        return all(fleet.wait_synced(timeout) for fleet in self.fleets.values())

    def close(self) -> None:
        """Ends watch streams, threads and hub connections."""
        self.store.close()
        for fleet in self.fleets.values():
            fleet.close()

    def close_streams(self) -> None:
        """Ends open WatchOperations streams (a server stop callback)."""
        self.store.close()

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every hub listed and watched; the reasons name the hubs."""
        problems = []
        for name, fleet in self.fleets.items():
            ready, why = fleet.readiness()
            if not ready:
                problems.append(f"hub {name}: {why}" if self.multi else why)
        return not problems, "; ".join(problems)

    # -- routing -----------------------------------------------------------------------------

    def _route(self, cluster_id: str) -> tuple[OcmFleet, str]:
        """(the hub's fleet, the ManagedCluster name) of a cluster id."""
        if not self.multi:
            return next(iter(self.fleets.values())), cluster_id
        hub, sep, name = cluster_id.partition("/")
        fleet = self.fleets.get(hub) if sep else None
        if fleet is None or not name or "/" in name:
            known = ", ".join(sorted(self.fleets))
            raise NotFound(
                f"cluster {cluster_id} not found: ids are HUB/CLUSTER with HUB one of {known}",
                reason=Reason.CLUSTER_NOT_FOUND,
            )
        return fleet, name

    # -- ClusterBackend ----------------------------------------------------------------------

    def list_clusters(
        self, page_size: int, page_token: str, match_labels: Mapping[str, str]
    ) -> cluster_pb2.ListClustersResponse:
        """One page of every hub's clusters, ordered by id.

        UNAVAILABLE while a hub has never been listed: an inventory without its clusters
        would read as clusters removed. A hub listed once and unreachable since still lists
        its clusters, unavailable (OcmFleet._to_cluster).
        """
        size = check_page_size(page_size)
        after = decode_page_token(page_token)
        matching: list[cluster_pb2.Cluster] = []
        for fleet in self.fleets.values():
            matching.extend(fleet.clusters(match_labels))
        matching.sort(key=lambda c: c.id)
        later = [c for c in matching if c.id > after]
        page = later[:size]
        more = len(later) > len(page)
        return cluster_pb2.ListClustersResponse(
            clusters=page,
            next_page_token=encode_page_token(page[-1].id) if more else "",
            total_size=len(matching),
        )

    def get_cluster(self, cluster_id: str) -> cluster_pb2.GetClusterResponse:
        """One cluster, from its hub's watch cache."""
        fleet, name = self._route(cluster_id)
        return cluster_pb2.GetClusterResponse(cluster=fleet.get_cluster(name))

    def service_out(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Adds our taint on the cluster's hub (caller: unused)."""
        fleet, name = self._route(cluster_id)
        return fleet.service_out(request_id, name)

    def service_in(self, request_id: str, cluster_id: str, caller: str) -> cluster_pb2.Operation:
        """Removes our taint on the cluster's hub (caller: unused)."""
        fleet, name = self._route(cluster_id)
        return fleet.service_in(request_id, name)

    def upgrade_control_plane(
        self, request_id: str, cluster_id: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds) the upgrade on the cluster's hub (caller: unused)."""
        fleet, name = self._route(cluster_id)
        return fleet.upgrade_control_plane(request_id, name, version)

    def upgrade_node_pool(
        self, request_id: str, cluster_id: str, node_pool: str, version: str, caller: str
    ) -> cluster_pb2.Operation:
        """Not offered (outside the capabilities: the SDK server answers UNIMPLEMENTED first)."""
        raise Unimplemented("UpgradeNodePool: ManagedClusters report no node pools")

    def preflight_upgrade(
        self, cluster_id: str, control_plane_version: str, node_pool_versions: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether the upgrade would start now, asked of the cluster's hub."""
        fleet, name = self._route(cluster_id)
        return fleet.preflight_upgrade(name, control_plane_version, node_pool_versions)

    def _adopted_everywhere(self) -> None:
        """Puts every listed hub's recorded operations in the store; Unavailable naming the
        hubs not listed yet (an operation asked for may be recorded there)."""
        missing = []
        for name, fleet in self.fleets.items():
            if fleet.synced:
                fleet.adopt()
            else:
                missing.append(name)
        if missing:
            raise Unavailable(
                f"hub {', '.join(missing)} not listed yet: its operations are not known; retry"
            )

    def get_operation(self, operation_id: str) -> cluster_pb2.Operation:
        """The operation's current state (NotFound for ids no hub records)."""
        for fleet in self.fleets.values():
            if fleet.synced:
                fleet.adopt()
        try:
            return self.store.get(operation_id)
        except NotFound:
            self._adopted_everywhere()
            raise

    def watch_operations(
        self, cluster_ids: Sequence[str], include_in_flight: bool, context: grpc.ServicerContext
    ) -> Iterator[cluster_pb2.Operation]:
        """Every update of the clusters' operations until the caller cancels (an id no hub
        knows just never matches)."""
        if include_in_flight:
            self._adopted_everywhere()
        return self.store.watch(cluster_ids, include_in_flight, context)

    # -- HealthBackend -----------------------------------------------------------------------

    def check_workloads(
        self, cluster_ids: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), each from its hub's health ManifestWork."""
        for index, workload in enumerate(workloads):
            if workload.kind not in ("", "Deployment"):
                raise InvalidArgument(
                    f"workloads[{index}].kind",
                    f"{workload.kind!r} is not supported; the OCM plugin reads Deployments "
                    "(leave kind empty or set Deployment)",
                )
        limit = self.cfg.workloads.max_workloads
        if len({(w.namespace, w.name) for w in workloads}) > limit:
            raise InvalidArgument(
                "workloads",
                f"at most {limit} distinct workloads per request (workloads.maxWorkloads)",
            )
        by_hub: dict[str, list[str]] = {}
        fleets: dict[str, OcmFleet] = {}
        for cluster_id in cluster_ids:
            fleet, name = self._route(cluster_id)
            by_hub.setdefault(fleet.name, []).append(name)
            fleets[fleet.name] = fleet
        results: list[health_pb2.WorkloadResult] = []
        for hub, names in by_hub.items():
            results.extend(fleets[hub].check_workloads(names, workloads))
        first = {cid: i for i, cid in reversed(list(enumerate(cluster_ids)))}
        results.sort(key=lambda r: first[r.cluster_id])  # stable: per cluster, per workload
        return results

    def query_metric(
        self, query: str, args: Mapping[str, str], cluster_id: str
    ) -> health_pb2.QueryMetricResponse:
        """Not offered (outside the capabilities: the SDK server answers UNIMPLEMENTED first)."""
        raise Unimplemented("QueryMetric: the OCM plugin does not query metrics")
