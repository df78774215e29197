"""What a pending tracked gate needs on the hub for health data to flow, per cookbook generation
(pure builders), and the sharing of ClusterResourceOverrides under KubeFleet's per-hub limit.

current generation: one MetricCollectorReport per stage cluster, created by the hub side in
fleet-member-<cluster> with spec.prometheusUrl (what the cookbook's approval-request-controller
does, pkg/controllers/approvalrequest ensureMetricCollectorReports); a member collector (the
cookbook's, or ours) fills its status.

seed generation: a MetricCollector per gate, placed on exactly the stage's clusters by PickFixed
ClusterResourcePlacements (at most 100 names each, the CRD's maxItems), and a
ClusterResourceOverride that sets spec.reportNamespace to fleet-member-${MEMBER-CLUSTER-NAME}.
KubeFleet admits at most 100 ClusterResourceOverrides per hub, 20 resource selectors per
override (the CRD's maxItems), and each resource in at most one override (its validating
webhook, pkg/utils/validator/clusterresourceoverride.go). So overrides are shared: each one
serves up to 20 gates' collectors, a collector keeps its slot while its gate is pending (no
resource is ever selected by two overrides, not even for a moment), and this plugin uses at most
`max_overrides` of the hub's 100.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from plugins.kubefleet import gates as gatelib
from plugins.kubefleet.objects import (
    ANNOTATION_GATE,
    ANNOTATION_INTERVAL,
    CLUSTER_RESOURCE_OVERRIDES,
    CLUSTER_RESOURCE_PLACEMENTS,
    LABEL_MANAGED_BY,
    LABEL_PARENT_APPROVAL,
    MANAGED_BY,
    METRIC_COLLECTORS,
    METRIC_GROUP,
    METRIC_VERSION,
    Cookbook,
    member_namespace,
    name_with_limit,
)
from plugins.sdk import Resource

__all__ = [
    "OVERRIDE_PREFIX",
    "PICK_FIXED_MAX",
    "REPORT_NAMESPACE_TEMPLATE",
    "SELECTORS_PER_OVERRIDE",
    "UNSET_REPORT_NAMESPACE",
    "collector_names",
    "override_body",
    "plan_overrides",
    "report_bodies",
    "seed_bodies",
]

PICK_FIXED_MAX = 100
"""A placement's clusterNames maxItems: bigger stages get several placements."""
SELECTORS_PER_OVERRIDE = 20
"""A ClusterResourceOverride's clusterResourceSelectors maxItems."""
OVERRIDE_PREFIX = "ro-fleet-metric-collectors-"
REPORT_NAMESPACE_TEMPLATE = "fleet-member-${MEMBER-CLUSTER-NAME}"
"""The override value: KubeFleet replaces ${MEMBER-CLUSTER-NAME} with each member's name."""
UNSET_REPORT_NAMESPACE = "set-by-override"
"""reportNamespace of the hub copy (required by the schema); the agent refuses it."""

Body = dict[str, Any]


def collector_names(ref: gatelib.GateRef) -> tuple[str, str]:
    """(MetricCollector / report name, first ClusterResourcePlacement name) of a gate.

    As in the cookbook: mc-<run>-<stage> and crp-mc-... (namespaced runs add their namespace,
    so two namespaces' runs of one name never share a report); at most 63 characters, longer
    names end in a stable hash. Stages of more than 100 clusters get placements -2, -3, ...
    """
    base = "-".join(p for p in ("mc", ref.namespace, ref.run_name, ref.stage) if p)
    mc = name_with_limit(base, 54)  # room for crp- and a shard suffix -NN
    return mc, f"crp-{mc}"


def _meta(ref: gatelib.GateRef, request: Mapping[str, Any], name: str) -> Body:
    out: Body = {
        "name": name,
        "labels": {LABEL_MANAGED_BY: MANAGED_BY},
        "annotations": {ANNOTATION_GATE: ref.id},
    }
    if not ref.request.namespaced:
        # A cluster-scoped owner is valid for cluster-scoped and namespaced dependents; a
        # namespaced ApprovalRequest cannot own them: this plugin removes those itself.
        meta = request.get("metadata") or {}
        out["ownerReferences"] = [
            {
                "apiVersion": ref.request.api_version,
                "kind": ref.request.kind,
                "name": meta.get("name"),
                "uid": meta.get("uid"),
            }
        ]
    return out


def report_bodies(
    ref: gatelib.GateRef,
    request: Mapping[str, Any],
    clusters: Sequence[str],
    cookbook: Cookbook,
    prometheus_url: str,
    interval: str,
) -> list[tuple[Resource, str, Body]]:
    """current generation: (resource, namespace, body) of the gate's MetricCollectorReports."""
    name, _ = collector_names(ref)
    parent = f"{ref.namespace}.{ref.name}" if ref.namespace else ref.name
    out = []
    for cluster in sorted(set(clusters)):
        namespace = member_namespace(cluster)
        meta = _meta(ref, request, name)
        meta["namespace"] = namespace
        meta["labels"][LABEL_PARENT_APPROVAL] = name_with_limit(parent)
        meta["annotations"][ANNOTATION_INTERVAL] = interval
        body = {
            "apiVersion": cookbook.reports.api_version,
            "kind": cookbook.reports.kind,
            "metadata": meta,
            "spec": {"prometheusUrl": prometheus_url},
        }
        out.append((cookbook.reports, namespace, body))
    return out


def _collector_selector(name: str) -> Body:
    return {
        "group": METRIC_GROUP,
        "version": METRIC_VERSION,
        "kind": METRIC_COLLECTORS.kind,
        "name": name,
    }


def seed_bodies(
    ref: gatelib.GateRef,
    request: Mapping[str, Any],
    clusters: Sequence[str],
    prometheus_url: str,
    interval: str,
) -> tuple[Body, list[Body]]:
    """seed generation: the gate's MetricCollector and its PickFixed placements (one per 100
    clusters, disjoint), in the order they are created (the override comes in between)."""
    mc, crp = collector_names(ref)
    collector_meta = _meta(ref, request, mc)
    collector_meta["annotations"][ANNOTATION_INTERVAL] = interval
    collector = {
        "apiVersion": METRIC_COLLECTORS.api_version,
        "kind": METRIC_COLLECTORS.kind,
        "metadata": collector_meta,
        # Only the fields the seed schema has (prometheusUrl, reportNamespace; both required).
        "spec": {"prometheusUrl": prometheus_url, "reportNamespace": UNSET_REPORT_NAMESPACE},
    }
    names = sorted(set(clusters))
    shards = [names[i : i + PICK_FIXED_MAX] for i in range(0, len(names), PICK_FIXED_MAX)]
    placements = [
        {
            "apiVersion": CLUSTER_RESOURCE_PLACEMENTS.api_version,
            "kind": CLUSTER_RESOURCE_PLACEMENTS.kind,
            "metadata": _meta(ref, request, crp if index == 0 else f"{crp}-{index + 1}"),
            "spec": {
                "resourceSelectors": [_collector_selector(mc)],
                "policy": {"placementType": "PickFixed", "clusterNames": shard},
                "strategy": {"type": "RollingUpdate"},
            },
        }
        for index, shard in enumerate(shards)
    ]
    return collector, placements


def override_body(name: str, collectors: Sequence[str]) -> Body:
    """A shared ClusterResourceOverride: reportNamespace per member for these collectors.

    No spec.placement (it is immutable and names one placement): the override applies to every
    placement of the collectors it selects; it exists before their placements do.
    """
    return {
        "apiVersion": CLUSTER_RESOURCE_OVERRIDES.api_version,
        "kind": CLUSTER_RESOURCE_OVERRIDES.kind,
        "metadata": {"name": name, "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {
            "clusterResourceSelectors": [_collector_selector(c) for c in collectors],
            "policy": {
                "overrideRules": [
                    {
                        "clusterSelector": {"clusterSelectorTerms": []},
                        "overrideType": "JSONPatch",
                        "jsonPatchOverrides": [
                            {
                                "op": "replace",
                                "path": "/spec/reportNamespace",
                                "value": REPORT_NAMESPACE_TEMPLATE,
                            }
                        ],
                    }
                ]
            },
        },
    }


def selected_collectors(override: Mapping[str, Any]) -> list[str]:
    """The MetricCollector names an override of ours selects, in order."""
    spec = override.get("spec") or {}
    return [
        str(s.get("name"))
        for s in spec.get("clusterResourceSelectors") or []
        if isinstance(s, Mapping) and s.get("kind") == METRIC_COLLECTORS.kind and s.get("name")
    ]


def plan_overrides(
    current: Mapping[str, Sequence[str]], wanted: Sequence[str], max_overrides: int
) -> tuple[dict[str, list[str]], list[str]]:
    """(override name → collectors it should select, collectors left without a slot).

    current: our overrides now (name → selected collectors). A collector still wanted keeps
    its override; one no longer wanted leaves it; a new one joins the first override with room
    (by name), else a new override (prefix + the smallest free number) while fewer than
    max_overrides exist. Overrides left empty are absent from the plan (delete them).
    """
    want = set(wanted)
    plan: dict[str, list[str]] = {}
    placed: set[str] = set()
    for name in sorted(current):
        keep = [c for c in current[name] if c in want and c not in placed]
        placed.update(keep)
        plan[name] = keep
    waiting = sorted(want - placed)
    for name in sorted(plan):
        room = SELECTORS_PER_OVERRIDE - len(plan[name])
        if room > 0 and waiting:
            plan[name].extend(waiting[:room])
            waiting = waiting[room:]
    number = 1
    while waiting and sum(1 for v in plan.values() if v) < max_overrides:
        name = f"{OVERRIDE_PREFIX}{number}"
        number += 1
        if plan.get(name):
            continue
        plan[name] = waiting[:SELECTORS_PER_OVERRIDE]
        waiting = waiting[SELECTORS_PER_OVERRIDE:]
    return {k: v for k, v in plan.items() if v}, waiting
