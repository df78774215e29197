"""One OCM hub as every room of its fleet reads it: watch caches, cluster ids, per-cluster locks.

ManagedClusters are cached in full; ManifestWorks and ClusterCurators only where this plugin
manages them (its label). Two APIs a hub may lack are cached when they matter, as optional
caches (a 404 or 403 lists them empty, and the list is tried again every minute): HyperShift's
HostedClusters with the ClusterCurator method (which clusters are hosted, and where), and ACM's
ManagedClusterInfos when the version is the OpenShift version claim (its fallback). Each
cache wakes the operation follower on a change. A cluster id is
the ManagedCluster name with the hub's prefix ("" for a single hub, "<hub>/" with several).
Every write this plugin makes to a cluster's objects holds that cluster's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from plugins.ocm import inventory
from plugins.ocm.config import OPENSHIFT_VERSION_SOURCE, OcmConfig
from plugins.ocm.hub import (
    CLUSTER_CURATORS,
    HOSTED_CLUSTERS,
    MANAGED_CLUSTER_INFOS,
    MANAGED_CLUSTERS,
    MANIFEST_WORKS,
    PLACEMENT_DECISIONS,
    PLACEMENTS,
)
from plugins.ocm.objects import MANAGED_SELECTOR
from plugins.sdk import (
    Informer,
    Kube,
    KubeError,
    NotFound,
    Reason,
    Resource,
    Unavailable,
    caches_readiness,
    require_listed,
)

__all__ = ["RETRIES", "HubCaches"]

RETRIES = 8
"""Read-modify-write attempts on 409 before answering UNAVAILABLE."""

_WATCH_SECONDS = 30  # one watch call of a cache
_BACKOFF_MAX = 5.0  # seconds at most between a cache's retries after an error
_ABSENT_RETRY = 60.0  # seconds between lists of an optional API the hub does not serve


class HubCaches:
    """The hub's caches and names.

    name: the hub's name (in messages); prefix: what cluster ids carry before the
    ManagedCluster name; wake: called on every cache change.
    """

    def __init__(
        self, cfg: OcmConfig, hub: Kube, name: str, prefix: str, wake: Callable[[], None]
    ) -> None:
        self.cfg = cfg
        self.name = name
        self.prefix = prefix
        self._hub = hub
        self._wake = wake
        self.clusters = self._informer(MANAGED_CLUSTERS)
        self.works = self._informer(MANIFEST_WORKS, MANAGED_SELECTOR)
        self.curators = (
            self._informer(CLUSTER_CURATORS, MANAGED_SELECTOR)
            if cfg.upgrade_method == "ClusterCurator"
            else None
        )
        # What still selects a cluster being taken out (ServiceOut ends when nothing does).
        waits = cfg.taint.wait_for_placements
        self.placements = self._informer(PLACEMENTS) if waits else None
        self.decisions = self._informer(PLACEMENT_DECISIONS) if waits else None
        # Which clusters are HyperShift hosted clusters (the curator's hosted path).
        self.hosted = (
            self._informer(HOSTED_CLUSTERS, optional=True)
            if cfg.upgrade_method == "ClusterCurator"
            else None
        )
        # The OpenShift version where the ManagedCluster lacks the claim (inventory).
        self.cluster_infos = (
            self._informer(MANAGED_CLUSTER_INFOS, optional=True)
            if cfg.version_source == OPENSHIFT_VERSION_SOURCE
            else None
        )
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def _informer(
        self, resource: Resource, label_selector: str = "", *, optional: bool = False
    ) -> Informer:
        return Informer(
            self._hub,
            resource,
            label_selector=label_selector,
            on_change=self._wake,
            watch_seconds=_WATCH_SECONDS,
            backoff_max=_BACKOFF_MAX,
            optional=optional,
            absent_retry=_ABSENT_RETRY,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def informers(self) -> list[Informer]:
        """Every cache, in a fixed order."""
        found = [self.clusters, self.works]
        for optional in (
            self.curators,
            self.placements,
            self.decisions,
            self.hosted,
            self.cluster_infos,
        ):
            if optional is not None:
                found.append(optional)
        return found

    def selecting(self, cluster: str) -> list[str]:
        """The Placements (namespace/name) whose PlacementDecisions still select the cluster
        and that do not tolerate our taint: the placement controller will drop it from them
        (empty when not waiting for placements)."""
        if self.placements is None or self.decisions is None:
            return []
        placements = {
            (p.obj["metadata"].get("namespace", ""), p.obj["metadata"]["name"]): p.obj
            for p in self.placements.items()
        }
        return inventory.placements_selecting(
            cluster, [d.obj for d in self.decisions.items()], placements, self.cfg.taint
        )

    def start(self) -> None:
        """Starts every watch cache."""
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        """Stops every watch cache."""
        for informer in self.informers:
            informer.stop()

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        return all(informer.wait_synced(timeout) for informer in self.informers)

    @property
    def synced(self) -> bool:
        """True once every cache has listed the hub once."""
        return all(informer.synced for informer in self.informers)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        return caches_readiness(self.informers)

    def require_listed(self) -> None:
        """Unavailable (retry) while a cache has not listed the hub yet."""
        require_listed(self.informers, f"hub {self.name}")

    # -- ids, objects and locks --------------------------------------------------------------

    def qualified(self, name: str) -> str:
        """The cluster id of a ManagedCluster name (the hub prefix added)."""
        return self.prefix + name

    def local(self, cluster_id: str) -> str:
        """The ManagedCluster name of a cluster id of this hub."""
        return cluster_id.removeprefix(self.prefix)

    def mine(self, cluster_id: str) -> bool:
        """True when the cluster id names a cluster of this hub."""
        return cluster_id.startswith(self.prefix) and "/" not in self.local(cluster_id)

    def lock_for(self, cluster: str) -> threading.Lock:
        """The lock every write to the cluster's objects holds."""
        with self._locks_guard:
            return self._locks.setdefault(cluster, threading.Lock())

    def managed_cluster(self, cluster: str) -> dict[str, Any]:
        """The cached ManagedCluster; NotFound (CLUSTER_NOT_FOUND) when the hub has none."""
        cached = self.clusters.get("", cluster)
        if cached is None:
            raise self.not_found(cluster)
        return cached.obj

    def not_found(self, cluster: str) -> NotFound:
        """The contract's NOT_FOUND (CLUSTER_NOT_FOUND) of a ManagedCluster the hub lacks."""
        return NotFound(
            f"cluster {self.qualified(cluster)} not found: no ManagedCluster {cluster} "
            f"on hub {self.name}",
            reason=Reason.CLUSTER_NOT_FOUND,
        )

    def version(self, obj: Mapping[str, Any]) -> str:
        """The cluster's version, read where the configuration says (version_source); for the
        OpenShift version claim, the ManagedClusterInfo when the claim is absent."""
        info = None
        if self.cluster_infos is not None:
            name = str((obj.get("metadata") or {}).get("name", ""))
            cached = self.cluster_infos.get(name, name)
            info = None if cached is None else cached.obj
        return inventory.cluster_version(obj, self.cfg.version_source, info)

    def curator_namespace(self, cluster: str) -> str:
        """The namespace of the cluster's ClusterCurator: the cluster's own (ACM's convention),
        or, with clusterCurator.hostedClusters HostedClusterNamespace, the namespace of the
        cluster's HostedCluster when exactly one sits elsewhere (the curator controller's
        hosted path; upgrades.py refuses the other cases before writing)."""
        if self.cfg.cluster_curator.hosted_clusters != "HostedClusterNamespace":
            return cluster
        elsewhere = [ns for ns in self.hosted_namespaces(cluster) if ns != cluster]
        return elsewhere[0] if len(elsewhere) == 1 else cluster

    def hosted_namespaces(self, cluster: str) -> list[str]:
        """The namespaces (sorted) holding a HyperShift HostedCluster named like the cluster,
        from the HostedCluster cache (empty without HyperShift, or with another method)."""
        if self.hosted is None:
            return []
        return sorted(
            str(c.obj["metadata"].get("namespace", ""))
            for c in self.hosted.items()
            if c.obj["metadata"].get("name") == cluster
        )

    def unavailable(self, action: str, exc: KubeError) -> Unavailable:
        """The contract's UNAVAILABLE for a hub request that failed (the caller retries)."""
        return Unavailable(f"hub {self.name}: cannot {action}: {exc.message}; retry")

    def upgrade_objects(self) -> list[tuple[str, dict[str, Any]]]:
        """(cluster, object) of every upgrade object this plugin drives, from the caches."""
        if self.curators is not None:
            # Named after the cluster: in the cluster's namespace, or a hosted cluster's
            # HostedCluster namespace (curator_namespace).
            return [(c.obj["metadata"]["name"], c.obj) for c in self.curators.items()]
        mw = self.cfg.manifest_work
        assert mw is not None
        return [
            (c.obj["metadata"]["namespace"], c.obj)
            for c in self.works.items()
            if c.obj["metadata"]["name"] == mw.name
        ]

    def upgrade_object(self, cluster: str) -> dict[str, Any] | None:
        """The cluster's cached upgrade object (ClusterCurator or upgrade ManifestWork)."""
        if self.curators is not None:
            cached = self.curators.get(self.curator_namespace(cluster), cluster)
        else:
            assert self.cfg.manifest_work is not None
            cached = self.works.get(cluster, self.cfg.manifest_work.name)
        return None if cached is None else cached.obj
