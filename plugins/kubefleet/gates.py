"""Approval requests as gates: ids, states, stage clusters and tracked workloads (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from google.protobuf import struct_pb2

from fleetupgrade.plugin.v1 import gate_pb2, health_pb2
from plugins.kubefleet.objects import (
    APPROVAL_REQUESTS,
    CLUSTER_APPROVAL_REQUESTS,
    CLUSTER_STAGED_UPDATE_RUNS,
    CLUSTER_TRACKERS,
    LABEL_IS_LATEST,
    STAGED_TRACKERS,
    STAGED_UPDATE_RUNS,
    condition,
    generation,
    parse_time,
)
from plugins.sdk.kube import Resource

__all__ = [
    "ACCEPTED",
    "APPROVED",
    "APPROVED_REASON",
    "REJECTED_REASON",
    "GateRef",
    "approval_state",
    "create_time",
    "extra_checks",
    "gate_id",
    "is_latest",
    "parse_gate_id",
    "ref_of",
    "stage_clusters",
    "tracked_workloads",
]

APPROVED = "Approved"
"""The approval request condition an approver sets (observedGeneration = generation)."""
ACCEPTED = "ApprovalAccepted"
"""The condition KubeFleet sets once it acted on the approval (it cannot be undone then)."""
APPROVED_REASON = "ApprovedByFleetOrchestrator"
REJECTED_REASON = "RejectedByFleetOrchestrator"


@dataclass(frozen=True)
class GateRef:
    """Where a gate lives: its approval request, its update run and its tracker."""

    request: Resource
    namespace: str
    name: str
    run_name: str
    stage: str

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

    @property
    def tracker_resource(self) -> Resource:
        """ClusterStagedWorkloadTracker or StagedWorkloadTracker (named like the run)."""
        return STAGED_TRACKERS if self.request.namespaced else CLUSTER_TRACKERS


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
    return GateRef(resource, str(meta.get("namespace") or ""), str(meta.get("name")), run, stage)


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
    """The tracker's workloads[] (name, namespace, kind, healthyReplicas) as contract Workloads."""
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
    """The tracker's optional healthChecks block as a Struct (validated by the orchestrator)."""
    block = tracker.get("healthChecks")
    if not isinstance(block, Mapping) or not block:
        return None
    out = struct_pb2.Struct()
    out.update(dict(block))
    return out


def create_time(obj: Mapping[str, Any]) -> datetime | None:
    """metadata.creationTimestamp as an aware datetime (None when absent)."""
    return parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
