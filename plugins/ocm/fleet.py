"""One OCM hub's fleet as the contract sees it: a facade over the plugin's rooms.

OcmFleet serves the clusters of one hub (OcmHubs, in hubs.py, routes the contract's calls to
the right one). It starts operations through an OperationStore shared by every hub. Its rooms:

- the hub's watch caches (ManagedClusters, and the ClusterCurators and ManifestWorks it
  drives), cluster ids and per-cluster locks: caches.py (HubCaches);
- inventory, from the ManagedCluster cache: here;
- service-out / service-in as our taint, and the operation ledger written with it on each
  ManagedCluster (ledger.py): taints.py (Taints);
- control-plane upgrades and PreflightUpgrade: upgrades.py (Upgrades);
- operations after they start, followed by a thread that re-reads the caches whenever they
  change, and adopted back from the ledgers and upgrade objects after a restart, before the
  plugin answers: follower.py (Follower);
- workload health from a read-only ManifestWork: workloads.py (WorkloadHealth).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm import inventory
from plugins.ocm.caches import HubCaches
from plugins.ocm.config import OcmConfig
from plugins.ocm.follower import Follower
from plugins.ocm.taints import Taints
from plugins.ocm.upgrades import Upgrades
from plugins.ocm.workloads import WorkloadHealth
from plugins.sdk import Kube, OperationStore

__all__ = ["OcmFleet"]

_SERVICE_OUT = cluster_pb2.OPERATION_KIND_SERVICE_OUT
_SERVICE_IN = cluster_pb2.OPERATION_KIND_SERVICE_IN


class OcmFleet:
    """The fleet on one OCM hub, as the contract sees it.

    name: the hub's name (in messages); prefix: what cluster ids carry before the
    ManagedCluster name ("" for a single hub, "<hub>/" with several).
    """

    def __init__(
        self,
        cfg: OcmConfig,
        hub: Kube,
        *,
        store: OperationStore | None = None,
        name: str = "hub",
        prefix: str = "",
    ) -> None:
        self.cfg = cfg
        self.name = name
        self.prefix = prefix
        self._hub = hub
        self._store = store if store is not None else OperationStore(id_prefix="ocm")
        wake = threading.Event()
        self._caches = HubCaches(cfg, hub, name, prefix, wake.set)
        self._taints = Taints(hub, self._caches, self._store, self._require_synced, wake.set)
        self._follower = Follower(self._caches, self._store, self._taints, wake)
        self._upgrades = Upgrades(
            hub,
            self._caches,
            self._store,
            self._taints,
            self._follower,
            self._require_synced,
            wake.set,
        )
        self._health = WorkloadHealth(hub, self._caches, self._require_synced)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the watch caches and the operation follower."""
        self._caches.start()
        self._follower.start()

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        return self._caches.wait_synced(timeout)

    def close(self) -> None:
        """Ends watch streams and threads and releases the hub connection."""
        self._follower.stop()
        self._hub.close()
        self._caches.stop()
        self._follower.join(timeout=2)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        return self._caches.readiness()

    @property
    def synced(self) -> bool:
        """True once every cache has listed the hub once."""
        return self._caches.synced

    @property
    def adopted(self) -> bool:
        """True once the operations recorded on the hub are back in the store."""
        return self._follower.adopted

    def adopt(self) -> None:
        """Once, after the caches listed: puts the operations recorded on the hub back in the
        store (follower.py)."""
        self._follower.adopt()

    def _require_synced(self) -> None:
        self._caches.require_listed()
        self._follower.adopt()

    def qualified(self, name: str) -> str:
        """The cluster id of a ManagedCluster name (the hub prefix added)."""
        return self._caches.qualified(name)

    # -- inventory ---------------------------------------------------------------------------

    def clusters(self, match_labels: Mapping[str, str]) -> list[cluster_pb2.Cluster]:
        """Every ManagedCluster whose labels (and claims) match, from the watch cache."""
        self._require_synced()
        found = []
        for cached in self._caches.clusters.items():
            labels = inventory.labels_of(cached.obj, self.cfg.cluster_claim_label_prefix)
            if all(labels.get(k) == v for k, v in match_labels.items()):
                found.append(self._to_cluster(cached.obj))
        return found

    def get_cluster(self, cluster: str) -> cluster_pb2.Cluster:
        """One cluster from the watch cache."""
        self._require_synced()
        return self._to_cluster(self._caches.managed_cluster(cluster))

    def _to_cluster(self, obj: Mapping[str, Any]) -> cluster_pb2.Cluster:
        name = str(obj["metadata"]["name"])
        current = self._store.in_flight(self.qualified(name))
        found = inventory.to_cluster(obj, self.cfg, self._caches.version(obj), current)
        found.id = self.qualified(name)
        clusters = self._caches.clusters
        if not clusters.healthy:
            # The last state seen, from a hub that does not answer now: not available.
            found.available = False
            found.unavailable_reason = (
                f"hub {self.name} unreachable ({clusters.last_error}); last known state"
            )
        return found

    # -- service-out / service-in (taints.py) ------------------------------------------------

    def service_out(self, request_id: str, cluster: str) -> cluster_pb2.Operation:
        """Adds our NoSelect taint; the operation succeeds when the cache shows it."""
        return self._taints.operation(request_id, cluster, _SERVICE_OUT)

    def service_in(self, request_id: str, cluster: str) -> cluster_pb2.Operation:
        """Removes our taint (never another); the operation succeeds when the cache shows it."""
        return self._taints.operation(request_id, cluster, _SERVICE_IN)

    # -- upgrades and preflight (upgrades.py) ------------------------------------------------

    def upgrade_control_plane(
        self, request_id: str, cluster: str, version: str
    ) -> cluster_pb2.Operation:
        """Starts (or finds) the upgrade by ClusterCurator or ManifestWork."""
        return self._upgrades.upgrade_control_plane(request_id, cluster, version)

    def preflight_upgrade(
        self, cluster: str, version: str, node_pools: Mapping[str, str]
    ) -> cluster_pb2.PreflightUpgradeResponse:
        """Whether UpgradeControlPlane to version would start now (nothing is written)."""
        return self._upgrades.preflight_upgrade(cluster, version, node_pools)

    # -- health (workloads.py) ---------------------------------------------------------------

    def check_workloads(
        self, clusters: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), from the read-only health ManifestWork."""
        return self._health.check_workloads(clusters, workloads)
