"""The write verbs approve, retry, skip, stop and resume: each one conditional write of the
annotations or spec fields the controllers act on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator import api
from orchestrator.adapters.kube import Conflict, KubeClient, NotFound
from orchestrator.operate.read import (
    CV,
    IN_FLIGHT,
    RUN,
    OperateError,
    Target,
    comma_list,
    current_run,
    list_upgrades,
    resolve,
)

__all__ = ["Request", "approve", "retry", "set_state", "skip"]


def _annotate(
    kube: KubeClient,
    target: Target,
    merge: Mapping[str, Iterable[str]],
    put: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """One write: add values to comma-separated annotations (keeping what is there) and set
    others; the merged values.

    The write carries the resourceVersion it was computed from, so a controller consuming an
    annotation at the same moment makes it re-read (409) instead of seeing ids come back.
    """
    obj = target.obj
    for _ in range(5):
        current = (obj.get("metadata") or {}).get("annotations") or {}
        patch: dict[str, str | None] = dict(put or {})
        merged: dict[str, str] = {}
        for key, values in merge.items():
            items = comma_list(current.get(key))
            items += [v for v in values if v not in items]
            merged[key] = patch[key] = ",".join(items)
        meta = {"annotations": patch, "resourceVersion": obj["metadata"]["resourceVersion"]}
        try:
            kube.merge_patch(target.plural, target.namespace, target.name, {"metadata": meta})
        except Conflict:
            obj = kube.get_object(target.plural, target.namespace, target.name)
            continue
        return merged
    raise OperateError(
        f"{target.kind} {target.name!r} kept changing while being annotated (5 conflicts): "
        "try again"
    )


def _stage_names(kube: KubeClient, target: Target) -> list[str]:
    strategy = ((target.obj.get("spec") or {}).get("strategy")) or {}
    names = [str(s["name"]) for s in strategy.get("stages") or []]
    if not names:
        run = current_run(kube, target)
        names = [str(s["name"]) for s in ((run or {}).get("status") or {}).get("stages") or []]
    return names


def _check_stages(kube: KubeClient, target: Target, stages: Iterable[str]) -> None:
    known = _stage_names(kube, target)
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise OperateError(
            f"{target.kind} {target.name!r} has no stage {', '.join(map(repr, unknown))}: "
            f"its stages are {', '.join(known) or '(none: spec.strategy.stages is empty)'}"
        )


def _line(target: Target, values: Mapping[str, str]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return f"{target.kind} {target.namespace}/{target.name}: {shown}"


def _writable(kube: KubeClient, namespace: str, name: str) -> tuple[Target, list[str]]:
    """Where a person's annotations go: the object named, except the current run of a
    ClusterVersion, whose annotations the ClusterVersion keeps in step with its own (a value
    written on the run alone would be undone): then the ClusterVersion, with a note."""
    target = resolve(kube, namespace, name)
    if target.kind != RUN:
        return target, []
    owner = str(((target.obj.get("spec") or {}).get("clusterVersionRef") or {}).get("name") or "")
    if not owner:
        return target, []
    try:
        cv = kube.get_object(api.PLURAL, namespace, owner)
    except NotFound:
        return target, []
    if (cv.get("status") or {}).get("currentRun") != name:
        return target, []
    note = (
        f"note: UpdateRun {name} is the current run of ClusterVersion {owner}: written on "
        f"ClusterVersion {owner}, which hands it to the run"
    )
    return Target(CV, api.PLURAL, namespace, owner, cv), [note]


def approve(kube: KubeClient, namespace: str, name: str, stage: str) -> tuple[str, list[str]]:
    """Add STAGE to the approve-stages annotation; a line saying what was done, and notes."""
    target, notes = _writable(kube, namespace, name)
    _check_stages(kube, target, [stage])
    done = _annotate(kube, target, {api.ANNOTATION_APPROVE_STAGES: [stage]})
    return _line(target, done), notes


def _cluster_phases(kube: KubeClient, target: Target) -> dict[str, str]:
    """Cluster id -> phase, from the current run's ClusterUpgrades, else from spec.clusters."""
    run = current_run(kube, target)
    phases: dict[str, str] = {}
    if run is not None:
        for cu in list_upgrades(kube, target.namespace, run["metadata"]["name"]):
            cid = str((cu.get("spec") or {}).get("clusterId", ""))
            phases[cid] = str((cu.get("status") or {}).get("phase") or "Pending")
    if not phases:
        for c in (target.obj.get("spec") or {}).get("clusters") or []:
            phases[str(c["id"])] = "Pending"
    return phases


def _check_clusters(kube: KubeClient, target: Target, clusters: list[str]) -> dict[str, str]:
    """The phases of the target's clusters; OperateError naming any unknown one."""
    phases = _cluster_phases(kube, target)
    unknown = [c for c in clusters if c not in phases]
    if unknown:
        known = sorted(phases)
        shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
        raise OperateError(
            f"{target.kind} {target.name!r} has no cluster {', '.join(map(repr, unknown))}: "
            f"its clusters are {shown or '(none yet: wait for the run to start)'}; "
            f"`fleet-orchestrator status {target.name}` shows them"
        )
    return phases


@dataclass(frozen=True)
class Request:
    """Who asks for a skip or a retry, and why (recorded by the controller with it)."""

    requested_by: str
    reason: str | None = None

    def annotations(self) -> dict[str, str | None]:
        """The reason and requested-by annotations (a missing reason clears an old one)."""
        return {
            api.ANNOTATION_REASON: self.reason or None,
            api.ANNOTATION_REQUESTED_BY: self.requested_by,
        }


def retry(
    kube: KubeClient, namespace: str, name: str, clusters: list[str], request: Request
) -> tuple[str, list[str]]:
    """Add clusters to retry-clusters (with who and why); a line saying what was done, notes."""
    target, notes = _writable(kube, namespace, name)
    phases = _check_clusters(kube, target, clusters)
    retryable = {api.UpgradePhase.FAILED.value, api.UpgradePhase.BLOCKED.value}
    retryable.add(api.UpgradePhase.SKIPPED.value)
    notes += [
        f"note: {c} is {phases[c]}, not Failed, Blocked or Skipped: retry does nothing to it"
        for c in clusters
        if phases[c] not in retryable
    ]
    done = _annotate(kube, target, {api.ANNOTATION_RETRY_CLUSTERS: clusters}, request.annotations())
    return _line(target, done), notes


def skip(
    kube: KubeClient,
    namespace: str,
    name: str,
    clusters: list[str],
    request: Request,
    stages: list[str] | None = None,
) -> tuple[str, list[str]]:
    """Add clusters to skip-clusters and stages to skip-stages (with who and why), in one
    write; a line saying what was done, and notes."""
    if not clusters and not stages:
        raise OperateError("name the clusters to skip, or a stage with --stage STAGE")
    target, notes = _writable(kube, namespace, name)
    merge: dict[str, list[str]] = {}
    if clusters:
        phases = _check_clusters(kube, target, clusters)
        done = {api.UpgradePhase.UPGRADED.value, api.UpgradePhase.SKIPPED.value}
        notes += [
            f"note: {c} is {phases[c]} already: skip does nothing to it"
            for c in clusters
            if phases[c] in done
        ]
        notes += [
            f"note: {c} is {phases[c]} (in flight): skip applies to Pending, Blocked and "
            "Failed clusters; this one finishes its upgrade"
            for c in clusters
            if phases[c] in IN_FLIGHT
        ]
        merge[api.ANNOTATION_SKIP_CLUSTERS] = clusters
    if stages:
        _check_stages(kube, target, stages)
        run = current_run(kube, target)
        finished = {api.StagePhase.COMPLETED.value, api.StagePhase.SKIPPED.value}
        for s in ((run or {}).get("status") or {}).get("stages") or []:
            if s.get("name") in stages and s.get("phase") in finished:
                notes.append(f"note: stage {s['name']} is {s['phase']}: skip changes nothing")
        merge[api.ANNOTATION_SKIP_STAGES] = stages
    return _line(target, _annotate(kube, target, merge, request.annotations())), notes


def set_state(kube: KubeClient, namespace: str, name: str, state: api.RunState) -> str:
    """Set spec.state of the UpdateRun (a ClusterVersion's current run); what was done."""
    target = resolve(kube, namespace, name)
    run = current_run(kube, target)
    if run is None:
        raise OperateError(
            f"ClusterVersion {name!r} has no current run (status.currentRun is empty): "
            "there is nothing to stop or resume; to hold a rollout before it starts, set "
            "spec.strategy.paused: true"
        )
    run_name = run["metadata"]["name"]
    kube.merge_patch(api.UPDATE_RUN_PLURAL, namespace, run_name, {"spec": {"state": state.value}})
    return f"UpdateRun {namespace}/{run_name}: spec.state={state.value}"
