"""MemberCluster → contract Cluster, and the taint arithmetic of service-out (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.kubefleet.objects import ANNOTATION_VERSION, condition, parse_time

__all__ = [
    "AGENT",
    "DEFAULT_HEARTBEAT_TIMEOUT",
    "DEFAULT_TAINT_KEY",
    "DEFAULT_VERSION_SOURCE",
    "TaintSpec",
    "availability",
    "cluster_version",
    "has_our_taint",
    "labels_of",
    "parse_version_sources",
    "to_cluster",
    "with_our_taint",
    "without_our_taint",
]

AGENT = "MemberAgent"
"""The agent type whose Joined/Healthy conditions say the member is reachable."""

DEFAULT_HEARTBEAT_TIMEOUT = 300.0
"""Seconds since the member agent's last heartbeat after which KubeFleet counts the member as
not connected: its scheduler's cluster eligibility checker, defaultClusterHeartbeatCheckTimeout
(5 minutes) in pkg/scheduler/clustereligibilitychecker/checker.go (kubefleet-dev/kubefleet;
read in Azure/fleet @ 02a65ee, the same package before the move). Nothing on a hub changes a
MemberCluster's conditions when its agent goes silent: the age of
status.agentStatus[type=MemberAgent].lastReceivedHeartbeat is the only sign."""
DEFAULT_TAINT_KEY = "fleetupgrade.io/out-of-service"
DEFAULT_VERSION_SOURCE = "auto"
AUTO_VERSION_SOURCES = (
    "property:k8s.io/k8s-version",
    f"annotation:{ANNOTATION_VERSION}",
    f"label:{ANNOTATION_VERSION}",
)
"""The order "auto" reads a member's version in, first non-empty wins: the property KubeFleet's
Azure property provider publishes (status.properties), then an annotation and a label anyone
can set on any hub (KubeFleet's MemberCluster status has no version field of its own). The
property lags an upgrade by up to 15 minutes: the provider caches the version it reads
(k8sVersionCacheTTL, pkg/propertyprovider/azure/provider.go); list a fresher source first where
one exists."""
_SOURCE_KINDS = ("property", "annotation", "label")


@dataclass(frozen=True)
class TaintSpec:
    """The MemberCluster taint this plugin owns: key and value (effect NoSchedule)."""

    key: str = DEFAULT_TAINT_KEY
    value: str = "fleet-orchestrator"


def _taints(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    taints = (obj.get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict)]


def _is_ours(taint: Mapping[str, Any], spec: TaintSpec) -> bool:
    return taint.get("key") == spec.key and taint.get("value", "") == spec.value


def has_our_taint(obj: Mapping[str, Any], spec: TaintSpec) -> bool:
    """True when the MemberCluster carries our service-out taint."""
    return any(_is_ours(t, spec) for t in _taints(obj))


def with_our_taint(taints: list[dict[str, Any]], spec: TaintSpec) -> list[dict[str, Any]] | None:
    """The taint list with ours appended (others kept as they are); None when present."""
    if any(_is_ours(t, spec) for t in taints):
        return None
    return [*taints, {"key": spec.key, "value": spec.value, "effect": "NoSchedule"}]


def without_our_taint(taints: list[dict[str, Any]], spec: TaintSpec) -> list[dict[str, Any]] | None:
    """The taint list without ours (same key, other value: not ours, kept); None when absent."""
    kept = [t for t in taints if not _is_ours(t, spec)]
    return None if len(kept) == len(taints) else kept


def parse_version_sources(text: str) -> list[tuple[str, str]]:
    """[(kind, name)] of "auto" or a comma-separated list of property:NAME, annotation:KEY,
    label:KEY; ValueError naming what is wrong."""
    items = AUTO_VERSION_SOURCES if text.strip() == "auto" else tuple(text.split(","))
    out = []
    for item in items:
        kind, _, name = item.strip().partition(":")
        if kind not in _SOURCE_KINDS or not name:
            raise ValueError(
                f"{item.strip()!r}: use auto, or a comma-separated list of property:NAME "
                "(e.g. property:k8s.io/k8s-version), annotation:KEY, label:KEY"
            )
        out.append((kind, name))
    return out


def cluster_version(obj: Mapping[str, Any], source: str) -> str:
    """The member's Kubernetes version from the first source that has one, no leading v."""
    meta = obj.get("metadata") or {}
    for kind, name in parse_version_sources(source):
        raw: Any = ""
        if kind == "property":
            prop = ((obj.get("status") or {}).get("properties") or {}).get(name) or {}
            raw = prop.get("value", "") if isinstance(prop, Mapping) else ""
        elif kind == "annotation":
            raw = (meta.get("annotations") or {}).get(name, "")
        else:
            raw = (meta.get("labels") or {}).get(name, "")
        text = str(raw or "").strip()
        if text:
            return text[1:] if text[:1] in ("v", "V") and text[1:2].isdigit() else text
    return ""


def availability(
    obj: Mapping[str, Any], heartbeat_timeout: float, now: datetime | None = None
) -> tuple[bool, str]:
    """(available, why not): not leaving, Joined True, the member agent's last heartbeat at
    most heartbeat_timeout seconds old (KubeFleet's own test, see DEFAULT_HEARTBEAT_TIMEOUT; a
    missing heartbeat is as old as can be, as there), and the agent Joined and Healthy."""
    status = obj.get("status") or {}
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        return False, "the MemberCluster is being deleted (leaving the fleet)"
    joined = condition(status.get("conditions"), "Joined")
    if joined is None or joined.get("status") != "True":
        state = "not reported" if joined is None else f"{joined.get('status')}"
        return False, f"MemberCluster condition Joined is {state}"
    agents = [a for a in status.get("agentStatus") or [] if isinstance(a, dict)]
    agent = next((a for a in agents if a.get("type") == AGENT), None)
    if agent is None:
        return False, f"no {AGENT} status reported"
    last = parse_time(agent.get("lastReceivedHeartbeat"))
    if last is None:
        return False, f"{AGENT} has reported no heartbeat (lastReceivedHeartbeat is not set)"
    age = ((now or datetime.now(UTC)) - last).total_seconds()
    if age > heartbeat_timeout:
        return False, (
            f"{AGENT} is silent: last heartbeat {_age(age)} ago "
            f"({agent.get('lastReceivedHeartbeat')}), more than the {heartbeat_timeout:g}s "
            "KubeFleet allows before it counts the member as not connected"
        )
    for kind in ("Joined", "Healthy"):
        cond = condition(agent.get("conditions"), kind)
        if cond is None or cond.get("status") != "True":
            why = "" if cond is None else f" ({cond.get('reason') or 'no reason'})"
            state = "not reported" if cond is None else str(cond.get("status"))
            return False, f"{AGENT} condition {kind} is {state}{why}"
    return True, ""


def _age(seconds: float) -> str:
    """A heartbeat age for people: 42s, 17m, 3h5m."""
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    return f"{whole // 3600}h{whole % 3600 // 60}m"


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """The MemberCluster's labels."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def to_cluster(
    obj: Mapping[str, Any],
    taint: TaintSpec,
    version_source: str,
    heartbeat_timeout: float,
    current: cluster_pb2.Operation | None,
) -> cluster_pb2.Cluster:
    """The contract's view of one MemberCluster (KubeFleet reports no node pools)."""
    available, reason = availability(obj, heartbeat_timeout)
    cluster = cluster_pb2.Cluster(
        id=str((obj.get("metadata") or {}).get("name", "")),
        labels=labels_of(obj),
        control_plane_version=cluster_version(obj, version_source),
        available=available,
        unavailable_reason=reason,
        in_service=not has_our_taint(obj, taint),
    )
    if current is not None:
        cluster.current_operation.CopyFrom(current)
    return cluster
