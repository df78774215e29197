"""The fleet as the planner sees it: immutable observations of clusters and operations.

Those kept per cluster and per operation have __slots__ (no __dict__ each: about 300 bytes
less per object, tens of thousands of them at 10,000 clusters)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from enum import StrEnum

__all__ = [
    "Changes",
    "ClusterObs",
    "OpKind",
    "OpObs",
    "OpState",
    "PoolObs",
    "Snapshot",
    "WindowObs",
    "apply_succeeded",
    "unreachable_snapshot",
]


class OpKind(StrEnum):
    """The four mutating steps of the plugin contract."""

    SERVICE_OUT = "serviceOut"
    SERVICE_IN = "serviceIn"
    CONTROL_PLANE = "controlPlane"
    NODE_POOL = "nodePool"


class OpState(StrEnum):
    """Operation states of the plugin contract."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        """True for Succeeded and Failed."""
        return self in _TERMINAL


_TERMINAL = frozenset({OpState.SUCCEEDED, OpState.FAILED})


@dataclass(frozen=True, slots=True)
class OpObs:
    """One plugin operation as last seen."""

    id: str
    kind: OpKind
    cluster_id: str
    state: OpState
    request_id: str = ""
    node_pool: str = ""
    target_version: str = ""
    error_code: str = ""
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PoolObs:
    """One node pool as last seen."""

    name: str
    version: str
    ready: bool = True
    #: Seconds the provider itself waits within an upgrade of this pool (blue-green soaks):
    #: added to the node-pool step timeout.
    soak_seconds: int = 0


@dataclass(frozen=True, slots=True)
class WindowObs:
    """One maintenance window or exclusion the provider reports for a cluster (contract
    MaintenanceWindow): its first occurrence and, when it recurs, the RFC 5545 RRULE."""

    kind: str  # "window" | "exclusion"
    name: str
    start: datetime  # aware
    end: datetime  # aware
    recurrence: str = ""  # RRULE; "" for a one-off
    scope: str = ""  # what an exclusion excludes, e.g. GKE's "NO_MINOR_UPGRADES"


@dataclass(frozen=True, slots=True)
class ClusterObs:
    """One cluster as last seen through ListClusters."""

    id: str
    control_plane_version: str
    node_pools: tuple[PoolObs, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    available: bool = True
    unavailable_reason: str = ""
    in_service: bool = True
    current_operation: OpObs | None = None
    #: The provider's own maintenance windows and exclusions (information; see windows.gate).
    maintenance_windows: tuple[WindowObs, ...] = ()


@dataclass(frozen=True)
class Changes:
    """What a provider says differs between one of its snapshots and an earlier one (`since`,
    that snapshot's `token`): only these clusters and operations were added, changed or went
    away. engine.index looks at only these when it last saw exactly the snapshot `since`
    (else at every observation); a provider that cannot tell says nothing (None)."""

    since: object
    clusters: frozenset[str] = frozenset()
    #: Request ids.
    operations: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Snapshot:
    """Everything the planner reads about the fleet at one moment."""

    clusters: Mapping[str, ClusterObs]
    #: Latest known state of operations, by request id (from WatchOperations / GetOperation).
    operations: Mapping[str, OpObs] = field(default_factory=dict)
    #: Request ids whose operation the plugin answered NOT_FOUND for (it forgot them).
    forgotten: frozenset[str] = frozenset()
    #: Clusters whose provider cannot be asked now (a run over several providers, one of them
    #: unreachable), by id, with why: absent from `clusters`, so they count as down for every
    #: floor, and nothing is decided on them until their provider answers again; never taken
    #: for gone (orchestrator.pipeline.multi).
    unknown: Mapping[str, str] = field(default_factory=dict)
    #: This snapshot's identity (a later snapshot's `Changes.since` names it).
    token: object = field(default_factory=object, compare=False, repr=False)
    #: What differs from an earlier snapshot of the same provider (None: not said).
    changes: Changes | None = field(default=None, compare=False)


def unreachable_snapshot(cluster_ids: Iterable[str], why: str) -> Snapshot:
    """The snapshot of clusters whose provider cannot be asked now: every one unknown, with
    why (a run's one plugin down, or a member of several: orchestrator.pipeline.multi)."""
    return Snapshot({}, unknown=dict.fromkeys(cluster_ids, why))


#: ClusterObs's fields, in order (for `_with`).
_CLUSTER_FIELDS = tuple(f.name for f in fields(ClusterObs))


def _with(cluster: ClusterObs, **changes: object) -> ClusterObs:
    """The observation with these fields changed: `dataclasses.replace` without its generic
    walk and __init__ (ClusterObs is a frozen dataclass with slots and no __post_init__), as a
    pass makes one per operation that succeeded."""
    new = object.__new__(ClusterObs)
    put = object.__setattr__
    for name in _CLUSTER_FIELDS:
        put(new, name, changes[name] if name in changes else getattr(cluster, name))
    return new


def apply_succeeded(cluster: ClusterObs, op: OpObs) -> ClusterObs:
    """The cluster as it is once op has succeeded (the inventory may lag behind the op)."""
    if op.kind is OpKind.SERVICE_OUT:
        return _with(cluster, in_service=False)
    if op.kind is OpKind.SERVICE_IN:
        return _with(cluster, in_service=True)
    if op.kind is OpKind.CONTROL_PLANE:
        return _with(cluster, control_plane_version=op.target_version)
    pools = tuple(
        replace(p, version=op.target_version, ready=True) if p.name == op.node_pool else p
        for p in cluster.node_pools
    )
    return _with(cluster, node_pools=pools)
