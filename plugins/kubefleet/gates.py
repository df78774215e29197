"""Approval requests as gates: ids, states, task types, stage readiness, tracked workloads (pure).

Before-stage and after-stage approvals (label kubernetes-fleet.io/taskType, names
<run>-before-<stage> / <run>-after-<stage>, apis/placement/v1beta1/commons.go) gate different
things; `readiness` says which clusters decide each one and what must hold first:

- afterStage: every cluster of the stage has been updated (its Succeeded condition is True in
  the run's status); the stage's own clusters then decide, on health data collected after
  their update.
- beforeStage: a go/no-go before the stage's clusters are touched: the run is not stopped or
  failed, no cluster of the run failed its update, every earlier stage has succeeded; the
  clusters the run has already updated (all earlier stages) decide. For the first stage nothing
  is updated yet: its own clusters decide as a baseline (the current version healthy there),
  which the gate says in its message; it never stands for a verified update.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml
from google.protobuf import struct_pb2

from fleetupgrade.plugin.v1 import gate_pb2, health_pb2
from plugins.kubefleet.objects import (
    ANNOTATION_HEALTH_CHECKS,
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CLUSTER_STAGED_UPDATE_RUNS,
    LABEL_IS_LATEST,
    LABEL_TASK_TYPE,
    STAGED_UPDATE_RUNS,
    Cookbook,
    condition,
    generation,
    parse_time,
)
from plugins.sdk import Resource

__all__ = [
    "ACCEPTED",
    "AFTER_STAGE",
    "APPROVED",
    "APPROVED_REASON",
    "BEFORE_STAGE",
    "REJECTED_REASON",
    "GateRef",
    "GateView",
    "Readiness",
    "approval_state",
    "create_time",
    "extra_checks",
    "gate_id",
    "is_latest",
    "parse_gate_id",
    "readiness",
    "ref_of",
    "stage_clusters",
    "stage_updated_times",
    "task_type",
    "tracked_workloads",
]

APPROVED = "Approved"
"""The approval request condition an approver sets (observedGeneration = generation)."""
ACCEPTED = "ApprovalAccepted"
"""The condition KubeFleet sets once it acted on the approval (it cannot be undone then)."""
APPROVED_REASON = "ApprovedByFleetOrchestrator"
BEFORE_STAGE = "beforeStage"
AFTER_STAGE = "afterStage"
REJECTED_REASON = "RejectedByFleetOrchestrator"


@dataclass(frozen=True)
class GateRef:
    """Where a gate lives: its approval request, its update run and its tracker."""

    request: Resource
    namespace: str
    name: str
    run_name: str
    stage: str
    task: str = AFTER_STAGE

    @property
    def id(self) -> str:
        """The gate id: ClusterApprovalRequest/<name> or ApprovalRequest/<namespace>/<name>."""
        return gate_id(self.request, self.namespace, self.name)

    @property
    def run(self) -> str:
        """The update run as the contract names it: <name>, or <namespace>/<name>."""
        return f"{self.namespace}/{self.run_name}" if self.namespace else self.run_name

    @property
    def run_resource(self) -> Resource:
        """ClusterStagedUpdateRun or StagedUpdateRun."""
        return STAGED_UPDATE_RUNS if self.request.namespaced else CLUSTER_STAGED_UPDATE_RUNS

    def tracker_resource(self, cookbook: Cookbook) -> Resource:
        """ClusterStagedWorkloadTracker or StagedWorkloadTracker (named like the run)."""
        return cookbook.staged_trackers if self.request.namespaced else cookbook.cluster_trackers


def gate_id(resource: Resource, namespace: str, name: str) -> str:
    """ClusterApprovalRequest/<name> or ApprovalRequest/<namespace>/<name>."""
    if resource.namespaced:
        return f"{resource.kind}/{namespace}/{name}"
    return f"{resource.kind}/{name}"


def parse_gate_id(text: str) -> tuple[Resource, str, str] | None:
    """(resource, namespace, name) of a gate id this plugin made; None otherwise."""
    parts = text.split("/")
    if len(parts) == 2 and parts[0] == CLUSTER_APPROVAL_REQUESTS.kind and parts[1]:
        return CLUSTER_APPROVAL_REQUESTS, "", parts[1]
    if len(parts) == 3 and parts[0] == APPROVAL_REQUESTS.kind and parts[1] and parts[2]:
        return APPROVAL_REQUESTS, parts[1], parts[2]
    return None


def ref_of(resource: Resource, obj: Mapping[str, Any]) -> GateRef | None:
    """The GateRef of an approval request; None when its spec lacks the run or the stage."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    run, stage = str(spec.get("parentStageRollout") or ""), str(spec.get("targetStage") or "")
    if not run or not stage:
        return None
    name = str(meta.get("name"))
    return GateRef(
        resource, str(meta.get("namespace") or ""), name, run, stage, task_type(obj, run, stage)
    )


def task_type(obj: Mapping[str, Any], run: str, stage: str) -> str:
    """beforeStage or afterStage: the kubernetes-fleet.io/taskType label KubeFleet sets, else
    the name (<run>-before-<stage>); a request without either is an after-stage one."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    label = str(labels.get(LABEL_TASK_TYPE) or "")
    if label in (BEFORE_STAGE, AFTER_STAGE):
        return label
    name = str((obj.get("metadata") or {}).get("name") or "")
    return BEFORE_STAGE if name == f"{run}-before-{stage}" else AFTER_STAGE


def is_latest(obj: Mapping[str, Any]) -> bool:
    """False when KubeFleet marked the request as superseded (isLatestUpdateRunApproval=false)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_IS_LATEST, "true")).lower() != "false"


def approval_state(obj: Mapping[str, Any]) -> int:
    """APPROVED when Approved=True for the current generation (what KubeFleet checks);
    REJECTED when we set Approved=False ourselves; else PENDING."""
    cond = condition((obj.get("status") or {}).get("conditions"), APPROVED)
    if cond is not None:
        current = int(cond.get("observedGeneration") or 0) == generation(obj)
        if cond.get("status") == "True" and current:
            return gate_pb2.GATE_STATE_APPROVED
        if cond.get("status") == "False" and cond.get("reason") == REJECTED_REASON:
            return gate_pb2.GATE_STATE_REJECTED
    accepted = condition((obj.get("status") or {}).get("conditions"), ACCEPTED)
    if accepted is not None and accepted.get("status") == "True":
        return gate_pb2.GATE_STATE_APPROVED  # KubeFleet acted on an approval: it is final
    return gate_pb2.GATE_STATE_PENDING


def stage_clusters(run: Mapping[str, Any], stage: str) -> list[str] | None:
    """The stage's clusters from the run's status.stagesStatus; None when the stage is absent."""
    for item in (run.get("status") or {}).get("stagesStatus") or []:
        if isinstance(item, Mapping) and item.get("stageName") == stage:
            return [
                str(c.get("clusterName"))
                for c in item.get("clusters") or []
                if isinstance(c, Mapping) and c.get("clusterName")
            ]
    return None


def tracked_workloads(tracker: Mapping[str, Any]) -> list[health_pb2.Workload]:
    """The tracker's workloads[] (name, namespace, kind, healthyReplicas) as contract Workloads.

    healthyReplicas is carried as is: 0 means any pod present is enough (the current cookbook's
    rule). A seed-generation tracker has neither kind nor healthyReplicas: any kind, 0.
    """
    out = []
    for item in tracker.get("workloads") or []:
        if not isinstance(item, Mapping) or not item.get("name") or not item.get("namespace"):
            continue
        out.append(
            health_pb2.Workload(
                namespace=str(item["namespace"]),
                name=str(item["name"]),
                kind=str(item.get("kind") or ""),
                min_healthy_replicas=max(0, int(item.get("healthyReplicas") or 0)),
            )
        )
    return out


def extra_checks(tracker: Mapping[str, Any]) -> struct_pb2.Struct | None:
    """The tracker's optional extra checks as a Struct (validated by the orchestrator).

    From the annotation fleetupgrade.io/health-checks (JSON or YAML): the cookbook's tracker
    schemas have no field for them and would prune one. A top-level healthChecks block (kept
    only by a schema that has it) is read too; the annotation wins.
    """
    meta = tracker.get("metadata") or {}
    text = (meta.get("annotations") or {}).get(ANNOTATION_HEALTH_CHECKS)
    block: Any = tracker.get("healthChecks")
    if isinstance(text, str) and text.strip():
        try:
            block = json.loads(text)
        except ValueError:
            try:
                block = yaml.safe_load(text)
            except yaml.YAMLError:
                block = {"invalid": f"annotation {ANNOTATION_HEALTH_CHECKS} is not JSON or YAML"}
    if not isinstance(block, Mapping) or not block:
        return None
    out = struct_pb2.Struct()
    out.update(dict(block))
    return out


@dataclass(frozen=True)
class Readiness:
    """What decides a gate now: its clusters, or why it cannot be decided yet."""

    clusters: list[str] = field(default_factory=list)
    blocked_reason: str = ""
    blocked_message: str = ""
    baseline: bool = False
    """A first stage's before-stage gate: the clusters are checked on the current version."""
    stage_clusters: list[str] = field(default_factory=list)
    """The stage's own clusters (the ones its update touches)."""


def _stages(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        s for s in (run.get("status") or {}).get("stagesStatus") or [] if isinstance(s, Mapping)
    ]


def _cluster_entries(stage: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c for c in stage.get("clusters") or [] if isinstance(c, Mapping) and c.get("clusterName")
    ]


def _status_of(conds: Sequence[Any] | None, kind: str) -> str:
    cond = condition(conds, kind)
    return str(cond.get("status")) if cond else ""


def readiness(run: Mapping[str, Any], ref: GateRef) -> Readiness:
    """Which clusters decide the gate, or why it cannot be decided yet (see the module doc).

    Mirrors the update-run controller's view of progress (pkg/controllers/updaterun: a cluster
    is updated when its Succeeded condition is True, failed when False; a stage is done when
    its Succeeded condition is True).
    """
    stages = _stages(run)
    index = next((i for i, s in enumerate(stages) if s.get("stageName") == ref.stage), None)
    if index is None:
        return Readiness(
            blocked_reason="StageNotFound",
            blocked_message=f"stage {ref.stage} is not in the status of update run {ref.run} (yet)",
        )
    stage = stages[index]
    own = [str(c["clusterName"]) for c in _cluster_entries(stage)]
    failed = [
        str(c["clusterName"])
        for s in stages
        for c in _cluster_entries(s)
        if _status_of(c.get("conditions"), "Succeeded") == "False"
    ]
    if failed:
        return Readiness(
            own,
            "ClusterUpdateFailed",
            f"the update of {', '.join(failed[:5])} failed in update run {ref.run}: "
            "nothing is approved automatically until a person decides",
        )
    if ref.task == AFTER_STAGE:
        waiting = [
            str(c["clusterName"])
            for c in _cluster_entries(stage)
            if _status_of(c.get("conditions"), "Succeeded") != "True"
        ]
        if waiting:
            return Readiness(
                own,
                "ClustersNotUpdated",
                f"stage {ref.stage}: {', '.join(waiting[:5])} not updated yet; the after-stage "
                "gate checks the stage's clusters once they run the new version",
            )
        return Readiness(own)
    spec = run.get("spec") or {}
    run_conds = (run.get("status") or {}).get("conditions")
    if spec.get("state") == "Stop":
        return Readiness(own, "RunStopped", f"update run {ref.run} is stopped (spec.state Stop)")
    if _status_of(run_conds, "Succeeded") == "False":
        return Readiness(own, "RunFailed", f"update run {ref.run} failed")
    pending = [
        str(s.get("stageName"))
        for s in stages[:index]
        if _status_of(s.get("conditions"), "Succeeded") != "True"
    ]
    if pending:
        return Readiness(
            own,
            "EarlierStageNotDone",
            f"stage(s) {', '.join(pending)} before {ref.stage} have not succeeded yet",
        )
    updated = [str(c["clusterName"]) for s in stages[:index] for c in _cluster_entries(s)]
    if updated:
        return Readiness(updated, stage_clusters=own)
    return Readiness(own, baseline=True, stage_clusters=own)


def stage_updated_times(runs: Sequence[Mapping[str, Any]]) -> dict[str, datetime]:
    """cluster → when a run last finished updating it (its Succeeded=True transition time).

    Health data collected before that moment describes the old version: it is not used.
    """
    out: dict[str, datetime] = {}
    for run in runs:
        for stage in _stages(run):
            for entry in _cluster_entries(stage):
                cond = condition(entry.get("conditions"), "Succeeded")
                if cond is None or cond.get("status") != "True":
                    continue
                when = parse_time(cond.get("lastTransitionTime"))
                name = str(entry["clusterName"])
                if when is not None and (name not in out or when > out[name]):
                    out[name] = when
    return out


def create_time(obj: Mapping[str, Any]) -> datetime | None:
    """metadata.creationTimestamp as an aware datetime (None when absent)."""
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


@dataclass
class GateView:
    """One approval request as a gate, with what this plugin has to say about it."""

    ref: GateRef
    obj: dict[str, Any]
    state: int
    tracked: bool = False
    clusters: list[str] = field(default_factory=list)
    workloads: list[health_pb2.Workload] = field(default_factory=list)
    extra: Any = None
    status: str = "Unknown"
    reason: str = ""
    message: str = ""
    collect_on: list[str] = field(default_factory=list)
    """The clusters whose health data the gate needs (also while it is blocked)."""
    blocked: str = ""
    """Why the gate cannot be decided yet (its preconditions); "" when it can."""

    def gate(self) -> gate_pb2.Gate:
        """The contract's Gate of this view."""
        out = gate_pb2.Gate(
            id=self.ref.id,
            run=self.ref.run,
            stage=self.ref.stage,
            cluster_ids=self.clusters,
            workloads=self.workloads,
            state=self.state,  # type: ignore[arg-type]
            message=self.message,
            tracked=self.tracked,
        )
        if self.extra is not None:
            out.extra_health_checks.CopyFrom(self.extra)
        created = create_time(self.obj)
        if created is not None:
            out.create_time.FromDatetime(created)
        return out
