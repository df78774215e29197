"""The KubeFleet hub's watch caches: what every other room of the plugin reads.

Approval requests, update runs and trackers (of the served cookbook), MemberClusters, and in
reports mode the MetricCollectorReports and (seed cookbook) the objects this plugin owns. Every
cache wakes the reconcile thread on a change; this module starts and stops them and says
whether they are listed and watching.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.objects import (
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CLUSTER_RESOURCE_OVERRIDES,
    CLUSTER_RESOURCE_PLACEMENTS,
    CLUSTER_STAGED_UPDATE_RUNS,
    MANAGED_SELECTOR,
    MEMBER_CLUSTERS,
    METRIC_COLLECTORS,
    REPORT_SELECTOR,
    STAGED_UPDATE_RUNS,
    Cookbook,
)
from plugins.sdk import (
    Informer,
    Kube,
    KubeError,
    Resource,
    Unavailable,
    caches_readiness,
    require_listed,
)

__all__ = ["HubCaches", "hub_unavailable"]


def hub_unavailable(action: str, exc: KubeError) -> Unavailable:
    """The contract's UNAVAILABLE for a hub request that failed (the caller retries)."""
    return Unavailable(f"hub: cannot {action}: {exc.message}; retry")


class HubCaches:
    """The hub's informers, each calling wake on a change."""

    def __init__(
        self, cfg: KubeFleetConfig, kube: Kube, cookbook: Cookbook, wake: Callable[[], None]
    ) -> None:
        self.reports_mode = cfg.health_source == "reports"
        self.seed = cookbook.collectors is not None
        self.requests = {
            CLUSTER_APPROVAL_REQUESTS: Informer(kube, CLUSTER_APPROVAL_REQUESTS, on_change=wake),
            APPROVAL_REQUESTS: Informer(kube, APPROVAL_REQUESTS, on_change=wake),
        }
        self.runs = {
            CLUSTER_STAGED_UPDATE_RUNS: Informer(kube, CLUSTER_STAGED_UPDATE_RUNS, on_change=wake),
            STAGED_UPDATE_RUNS: Informer(kube, STAGED_UPDATE_RUNS, on_change=wake),
        }
        self.trackers = {
            res: Informer(kube, res, on_change=wake)
            for res in (cookbook.cluster_trackers, cookbook.staged_trackers)
        }
        self.members = Informer(kube, MEMBER_CLUSTERS, on_change=wake)
        self.owned: dict[Resource, Informer] = {}
        self.reports: Informer | None = None
        if self.reports_mode:
            # seed: the reports our agent writes (it labels them); current: those we create.
            selector = REPORT_SELECTOR if self.seed else MANAGED_SELECTOR
            self.reports = Informer(kube, cookbook.reports, label_selector=selector, on_change=wake)
            if self.seed:
                for res in (
                    METRIC_COLLECTORS,
                    CLUSTER_RESOURCE_OVERRIDES,
                    CLUSTER_RESOURCE_PLACEMENTS,
                ):
                    self.owned[res] = Informer(
                        kube, res, label_selector=MANAGED_SELECTOR, on_change=wake
                    )

    @property
    def informers(self) -> list[Informer]:
        """Every cache, in a fixed order."""
        found = [
            *self.requests.values(),
            *self.runs.values(),
            *self.trackers.values(),
            self.members,
            *self.owned.values(),
        ]
        if self.reports is not None:
            found.append(self.reports)
        return found

    def start(self) -> None:
        """Starts every watch cache."""
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        """Stops every cache at once; their daemon threads end on their own."""
        for informer in self.informers:
            informer.stop(timeout=0)

    def wait_synced(self, timeout: float) -> bool:
        """True once every cache has listed the hub once."""
        deadline = time.monotonic() + timeout
        return all(
            informer.wait_synced(max(0.0, deadline - time.monotonic()))
            for informer in self.informers
        )

    @property
    def synced(self) -> bool:
        """True once every cache has listed the hub once (no waiting)."""
        return all(informer.synced for informer in self.informers)

    def readiness(self) -> tuple[bool, str]:
        """(ready, why not): every cache listed and its watch healthy."""
        return caches_readiness(self.informers)

    def require_listed(self) -> None:
        """Unavailable (retry) while a cache has not listed the hub yet."""
        require_listed(self.informers, "hub")
