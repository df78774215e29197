"""Deletion is an operation: what holds a rollout object's finalizer, decided from its records.

Pure (no I/O), the shape of Cluster API's `reconcileDelete`: the UpdateRun and ClusterVersion
controllers ask these functions whether an object being deleted may go, and act on the answer
(orchestrator.controllers.updaterun removes `api.FINALIZER` from a run and its ClusterUpgrades,
orchestrator.controllers.clusterversion from a ClusterVersion). A run being deleted is driven
exactly as a run with `spec.state: Stop` (`stopping`): it admits nothing new and brings every
cluster in flight back into service; its finalizers go once `holds(...).waiting` is empty.

docs/operations.md "What deleting a rollout does" is the reference for people.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import api
from orchestrator.engine.decide import ACTIVE, brought_back

__all__ = [
    "ORPHAN",
    "Holds",
    "deleting",
    "has_finalizer",
    "holds",
    "orphaning",
    "owned_by",
    "released",
    "stopping",
]

U = api.UpgradePhase
#: The garbage collector's finalizer for `kubectl delete --cascade=orphan`: the children stay.
ORPHAN = "orphan"


@dataclass(frozen=True)
class Holds:
    """What a run's clusters say about its deletion."""

    #: Cluster ids the run still brings back into service: its finalizers stay.
    waiting: tuple[str, ...]
    #: Cluster ids recorded Failed (or Skipped, Blocked) that their attempt may have left out
    #: of service and that nothing of this run will bring back (failedClusterPolicy KeepOut, a
    #: recovery that gave up, a cluster gone): the run may go, and says so (Event, log).
    kept_out: tuple[str, ...]


def deleting(obj: Mapping[str, Any]) -> bool:
    """Whether the object is being deleted (metadata.deletionTimestamp set)."""
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def has_finalizer(obj: Mapping[str, Any]) -> bool:
    """Whether the object carries `api.FINALIZER`."""
    return api.FINALIZER in ((obj.get("metadata") or {}).get("finalizers") or ())


def released(obj: Mapping[str, Any]) -> bool:
    """Whether an object being deleted has no finalizer left (the apiserver removes it now):
    a cache must drop it, not record it (the watch's DELETED event may come first)."""
    meta = obj.get("metadata") or {}
    return deleting(obj) and not meta.get("finalizers")


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether one of the object's ownerReferences is the object with that uid."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(ref.get("uid") == uid for ref in refs)


def orphaning(obj: Mapping[str, Any]) -> bool:
    """Whether the object is deleted with --cascade=orphan (its children are to stay)."""
    return ORPHAN in ((obj.get("metadata") or {}).get("finalizers") or ())


def stopping(spec: api.UpdateRunSpec) -> api.UpdateRunSpec:
    """The spec a run being deleted is driven with: `spec.state: Stop` (engine.decide's stop
    path, unchanged: admit nothing, carry clusters in flight back into service)."""
    if spec.state == api.RunState.STOP:
        return spec
    return spec.model_copy(update={"state": api.RunState.STOP})


def holds(
    clusters: Iterable[tuple[str, api.ClusterUpgradeStatus]], policy: api.FailedClusterPolicy
) -> Holds:
    """What of a run's clusters (cluster id, ClusterUpgrade status) holds its deletion, under
    the run's failedClusterPolicy.

    Waiting: every cluster in flight (engine.ACTIVE: out of service or about to be), and every
    Failed cluster that failedClusterPolicy ServiceInIfHealthy is servicing back in or will
    once it can (engine.decide.brought_back; the run counts these as not finished either).
    Kept out: any other ended attempt that still keeps its `step` (the engine clears it once
    the cluster is seen back in service): failedClusterPolicy KeepOut, a recovery that gave up,
    a cluster gone from the inventory.
    """
    waiting: list[str] = []
    kept_out: list[str] = []
    for cid, st in clusters:
        if st.phase in ACTIVE or brought_back(st, policy):
            waiting.append(cid)
        elif st.phase in (U.FAILED, U.SKIPPED, U.BLOCKED) and st.step:
            kept_out.append(cid)
    return Holds(tuple(sorted(waiting)), tuple(sorted(kept_out)))
