"""KubeFleet and metric API names: resources, labels, object names, conditions and timestamps."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from plugins.sdk import Resource

__all__ = [
    "ANNOTATION_GATE",
    "ANNOTATION_HEALTH_CHECKS",
    "ANNOTATION_INTERVAL",
    "ANNOTATION_OPERATIONS",
    "ANNOTATION_VERSION",
    "APPROVAL_REQUESTS",
    "AUTOAPPROVE_GROUP",
    "CLUSTER_APPROVAL_REQUESTS",
    "CLUSTER_GROUP",
    "CLUSTER_RESOURCE_OVERRIDES",
    "CLUSTER_RESOURCE_PLACEMENTS",
    "CLUSTER_STAGED_UPDATE_RUNS",
    "CLUSTER_TRACKERS",
    "COOKBOOKS",
    "CURRENT",
    "EVENTS_NAMESPACE",
    "LABEL_CLUSTER",
    "LABEL_IS_LATEST",
    "LABEL_MANAGED_BY",
    "LABEL_METRIC_COLLECTOR",
    "LABEL_PARENT_APPROVAL",
    "LABEL_TARGET_STAGE",
    "LABEL_TARGET_UPDATE_RUN",
    "LABEL_TASK_TYPE",
    "MANAGED_BY",
    "MANAGED_SELECTOR",
    "MEMBER_CLUSTERS",
    "METRIC_COLLECTORS",
    "METRIC_COLLECTOR_REPORTS",
    "METRIC_GROUP",
    "METRIC_VERSION",
    "PLACEMENT_GROUP",
    "REPORT_SELECTOR",
    "SEED",
    "STAGED_TRACKERS",
    "STAGED_UPDATE_RUNS",
    "Cookbook",
    "condition",
    "format_time",
    "generation",
    "member_namespace",
    "name_with_limit",
    "parse_time",
    "set_condition",
]

PLACEMENT_GROUP = "placement.kubernetes-fleet.io"
AUTOAPPROVE_GROUP = "autoapprove.kubernetes-fleet.io"
CLUSTER_GROUP = "cluster.kubernetes-fleet.io"
METRIC_GROUP = "metric.kubernetes-fleet.io"
METRIC_VERSION = "v1alpha1"

CLUSTER_APPROVAL_REQUESTS = Resource(
    PLACEMENT_GROUP, "v1beta1", "clusterapprovalrequests", "ClusterApprovalRequest", False
)
APPROVAL_REQUESTS = Resource(
    PLACEMENT_GROUP, "v1beta1", "approvalrequests", "ApprovalRequest", True
)
CLUSTER_STAGED_UPDATE_RUNS = Resource(
    PLACEMENT_GROUP, "v1beta1", "clusterstagedupdateruns", "ClusterStagedUpdateRun", False
)
STAGED_UPDATE_RUNS = Resource(
    PLACEMENT_GROUP, "v1beta1", "stagedupdateruns", "StagedUpdateRun", True
)
CLUSTER_RESOURCE_PLACEMENTS = Resource(
    PLACEMENT_GROUP, "v1beta1", "clusterresourceplacements", "ClusterResourcePlacement", False
)
CLUSTER_RESOURCE_OVERRIDES = Resource(
    PLACEMENT_GROUP, "v1beta1", "clusterresourceoverrides", "ClusterResourceOverride", False
)
MEMBER_CLUSTERS = Resource(CLUSTER_GROUP, "v1beta1", "memberclusters", "MemberCluster", False)
METRIC_COLLECTORS = Resource(
    METRIC_GROUP, METRIC_VERSION, "metriccollectors", "MetricCollector", False
)
METRIC_COLLECTOR_REPORTS = Resource(
    METRIC_GROUP, METRIC_VERSION, "metriccollectorreports", "MetricCollectorReport", True
)
CLUSTER_TRACKERS = Resource(
    METRIC_GROUP,
    METRIC_VERSION,
    "clusterstagedworkloadtrackers",
    "ClusterStagedWorkloadTracker",
    False,
)
STAGED_TRACKERS = Resource(
    METRIC_GROUP, METRIC_VERSION, "stagedworkloadtrackers", "StagedWorkloadTracker", True
)

AUTOAPPROVE_TRACKERS = Resource(
    AUTOAPPROVE_GROUP,
    "v1alpha1",
    "clusterstagedworkloadtrackers",
    "ClusterStagedWorkloadTracker",
    False,
)
AUTOAPPROVE_STAGED_TRACKERS = Resource(
    AUTOAPPROVE_GROUP, "v1alpha1", "stagedworkloadtrackers", "StagedWorkloadTracker", True
)
AUTOAPPROVE_REPORTS = Resource(
    AUTOAPPROVE_GROUP, "v1alpha1", "metriccollectorreports", "MetricCollectorReport", True
)


@dataclass(frozen=True)
class Cookbook:
    """One generation of the KubeFleet cookbook's approval API (both are served by this plugin).

    current (kubefleet-cookbook main, approval-request-metric-collector): group
    autoapprove.kubernetes-fleet.io; the hub side creates MetricCollectorReport mc-<run>-<stage>
    (spec.prometheusUrl) in each stage cluster's fleet-member-<cluster>, and a member collector
    fills its status. seed (the tutorial, early commits of cookbook PR #6): group
    metric.kubernetes-fleet.io; a MetricCollector is placed on the stage's clusters and the member
    agent writes the MetricCollectorReport itself.
    """

    name: str
    group: str
    cluster_trackers: Resource
    staged_trackers: Resource
    reports: Resource
    collectors: Resource | None
    metric_fields: tuple[str, ...]
    """The status.collectedMetrics[] fields the generation's report schema keeps (the rest is
    pruned, so it is never written)."""


CURRENT = Cookbook(
    "current",
    AUTOAPPROVE_GROUP,
    AUTOAPPROVE_TRACKERS,
    AUTOAPPROVE_STAGED_TRACKERS,
    AUTOAPPROVE_REPORTS,
    None,
    # config/crd/bases/autoapprove.kubernetes-fleet.io_metriccollectorreports.yaml (bfde9ed)
    ("namespace", "workloadName", "workloadKind", "podName", "health"),
)
SEED = Cookbook(
    "seed",
    METRIC_GROUP,
    CLUSTER_TRACKERS,
    STAGED_TRACKERS,
    METRIC_COLLECTOR_REPORTS,
    METRIC_COLLECTORS,
    # the metric.kubernetes-fleet.io MetricCollectorReport CRD of cookbook PR #6 (cac604c)
    ("namespace", "workloadName", "health"),
)
COOKBOOKS = {c.name: c for c in (CURRENT, SEED)}
"""By the name used in --cookbook."""

# Labels KubeFleet puts on every approval request (apis/placement/v1beta1/commons.go).
LABEL_TARGET_UPDATE_RUN = "kubernetes-fleet.io/targetUpdateRun"
LABEL_TARGET_STAGE = "kubernetes-fleet.io/targetUpdatingStage"
LABEL_IS_LATEST = "kubernetes-fleet.io/isLatestUpdateRunApproval"
LABEL_TASK_TYPE = "kubernetes-fleet.io/taskType"

# Our own marks.
MANAGED_BY = "fleet-plugin-kubefleet"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
"""Selects the MetricCollectors, overrides and placements this plugin created."""
ANNOTATION_GATE = f"{METRIC_GROUP}/gate"
"""On our MetricCollector, override and placement: the gate id they serve."""
LABEL_METRIC_COLLECTOR = f"{METRIC_GROUP}/metric-collector"
"""On a MetricCollectorReport: the MetricCollector it reports for (set by the agent)."""
LABEL_CLUSTER = f"{METRIC_GROUP}/cluster"
"""On a MetricCollectorReport: the member cluster it comes from (set by the agent)."""
REPORT_SELECTOR = LABEL_METRIC_COLLECTOR
"""Selects every MetricCollectorReport the agent writes (the label exists)."""
LABEL_PARENT_APPROVAL = "kubernetes-fleet.io/parent-approval-request"
"""On a hub-created report (current cookbook): the approval request, <name> or <ns>.<name>."""
ANNOTATION_INTERVAL = "fleetupgrade.io/collect-interval"
"""On a MetricCollector / hub-created report: how often to collect (neither cookbook schema has
a field for it, and annotations are never pruned)."""
ANNOTATION_HEALTH_CHECKS = "fleetupgrade.io/health-checks"
"""On a workload tracker: optional extra checks (JSON or YAML, ClusterVersion healthChecks)."""
ANNOTATION_OPERATIONS = "fleetupgrade.io/operations"
"""On a MemberCluster: this plugin's recent service-out / service-in operations (JSON)."""
ANNOTATION_VERSION = "fleetupgrade.io/kubernetes-version"
"""On a MemberCluster: its Kubernetes version, for hubs without a version property."""

EVENTS_NAMESPACE = "default"
"""Where Events about cluster-scoped objects go (the kubectl convention)."""

_MAX_NAME = 63


def member_namespace(cluster: str) -> str:
    """The hub namespace KubeFleet reserves for a member cluster: fleet-member-<cluster>."""
    return f"fleet-member-{cluster}"


def name_with_limit(name: str, limit: int = _MAX_NAME) -> str:
    """name, or a prefix of it plus a short hash when it is longer than limit (stable)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-.')}-{digest}"


def generation(obj: Mapping[str, Any]) -> int:
    """metadata.generation (0 when absent)."""
    return int((obj.get("metadata") or {}).get("generation") or 0)


def condition(conditions: Sequence[Any] | None, kind: str) -> dict[str, Any] | None:
    """The condition of that type, or None."""
    for cond in conditions or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    kind: str,
    status: str,
    reason: str,
    message: str,
    observed_generation: int,
    now: datetime,
) -> list[dict[str, Any]]:
    """apimachinery SetStatusCondition: replace or append; lastTransitionTime moves on a flip.

    An empty message is written as the reason (some apiservers turn "" in a merge-patched list
    into null, which the metav1.Condition schema rejects).
    """
    message = message or reason
    out: list[dict[str, Any]] = []
    found = False
    for cond in conditions or []:
        current = dict(cond)
        if current.get("type") == kind:
            found = True
            flipped = current.get("status") != status
            current.update(
                status=status,
                reason=reason,
                message=message,
                observedGeneration=observed_generation,
            )
            if flipped or not current.get("lastTransitionTime"):
                current["lastTransitionTime"] = format_time(now)
        out.append(current)
    if not found:
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "observedGeneration": observed_generation,
                "lastTransitionTime": format_time(now),
            }
        )
    return out


def format_time(when: datetime) -> str:
    """RFC 3339 in UTC with seconds (metav1.Time)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: object) -> datetime | None:
    """A metav1.Time / MicroTime string as an aware datetime; None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None
