"""Workload health of ManagedClusters, read from a read-only health ManifestWork per cluster.

The ManifestWork (work.py builds it) asks each cluster's work agent to report the wanted
Deployments' status back (statusFeedback); a Deployment the work does not list yet is added to
it (keeping the others while under workloads.maxWorkloads) and reads as unknown until the
agent reports it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fleetupgrade.plugin.v1 import health_pb2
from plugins.ocm import inventory, work
from plugins.ocm.caches import RETRIES, HubCaches
from plugins.ocm.hub import MANIFEST_WORKS
from plugins.sdk import Kube, KubeConflict, KubeError, KubeNotFound, Unavailable

__all__ = ["WorkloadHealth"]


class WorkloadHealth:
    """CheckWorkloads on one hub.

    require_synced: raises Unavailable until the hub is listed and its operations adopted.
    """

    def __init__(self, hub: Kube, caches: HubCaches, require_synced: Callable[[], None]) -> None:
        self.cfg = caches.cfg
        self._hub = hub
        self._caches = caches
        self._require_synced = require_synced

    def check_workloads(
        self, clusters: Sequence[str], workloads: Sequence[health_pb2.Workload]
    ) -> list[health_pb2.WorkloadResult]:
        """One verdict per (cluster, workload), from the read-only health ManifestWork."""
        self._require_synced()
        for cluster in clusters:
            self._caches.managed_cluster(cluster)
        results = []
        name = self.cfg.workloads.manifest_work_name
        wanted = {(w.namespace, w.name) for w in workloads}
        for cluster in clusters:
            cached = self._caches.works.get(cluster, name)
            have = work.workloads_in(cached.obj if cached else None)
            if not wanted <= have:
                self._write_health_work(cluster, wanted)
            available = inventory.availability(self._caches.managed_cluster(cluster))
            for workload in workloads:
                reading = work.read_workload(
                    cached.obj if cached else None,
                    available,
                    workload.namespace,
                    workload.name,
                    workload.min_healthy_replicas,
                )
                result = health_pb2.WorkloadResult(
                    cluster_id=self._caches.qualified(cluster),
                    workload=workload,
                    health=reading.health,  # type: ignore[arg-type]
                    healthy_replicas=reading.healthy_replicas,
                    observed_value=reading.observed_value,
                    message=reading.message,
                )
                if cached is not None:
                    result.observed_time.FromDatetime(cached.received)
                results.append(result)
        return results

    def _write_health_work(self, cluster: str, wanted: set[tuple[str, str]]) -> None:
        """Adds the wanted Deployments to the cluster's health ManifestWork (keeping the others
        while under workloads.maxWorkloads)."""
        name = self.cfg.workloads.manifest_work_name
        with self._caches.lock_for(cluster):
            for _ in range(RETRIES):
                try:
                    current: dict[str, Any] | None = self._hub.get(MANIFEST_WORKS, cluster, name)
                except KubeNotFound:
                    current = None
                except KubeError as exc:
                    raise self._caches.unavailable("read the health ManifestWork", exc) from exc
                have = work.workloads_in(current)
                if wanted <= have:
                    return
                union = have | wanted
                keep = union if len(union) <= self.cfg.workloads.max_workloads else wanted
                body = work.health_work(self.cfg.workloads, cluster, sorted(keep))
                try:
                    if current is None:
                        self._hub.create(MANIFEST_WORKS, cluster, body)
                    else:
                        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                        self._hub.replace(MANIFEST_WORKS, cluster, name, body)
                    return
                except KubeConflict:
                    continue
                except KubeError as exc:
                    raise self._caches.unavailable("write the health ManifestWork", exc) from exc
        raise Unavailable(
            f"hub {self._caches.name}: ManifestWork {cluster}/{name} kept changing; retry"
        )
