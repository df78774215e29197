"""ManifestWorks: the upgrade work from the template, the read-only health work, and their feedback.

Pure functions over plain JSON. Field names are work.open-cluster-management.io/v1's:
spec.workload.manifests[], spec.manifestConfigs[]{resourceIdentifier, feedbackRules,
updateStrategy}, status.conditions (Applied, Available), and
status.resourceStatus.manifests[]{resourceMeta, statusFeedback.values[]{name, fieldValue},
conditions (Available with reason ResourceNotAvailable when the object does not exist)}.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2, health_pb2
from plugins.ocm.config import FeedbackMatch, ManifestWorkConfig, OcmConfig, WorkloadsConfig
from plugins.ocm.objects import (
    ANNOTATION_OPERATION_ID,
    ANNOTATION_REQUEST_ID,
    ANNOTATION_STARTED_AT,
    ANNOTATION_TARGET_VERSION,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Verdict,
    condition,
    format_time,
    timed_out,
    version_reached,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "WellKnown",
    "WorkloadReading",
    "feedback_values",
    "health_work",
    "read_workload",
    "render",
    "upgrade_work",
    "work_verdict",
    "workloads_in",
]

API_VERSION = "work.open-cluster-management.io/v1"
KIND = "ManifestWork"

_PLACEHOLDER = re.compile(r"\{\{\s*(version|cluster)\s*\}\}")
_RUNNING, _SUCCEEDED, _FAILED = (
    cluster_pb2.OPERATION_STATE_RUNNING,
    cluster_pb2.OPERATION_STATE_SUCCEEDED,
    cluster_pb2.OPERATION_STATE_FAILED,
)


class WellKnown:
    """Names the work agent's WellKnownStatus rule reports for apps/v1 Deployments."""

    AVAILABLE_REPLICAS = "AvailableReplicas"
    READY_REPLICAS = "ReadyReplicas"
    REPLICAS = "Replicas"


def render(template: Any, version: str, cluster: str) -> Any:
    """A deep copy of template with {{version}} and {{cluster}} replaced in every string."""
    values = {"version": version, "cluster": cluster}
    if isinstance(template, str):
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    if isinstance(template, Mapping):
        return {
            render(k, version, cluster): render(v, version, cluster) for k, v in template.items()
        }
    if isinstance(template, list):
        return [render(item, version, cluster) for item in template]
    return template


def _identifier(manifest: Mapping[str, Any], resource: str) -> dict[str, str]:
    api_version = str(manifest.get("apiVersion", ""))
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    meta = manifest.get("metadata") or {}
    ident = {
        "group": group,
        "resource": resource,
        "name": str(meta.get("name", "")),
        "namespace": str(meta.get("namespace", "")),
    }
    # The core group and cluster scope are "": left out, which reads the same.
    return {k: v for k, v in ident.items() if v}


def _base(name: str, cluster: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": cluster,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": dict(annotations),
        },
    }


def upgrade_work(
    mw: ManifestWorkConfig,
    cluster: str,
    version: str,
    request_id: str,
    operation_id: str,
    now: datetime,
) -> dict[str, Any]:
    """The upgrade ManifestWork: the rendered template plus feedback rules for its object."""
    manifest = render(mw.template, version, cluster)
    work = _base(
        mw.name,
        cluster,
        {
            ANNOTATION_REQUEST_ID: request_id,
            ANNOTATION_OPERATION_ID: operation_id,
            ANNOTATION_TARGET_VERSION: version,
            ANNOTATION_STARTED_AT: format_time(now),
        },
    )
    work["spec"] = {
        "workload": {"manifests": [manifest]},
        "manifestConfigs": [
            {
                "resourceIdentifier": _identifier(manifest, mw.resource),
                "feedbackRules": [
                    {
                        "type": "JSONPaths",
                        "jsonPaths": [
                            {"name": rule.name, "path": rule.path}
                            for rule in mw.feedback.json_paths
                        ],
                    }
                ],
            }
        ],
    }
    return work


def _value(field: Mapping[str, Any]) -> str | int | bool | None:
    kind = field.get("type")
    if kind == "Integer":
        return int(field.get("integer", 0))
    if kind == "Boolean":
        return bool(field.get("boolean", False))
    if kind == "String":
        return str(field.get("string") or "")
    if kind == "JsonRaw":
        return str(field.get("jsonRaw") or "")
    return None


def _manifest_status(work: Mapping[str, Any], ident: Mapping[str, Any]) -> Mapping[str, Any] | None:
    manifests = ((work.get("status") or {}).get("resourceStatus") or {}).get("manifests") or []
    for entry in manifests:
        meta = entry.get("resourceMeta") or {}
        if all(
            str(meta.get(k, "")) == str(ident.get(k, ""))
            for k in ("group", "resource", "name", "namespace")
        ):
            return dict(entry)
    return None


def feedback_values(
    work: Mapping[str, Any], ident: Mapping[str, Any]
) -> dict[str, str | int | bool] | None:
    """The feedback values reported for the object ident names; None when not reported."""
    entry = _manifest_status(work, ident)
    if entry is None:
        return None
    values: dict[str, str | int | bool] = {}
    for item in (entry.get("statusFeedback") or {}).get("values") or []:
        value = _value(item.get("fieldValue") or {})
        if item.get("name") and value is not None:
            values[str(item["name"])] = value
    return values


def _matches(rule: FeedbackMatch | None, values: Mapping[str, str | int | bool]) -> bool:
    if rule is None or rule.name not in values:
        return False
    seen, want = values[rule.name], rule.value
    if isinstance(seen, bool) or isinstance(want, bool):
        return str(seen).lower() == str(want).lower()
    return str(seen) == str(want)


def _applied(work: Mapping[str, Any]) -> tuple[bool, str]:
    """(applied at the current generation, why not)."""
    meta = work.get("metadata") or {}
    name = f"ManifestWork {meta.get('namespace')}/{meta.get('name')}"
    applied = condition((work.get("status") or {}).get("conditions"), "Applied")
    if applied is None:
        return False, f"waiting for the work agent to apply {name}"
    observed = applied.get("observedGeneration")
    generation = meta.get("generation")
    if observed is not None and generation is not None and int(observed) < int(generation):
        return False, f"waiting for the work agent to apply the new spec of {name}"
    if applied.get("status") != "True":
        detail = applied.get("message") or applied.get("reason") or "not applied"
        return False, f"{name} is not applied: {detail}"
    return True, ""


def work_verdict(
    work: Mapping[str, Any],
    cluster_version: str,
    target: str,
    started: datetime,
    now: datetime,
    cfg: OcmConfig,
) -> Verdict:
    """Where the upgrade the ManifestWork delivers stands, from its status feedback.

    FAILED when the failed rule matches (message from the message value), or monitorTimeout
    passed; SUCCEEDED when the succeeded rule matches at the current generation and the
    ManagedCluster reports the target version (stale feedback of an earlier upgrade can never
    end a new one).
    """
    mw = cfg.manifest_work
    assert mw is not None
    limit = cfg.monitor_timeout
    applied, why = _applied(work)
    if not applied:
        return timed_out(started, now, limit, why) or Verdict(_RUNNING, 5, "", why)
    configs = (work.get("spec") or {}).get("manifestConfigs") or [{}]
    ident = configs[0].get("resourceIdentifier") or {}
    values = feedback_values(work, ident)
    if values is None:
        why = "waiting for status feedback from the work agent"
        return timed_out(started, now, limit, why) or Verdict(_RUNNING, 10, "", why)
    feedback = mw.feedback
    if _matches(feedback.failed, values):
        assert feedback.failed is not None
        detail = values.get(feedback.message) if feedback.message else None
        text = (
            str(detail)
            if detail not in (None, "")
            else (f"feedback {feedback.failed.name} is {values[feedback.failed.name]}")
        )
        return Verdict(_FAILED, 0, "UPGRADE_FAILED", f"{ident.get('name')}: {text}")
    progress = 10
    if feedback.progress and isinstance(values.get(feedback.progress), int):
        progress = max(10, min(95, int(values[feedback.progress])))
    if _matches(feedback.succeeded, values):
        if version_reached(cluster_version, target):
            return Verdict(_SUCCEEDED, 100)
        why = (
            f"feedback says done but the ManagedCluster reports version "
            f"{cluster_version or 'none'}, not {target}"
        )
        return timed_out(started, now, limit, why) or Verdict(_RUNNING, 95, "", why)
    detail = values.get(feedback.message) if feedback.message else None
    why = str(detail) if detail not in (None, "") else "upgrade in progress"
    return timed_out(started, now, limit, why) or Verdict(_RUNNING, progress, "", why)


# -- health -------------------------------------------------------------------------------------


def _deployment_identifier(namespace: str, name: str) -> dict[str, str]:
    return {"group": "apps", "resource": "deployments", "name": name, "namespace": namespace}


def health_work(
    cfg: WorkloadsConfig, cluster: str, workloads: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """The read-only ManifestWork that reports each Deployment's replicas (nothing is applied)."""
    ordered = sorted(set(workloads))
    if cfg.feedback == "WellKnownStatus":
        rules: list[dict[str, Any]] = [{"type": "WellKnownStatus"}]
    else:
        rules = [
            {
                "type": "JSONPaths",
                "jsonPaths": [
                    {"name": WellKnown.AVAILABLE_REPLICAS, "path": ".status.availableReplicas"},
                    {"name": WellKnown.REPLICAS, "path": ".status.replicas"},
                ],
            }
        ]
    work = _base(cfg.manifest_work_name, cluster, {})
    work["spec"] = {
        "workload": {
            "manifests": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": namespace},
                }
                for namespace, name in ordered
            ]
        },
        "manifestConfigs": [
            {
                "resourceIdentifier": _deployment_identifier(namespace, name),
                "updateStrategy": {"type": "ReadOnly"},
                "feedbackRules": rules,
            }
            for namespace, name in ordered
        ],
    }
    return work


def workloads_in(work: Mapping[str, Any] | None) -> set[tuple[str, str]]:
    """(namespace, name) of every Deployment the health work reports on."""
    if work is None:
        return set()
    found = set()
    for config in (work.get("spec") or {}).get("manifestConfigs") or []:
        ident = config.get("resourceIdentifier") or {}
        if ident.get("resource") == "deployments":
            found.add((str(ident.get("namespace", "")), str(ident.get("name", ""))))
    return found


@dataclass(frozen=True)
class WorkloadReading:
    """The verdict on one Deployment of one cluster, and the value it came from."""

    health: int
    healthy_replicas: int = 0
    observed_value: float = 0.0
    message: str = ""


def read_workload(
    work: Mapping[str, Any] | None,
    cluster_available: tuple[bool, str],
    namespace: str,
    name: str,
    min_healthy: int,
) -> WorkloadReading:
    """HEALTHY / UNHEALTHY from AvailableReplicas feedback; MISSING when the agent reports the
    Deployment absent; UNKNOWN when there is no fresh feedback (work not applied yet, feedback
    not synced, or the cluster's agent is not available so what the hub holds may be stale).
    """
    unknown = health_pb2.WORKLOAD_HEALTH_UNKNOWN
    available, reason = cluster_available
    if not available:
        return WorkloadReading(unknown, message=f"feedback may be stale: {reason}")
    if work is None or (namespace, name) not in workloads_in(work):
        return WorkloadReading(unknown, message="waiting for the health ManifestWork to be written")
    applied, why = _applied(work)
    if not applied:
        return WorkloadReading(unknown, message=why)
    entry = _manifest_status(work, _deployment_identifier(namespace, name))
    if entry is None:
        return WorkloadReading(unknown, message="no status reported for it yet")
    conds = entry.get("conditions")
    exists = condition(conds, "Available")
    if exists is not None and exists.get("status") == "False":
        return WorkloadReading(
            health_pb2.WORKLOAD_HEALTH_MISSING,
            message=f"Deployment {namespace}/{name} does not exist on the cluster",
        )
    synced = condition(conds, "StatusFeedbackSynced")
    if exists is None or synced is None or synced.get("status") != "True":
        return WorkloadReading(unknown, message="status feedback not synced yet")
    values = feedback_values(work, _deployment_identifier(namespace, name)) or {}
    raw = values.get(WellKnown.AVAILABLE_REPLICAS, 0)  # omitted by the Deployment when 0
    replicas = int(raw) if isinstance(raw, int) and not isinstance(raw, bool) else 0
    need = max(1, min_healthy)
    verdict = (
        health_pb2.WORKLOAD_HEALTH_HEALTHY
        if replicas >= need
        else health_pb2.WORKLOAD_HEALTH_UNHEALTHY
    )
    return WorkloadReading(
        verdict,
        healthy_replicas=replicas,
        observed_value=float(replicas),
        message=f"{replicas} available replica(s), {need} required",
    )
