"""The hub objects health data needs, kept per pending tracked gate (reports mode).

current cookbook: one MetricCollectorReport per cluster to collect on, created by this plugin.
seed cookbook: per gate a MetricCollector and its placements, and the shared
ClusterResourceOverrides that select the collectors (at most --max-overrides of them). Bodies
come from collection.py; this module creates, patches (only when the cached object lacks what
we want) and deletes them, each write backing off on its own when it fails.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from plugins.kubefleet import collection
from plugins.kubefleet.backoff import WriteBackoff
from plugins.kubefleet.caches import HubCaches
from plugins.kubefleet.config import KubeFleetConfig
from plugins.kubefleet.gates import GateView
from plugins.kubefleet.objects import (
    CLUSTER_RESOURCE_OVERRIDES,
    CLUSTER_RESOURCE_PLACEMENTS,
    LABEL_MANAGED_BY,
    LABEL_METRIC_COLLECTOR,
    MANAGED_BY,
    METRIC_COLLECTORS,
    Cookbook,
)
from plugins.sdk import Kube, KubeConflict, KubeError, KubeNotFound, Resource

__all__ = ["HealthObjects"]

_LOG = logging.getLogger("plugins.kubefleet.health_objects")


class HealthObjects:
    """Creates what the collecting gates need and deletes what none needs any more."""

    def __init__(
        self,
        cfg: KubeFleetConfig,
        kube: Kube,
        cookbook: Cookbook,
        caches: HubCaches,
        writes: WriteBackoff,
    ) -> None:
        self.cfg = cfg
        self.cookbook = cookbook
        self._kube = kube
        self._caches = caches
        self._writes = writes
        self._unplaced: list[str] = []

    def keep(self, collecting: Sequence[GateView]) -> None:
        """One pass: the objects of the collecting gates exist, our others are deleted."""
        if self._caches.seed:
            wanted = self._ensure_seed_collection(collecting)
        else:
            wanted = self._ensure_reports(collecting)
        self._collect_garbage(wanted)

    def _ensure(self, res: Resource, namespace: str, body: dict[str, Any]) -> None:
        """Creates the object, or patches its spec, labels and annotations when the cached one
        does not carry them (fields the server defaulted or added are fine: no re-patch)."""
        name = body["metadata"]["name"]
        key = f"{res.kind}/{namespace}/{name}"
        informer = self._caches.reports if res == self.cookbook.reports else self._caches.owned[res]
        assert informer is not None
        cached = informer.get(namespace, name)
        if cached is not None and cached.obj["metadata"].get("deletionTimestamp"):
            return  # being deleted: created again once it is gone
        meta = body["metadata"]
        wanted = {
            "spec": body["spec"],
            "metadata": {k: meta[k] for k in ("labels", "annotations") if k in meta},
        }
        if cached is not None and _covers(cached.obj, wanted):
            self._writes.succeeded(key)
            return
        if not self._writes.may_write(key):
            return
        try:
            if cached is None:
                self._kube.create(res, namespace, body)
            else:
                version = cached.obj["metadata"]["resourceVersion"]
                patch = {**wanted, "metadata": {**wanted["metadata"], "resourceVersion": version}}
                self._kube.merge_patch(res, namespace, name, patch)
        except KubeConflict:
            return  # exists already / changed meanwhile: the cache brings it next pass
        except KubeError as exc:
            self._writes.failed(key, f"write the {res.kind}", exc)
            return
        self._writes.succeeded(key)

    def _ensure_reports(self, views: Sequence[GateView]) -> set[tuple[Resource, str, str]]:
        """current cookbook: the gates' MetricCollectorReports, one per cluster to collect on."""
        wanted: set[tuple[Resource, str, str]] = set()
        for view in views:
            for res, namespace, body in collection.report_bodies(
                view.ref,
                view.obj,
                view.collect_on,
                self.cookbook,
                self.cfg.member_prometheus_url,
                self.cfg.collect_interval,
            ):
                wanted.add((res, namespace, body["metadata"]["name"]))
                self._ensure(res, namespace, body)
        return wanted

    def _ensure_seed_collection(self, views: Sequence[GateView]) -> set[tuple[Resource, str, str]]:
        """seed cookbook: per gate a MetricCollector and its placements, and the shared
        overrides (a collector's placements are created once its override selects it)."""
        wanted: set[tuple[Resource, str, str]] = set()
        bodies = {}
        for view in views:
            collector, placements = collection.seed_bodies(
                view.ref,
                view.obj,
                view.collect_on,
                self.cfg.member_prometheus_url,
                self.cfg.collect_interval,
            )
            bodies[collector["metadata"]["name"]] = (collector, placements)
        current = {
            str(c.obj["metadata"]["name"]): collection.selected_collectors(c.obj)
            for c in self._caches.owned[CLUSTER_RESOURCE_OVERRIDES].items()
        }
        plan, unplaced = collection.plan_overrides(current, sorted(bodies), self.cfg.max_overrides)
        if unplaced and unplaced != self._unplaced:
            _LOG.warning(
                f"{len(unplaced)} MetricCollector(s) wait for room: the "
                f"{self.cfg.max_overrides} ClusterResourceOverrides this plugin may use "
                "(--max-overrides) are full",
                extra={"fields": {"waiting": ", ".join(unplaced[:5])}},
            )
        self._unplaced = unplaced
        for name, collectors in sorted(plan.items()):
            wanted.add((CLUSTER_RESOURCE_OVERRIDES, "", name))
            self._ensure(CLUSTER_RESOURCE_OVERRIDES, "", collection.override_body(name, collectors))
        selected = {c for names in current.values() for c in names}
        for mc, (collector, placements) in sorted(bodies.items()):
            if mc in unplaced:
                continue
            wanted.add((METRIC_COLLECTORS, "", mc))
            self._ensure(METRIC_COLLECTORS, "", collector)
            for placement in placements:
                wanted.add((CLUSTER_RESOURCE_PLACEMENTS, "", placement["metadata"]["name"]))
                if mc in selected:  # the override is in place: the first rollout has it
                    self._ensure(CLUSTER_RESOURCE_PLACEMENTS, "", placement)
        return wanted

    def _collect_garbage(self, wanted: set[tuple[Resource, str, str]]) -> None:
        """Deletes our objects that no pending tracked gate needs (placements first), and the
        reports of our MetricCollectors that no longer exist (the agent copies the collector's
        managed-by label onto its report)."""
        reports = self._caches.reports
        assert reports is not None
        if not self._caches.seed:
            for cached in reports.items():
                meta = cached.obj["metadata"]
                key = (self.cookbook.reports, str(meta["namespace"]), str(meta["name"]))
                if key not in wanted and not meta.get("deletionTimestamp"):
                    self._delete(self.cookbook.reports, key[1], key[2])
            return
        for res in (CLUSTER_RESOURCE_PLACEMENTS, CLUSTER_RESOURCE_OVERRIDES, METRIC_COLLECTORS):
            for cached in self._caches.owned[res].items():
                meta = cached.obj["metadata"]
                if (res, "", meta["name"]) in wanted or meta.get("deletionTimestamp"):
                    continue
                self._delete(res, "", meta["name"])
        collectors = {
            c.obj["metadata"]["name"] for c in self._caches.owned[METRIC_COLLECTORS].items()
        }
        for cached in reports.items():
            meta = cached.obj["metadata"]
            labels = meta.get("labels") or {}
            if (
                labels.get(LABEL_MANAGED_BY) != MANAGED_BY  # a report of someone else's collector
                or labels.get(LABEL_METRIC_COLLECTOR, "") in collectors
                or meta.get("deletionTimestamp")
            ):
                continue
            self._delete(self.cookbook.reports, meta["namespace"], meta["name"])

    def _delete(self, res: Resource, namespace: str, name: str) -> None:
        key = f"{res.kind}/{namespace}/{name}"
        if not self._writes.may_write(key):
            return
        try:
            self._kube.delete(res, namespace, name)
        except KubeNotFound:
            pass
        except KubeError as exc:
            self._writes.failed(key, f"delete the {res.kind}", exc)
            return
        self._writes.succeeded(key)


def _covers(current: Any, wanted: Any) -> bool:
    """True when current carries every field of wanted with the same value; fields the server
    added (defaults such as a selector's selectionScope) are allowed, in lists item by item."""
    if isinstance(wanted, Mapping):
        return isinstance(current, Mapping) and all(
            _covers(current.get(k), v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_covers(c, w) for c, w in zip(current, wanted, strict=True))
        )
    return bool(current == wanted)
