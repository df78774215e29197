"""A provider composed of one plugin per capability, as the run driver's `Provider` (pure).

docs/plugin-contract.md, "Composed providers", is the reference. A composed FleetProvider names
a part for each role (api.PART_ROLES): the inventory part's clusters are the run's (their ids,
labels and availability); the traffic part services them out and in; the upgrades part upgrades
them and is the source of truth for their versions (it reads the provider's API on every
ListClusters, where e.g. KubeFleet's `k8s.io/k8s-version` property is cached for 15 minutes);
the preflight part answers PreflightUpgrade. Each part knows a cluster by its own id, made from
the inventory plugin's id and labels by the part's clusterId template (`part_id`).

A cluster that has no id on a part it needs (a label the template reads is missing, or two
clusters make one id, or the part does not list the id) is refused on its own: preflight
answers REFUSED_NEVER naming the label or the id, so it is Blocked before anything is drained
(invariant 5) and the rest of the run goes on (invariant 7).

Identity (docs/plugin-contract.md, "Provider identity"): a composed provider's clusters carry
the inventory part's identity and ids, so its runs meet runs on the plain inventory plugin
(holdings, floors: orchestrator.pipeline.crossrun) cluster by cluster.

The UpdateRun controller builds it over GrpcProviders (orchestrator.adapters.composed); the
simulation over its model fleets: the same code.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Protocol

from orchestrator.api import CLUSTER_ID_PLACEHOLDER
from orchestrator.engine.decide import Call, Preflight, Verdict, step_of
from orchestrator.engine.observations import ClusterObs, OpKind, OpObs, Snapshot
from orchestrator.pipeline.driver import CallError, Provider

__all__ = [
    "REQUIRED_CAPABILITIES",
    "ComposedProvider",
    "PartProvider",
    "Route",
    "Unmapped",
    "missing_capabilities",
    "part_id",
]

#: What each role's plugin must declare (GetPluginCapabilities, without the PLUGIN_CAPABILITY_
#: prefix): every entry, where an entry is a set of alternatives.
REQUIRED_CAPABILITIES: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "inventory": (("CLUSTER_INVENTORY",),),
    "traffic": (("CLUSTER_SERVICE",),),
    "upgrades": (("CLUSTER_INVENTORY",), ("UPGRADE_CONTROL_PLANE",), ("UPGRADE_NODE_POOL",)),
    "preflight": (("PREFLIGHT_UPGRADE",),),
    "health": (("CHECK_WORKLOADS", "QUERY_METRIC"),),
}

_PLACEHOLDER = re.compile(r"\{(id|label:[A-Za-z0-9./_-]+)(\|lower)?\}")
#: Preflight reason codes of the composition's own refusals.
UNMAPPED_REASON = "ClusterIdUnmapped"
UNLISTED_REASON = "ClusterNotInPart"


def missing_capabilities(
    provider: str,
    parts: Mapping[str, tuple[str, bool]],
    declared: Mapping[str, frozenset[str]],
) -> list[str]:
    """Every capability a part lacks for its role, as a message naming the composed
    FleetProvider, the role, the part's FleetProvider and the capability.

    parts: role → (the part's FleetProvider, named in spec.parts: False for a default, which
    lacking a capability only leaves unused); declared: FleetProvider → its capabilities.
    """
    out = []
    for role, needs in REQUIRED_CAPABILITIES.items():
        if role not in parts:
            continue
        name, named = parts[role]
        if not named:
            continue
        has = declared.get(name, frozenset())
        for alternatives in needs:
            if has.isdisjoint(alternatives):
                out.append(
                    f"FleetProvider {provider}: part {role} (FleetProvider {name}) does not "
                    f"declare capability {' or '.join(alternatives)}; name a plugin that does "
                    f"in spec.parts.{role}"
                )
    return out


@dataclass(frozen=True)
class Unmapped:
    """Why a cluster has no id on a part: the words for its refusal."""

    reason: str
    message: str


def part_id(template: str, cluster: ClusterObs) -> str | Unmapped:
    """The part's id of cluster, by the template (api.ProviderPart.cluster_id); Unmapped
    naming the label when the cluster lacks one the template reads (or has it empty)."""
    if template == CLUSTER_ID_PLACEHOLDER:
        return cluster.id
    missing: list[str] = []

    def fill(m: re.Match[str]) -> str:
        what, lower = m.group(1), m.group(2)
        if what == "id":
            value = cluster.id
        else:
            key = what[len("label:") :]
            value = cluster.labels.get(key, "")
            if not value:
                missing.append(key)
        return value.lower() if lower else value

    out = _PLACEHOLDER.sub(fill, template)
    if missing:
        return Unmapped(UNMAPPED_REASON, f"no label {missing[0]}")
    return out


class PartProvider(Provider, Protocol):
    """A part: the driver's Provider, plus the reads the UpdateRun controller makes."""

    def inventory(self) -> Mapping[str, ClusterObs]:
        """Every cluster the plugin lists."""

    def learn(self, steps: Sequence[tuple[str, str, str]]) -> None:
        """Catch up on operations in flight: (request id, operation id, cluster id)."""


@dataclass(frozen=True)
class Route:
    """One role's part: its FleetProvider's name, the plugin, and its clusterId template."""

    role: str
    name: str
    part: PartProvider
    template: str = CLUSTER_ID_PLACEHOLDER


@dataclass
class _Ids:
    """One route's ids of the inventory's clusters, both ways (only unambiguous ones)."""

    to_part: dict[str, str] = field(default_factory=dict)
    to_run: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, Unmapped] = field(default_factory=dict)


@dataclass
class ComposedProvider:
    """The driver's Provider over one part per role (see the module's docstring)."""

    #: The composed FleetProvider's name (in messages).
    name: str
    inventory_route: Route
    traffic: Route
    upgrades: Route
    #: None: no part answers preflight (only the composition's own refusals are given).
    preflight_route: Route | None
    clock: Callable[[], datetime]
    #: Per route, the ids made from the inventory read they were made from (`_all_ids`).
    _made: dict[tuple[int, str], tuple[Mapping[str, ClusterObs], _Ids]] = field(
        default_factory=dict, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def supports_preflight(self) -> bool:
        """Always: a cluster without an id on a part it needs is refused by preflight."""
        return True

    # -- ids -------------------------------------------------------------------------------

    def _ids(self, route: Route, clusters: Iterable[ClusterObs]) -> _Ids:
        out = _Ids()
        by_part: dict[str, list[str]] = {}
        for c in clusters:
            found = part_id(route.template, c)
            if isinstance(found, Unmapped):
                out.unmapped[c.id] = Unmapped(
                    found.reason,
                    f"cluster {c.id} has {found.message}, which FleetProvider {self.name}'s "
                    f"spec.parts.{route.role}.clusterId reads to name it to FleetProvider "
                    f"{route.name}; label the cluster, or fix the template",
                )
                continue
            by_part.setdefault(found, []).append(c.id)
        for pid, cids in by_part.items():
            if len(cids) > 1:
                for cid in cids:
                    out.unmapped[cid] = Unmapped(
                        UNMAPPED_REASON,
                        f"clusters {', '.join(sorted(cids))} all make id {pid} on FleetProvider "
                        f"{route.name} (FleetProvider {self.name}'s spec.parts.{route.role}."
                        "clusterId); one id must name one cluster: fix the template or labels",
                    )
                continue
            out.to_part[cids[0]] = pid
            out.to_run[pid] = cids[0]
        return out

    def _routes(self) -> list[Route]:
        """The routes whose parts are asked for clusters: traffic and upgrades, once when
        they are one plugin with one template."""
        return (
            [self.traffic] if _same(self.traffic, self.upgrades) else [self.traffic, self.upgrades]
        )

    def _all_ids(self, route: Route) -> _Ids:
        """The route's ids of every cluster of the inventory (an id two clusters make is
        nobody's, whichever of them is asked about); made once per inventory read (a plugin's
        inventory is read once per pass, and a pass asks this for every call it makes)."""
        with _asking(self.name, self.inventory_route):
            clusters = self.inventory_route.part.inventory()
        key = _key(route)
        with self._lock:
            known = self._made.get(key)
            if known is not None and known[0] is clusters:
                return known[1]
        ids = self._ids(route, clusters.values())
        with self._lock:
            self._made[key] = (clusters, ids)
        return ids

    def _part_snapshot(self, route: Route, ids: _Ids, inv: Snapshot) -> Snapshot:
        if route.part is self.inventory_route.part and route.template == CLUSTER_ID_PLACEHOLDER:
            return inv
        return route.part.snapshot(sorted(ids.to_part.values()))

    # -- the driver's Provider ---------------------------------------------------------------

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        """The inventory part's clusters, each with its versions from the upgrades part and
        its service state from the traffic part; every part's operations, by request id,
        with the run's cluster ids."""
        with _asking(self.name, self.inventory_route):
            inv = self.inventory_route.part.snapshot(cluster_ids)
        seen: dict[tuple[int, str], tuple[_Ids, Snapshot]] = {}
        forgotten = set(inv.forgotten)
        for route in self._routes():
            ids = self._all_ids(route)
            with _asking(self.name, route):
                snap = self._part_snapshot(route, ids, inv)
            seen[_key(route)] = (ids, snap)
            forgotten |= snap.forgotten
        # Every part's operations (request ids never repeat across parts), each under the
        # run's id of its cluster when a part's ids name it.
        to_run: dict[str, str] = {}
        for ids, _ in seen.values():
            to_run.update(ids.to_run)
        operations: dict[str, OpObs] = {}
        for snap in [inv, *(snap for _, snap in seen.values())]:
            for rid, op in snap.operations.items():
                operations.setdefault(rid, _renamed(op, to_run))

        def of(route: Route, cid: str) -> ClusterObs | None:
            ids, snap = seen[_key(route)]
            pid = ids.to_part.get(cid)
            return None if pid is None else snap.clusters.get(pid)

        clusters = {
            cid: self._merge(c, of(self.traffic, cid), of(self.upgrades, cid))
            for cid, c in inv.clusters.items()
        }
        return Snapshot(clusters, operations, frozenset(forgotten))

    def _merge(
        self, c: ClusterObs, traffic: ClusterObs | None, upgrades: ClusterObs | None
    ) -> ClusterObs:
        """One cluster as the run sees it: the inventory's id, labels and availability; the
        upgrades part's versions, pools and windows; the traffic part's service state; down
        when any part says so; the operation in flight on any part."""
        # Without the upgrades part's view (no id there, or not listed) the inventory's
        # versions stand: short of target, the cluster is preflighted and refused naming why
        # (`_resolve`); at target there it is skipped (docs/plugin-contract.md, "Composed
        # providers": a version property lags behind, never ahead).
        merged = c
        if upgrades is not None:
            merged = replace(
                merged,
                control_plane_version=upgrades.control_plane_version,
                node_pools=upgrades.node_pools,
                maintenance_windows=upgrades.maintenance_windows,
            )
        if traffic is not None:
            merged = replace(merged, in_service=traffic.in_service)
        for part, route in ((upgrades, self.upgrades), (traffic, self.traffic)):
            if part is not None and not part.available and merged.available:
                why = part.unavailable_reason or "unavailable"
                merged = replace(
                    merged, available=False, unavailable_reason=f"FleetProvider {route.name}: {why}"
                )
        ops = [o.current_operation for o in (upgrades, traffic, c) if o is not None]
        running = [op for op in ops if op is not None and not op.state.terminal]
        current = running[0] if running else next((op for op in ops if op is not None), None)
        if current is not None:
            current = replace(current, cluster_id=c.id)
        return replace(merged, current_operation=current)

    def inventory(self) -> dict[str, ClusterObs]:
        """Every cluster of the inventory part, merged (what a run pins)."""
        with _asking(self.name, self.inventory_route):
            ids = sorted(self.inventory_route.part.inventory())
        return dict(self.snapshot(ids).clusters)

    def _route_of(self, kind: OpKind) -> Route:
        return self.upgrades if kind in (OpKind.CONTROL_PLANE, OpKind.NODE_POOL) else self.traffic

    def _resolve(self, route: Route, cluster_id: str) -> str | Unmapped:
        """The part's id of one of the run's clusters (Unmapped: the refusal's words)."""
        ids = self._all_ids(route)
        if cluster_id not in ids.to_part and cluster_id not in ids.unmapped:
            return Unmapped(UNLISTED_REASON, f"cluster {cluster_id} is not in the inventory")
        if cluster_id in ids.unmapped:
            return ids.unmapped[cluster_id]
        pid = ids.to_part[cluster_id]
        with _asking(self.name, route):
            listed = pid in route.part.snapshot([pid]).clusters
        if not listed:
            return Unmapped(
                UNLISTED_REASON,
                f"cluster {cluster_id} is {pid} on FleetProvider {route.name} (FleetProvider "
                f"{self.name}'s spec.parts.{route.role}.clusterId), which does not list it; "
                "fix the labels or the template, or add the cluster to that plugin",
            )
        return pid

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        """Refused (never) when the cluster has no id on a part the upgrade needs; otherwise
        the preflight part's answer (accepted when there is none)."""
        routes = [self.traffic, self.upgrades]
        if self.preflight_route is not None:
            routes.append(self.preflight_route)
        ids: dict[str, str] = {}
        for route in routes:
            found = self._resolve(route, cluster_id)
            if isinstance(found, Unmapped):
                return Preflight(Verdict.REFUSED_NEVER, self.clock(), found.reason, found.message)
            ids[route.role] = found
        if self.preflight_route is None:
            return Preflight(
                Verdict.ACCEPTED,
                self.clock(),
                message=f"FleetProvider {self.name} has no preflight part",
            )
        with _asking(self.name, self.preflight_route):
            return self.preflight_route.part.preflight(ids["preflight"], version, pools)

    def call(self, call: Call) -> OpObs:
        """The call made on its role's part, with the part's id of the cluster."""
        route = self._route_of(call.kind)
        found = self._resolve(route, call.cluster_id)
        if isinstance(found, Unmapped):
            raise CallError("FAILED_PRECONDITION", found.message, retryable=False)
        with _asking(self.name, route):
            op = route.part.call(replace(call, cluster_id=found))
        return replace(op, cluster_id=call.cluster_id)

    def learn(self, steps: Sequence[tuple[str, str, str]]) -> None:
        """Each step's catch-up asked of the part that made its call (by the step in its
        request id), once per plugin, with the part's ids."""
        by_part: dict[int, tuple[PartProvider, list[tuple[str, str, str]]]] = {}
        for route in self._routes() if steps else []:
            ids = self._all_ids(route)
            for rid, op_id, cid in steps:
                kind = step_of(rid).split("/", 1)[0]
                wanted = self._route_of(OpKind(kind)) if kind in set(OpKind) else self.traffic
                if not _same(wanted, route) or cid not in ids.to_part:
                    continue
                entry = by_part.setdefault(id(route.part), (route.part, []))
                entry[1].append((rid, op_id, ids.to_part[cid]))
        for route in {id(r.part): r for r in self._routes()}.values():
            found = by_part.get(id(route.part))
            with _asking(self.name, route):
                route.part.learn(found[1] if found else [])


@contextmanager
def _asking(provider: str, route: Route) -> Iterator[None]:
    """A part's failure, saying which part of which composed FleetProvider failed."""
    try:
        yield
    except CallError as err:
        raise CallError(
            err.code,
            f"FleetProvider {provider}: part {route.role} (FleetProvider {route.name}): "
            f"{err.message}",
            err.retryable,
            err.retry_after,
        ) from err


def _key(route: Route) -> tuple[int, str]:
    return (id(route.part), route.template)


def _same(a: Route, b: Route) -> bool:
    """One plugin asked with one template: one set of ids, one snapshot."""
    return _key(a) == _key(b)


def _renamed(op: OpObs, to_run: Mapping[str, str]) -> OpObs:
    """op with the run's id of its cluster (as the part named it, when unknown)."""
    cid = to_run.get(op.cluster_id)
    return op if cid is None or cid == op.cluster_id else replace(op, cluster_id=cid)
