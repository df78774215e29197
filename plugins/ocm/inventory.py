"""ManagedCluster → contract Cluster, and the taint arithmetic of service-out (pure functions)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.ocm.config import OcmConfig, TaintConfig
from plugins.ocm.objects import condition

__all__ = [
    "AVAILABLE",
    "HUB_TAINTS",
    "OPENSHIFT_VERSION_CLAIM",
    "PLACEMENT_LABEL",
    "TAINT_UNAVAILABLE",
    "TAINT_UNREACHABLE",
    "admissible_taints",
    "availability",
    "cluster_version",
    "has_our_taint",
    "is_our_taint",
    "labels_of",
    "placements_selecting",
    "to_cluster",
    "with_our_taint",
    "without_our_taint",
]

AVAILABLE = "ManagedClusterConditionAvailable"
"""The ManagedCluster condition that says the cluster's agent and apiserver are healthy."""

TAINT_UNAVAILABLE = "cluster.open-cluster-management.io/unavailable"
"""Added by the hub when ManagedClusterConditionAvailable is False."""

TAINT_UNREACHABLE = "cluster.open-cluster-management.io/unreachable"
"""Added by the hub when ManagedClusterConditionAvailable is Unknown or missing."""

HUB_TAINTS = (TAINT_UNAVAILABLE, TAINT_UNREACHABLE)


def _taints(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    taints = (obj.get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict)]


def is_our_taint(taint: Mapping[str, Any], cfg: TaintConfig) -> bool:
    """True for the taint this plugin adds: our key with our value (the ownership mark)."""
    return taint.get("key") == cfg.key and taint.get("value", "") == cfg.value


def has_our_taint(obj: Mapping[str, Any], cfg: TaintConfig) -> bool:
    """True when the ManagedCluster carries our service-out taint."""
    return any(is_our_taint(t, cfg) for t in _taints(obj))


def with_our_taint(taints: list[dict[str, Any]], cfg: TaintConfig) -> list[dict[str, Any]] | None:
    """The taint list with ours appended; None when ours is there already.

    Every other taint is kept exactly as it is, in its place (with its timeAdded: the hub's
    webhook denies a kept taint whose timeAdded changed). Ours carries no timeAdded: the
    hub's mutating webhook sets it and denies a new taint that brings one
    (open-cluster-management-io/ocm pkg/registration/webhook/v1/managedcluster_mutating.go).
    """
    if any(is_our_taint(t, cfg) for t in taints):
        return None
    return [*taints, {"key": cfg.key, "value": cfg.value, "effect": "NoSelect"}]


def without_our_taint(
    taints: list[dict[str, Any]], cfg: TaintConfig
) -> list[dict[str, Any]] | None:
    """The taint list without ours; None when ours is not there.

    Taints with our key but another value were added by someone else: they stay.
    """
    kept = [t for t in taints if not is_our_taint(t, cfg)]
    return None if len(kept) == len(taints) else kept


def admissible_taints(
    taints: list[dict[str, Any]], old: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The taint list to send so that the hub's mutating webhook admits it over `old`.

    The webhook (open-cluster-management-io/ocm pkg/registration/webhook/v1/
    managedcluster_mutating.go, processTaints) compares each taint sent with the FIRST taint
    of the old object that has the same key (helpers.FindTaintByKey), whatever its value: when
    value and effect match, the timeAdded sent must equal that one's; otherwise (no such key,
    or another value or effect) the taint must come without timeAdded, and is stamped now. So
    with two taints of one key (ours and someone else's, in either order), sending the list
    back as read is denied. Here each taint gets the timeAdded the webhook demands: the first
    same-key taint's when value and effect match, else none (the webhook stamps it now; for a
    same-key taint after a different first one, that is the only admissible write).
    """
    out = []
    for taint in taints:
        first = next((t for t in old if t.get("key") == taint.get("key")), None)
        kept = {k: v for k, v in taint.items() if k != "timeAdded"}
        if (
            first is not None
            and first.get("value", "") == taint.get("value", "")
            and first.get("effect") == taint.get("effect")
            and first.get("timeAdded")
        ):
            kept["timeAdded"] = first["timeAdded"]
        out.append(kept)
    return out


OPENSHIFT_VERSION_CLAIM = "version.openshift.io"
"""The ClusterClaim holding an OpenShift cluster's version (4.14.10), as the foundation agent
publishes it (stolostron/multicloud-operators-foundation pkg/klusterlet/clusterclaim/
clusterclaimer.go, ClaimOpenshiftVersion)."""


def cluster_version(
    obj: Mapping[str, Any], source: str, cluster_info: Mapping[str, Any] | None = None
) -> str:
    """The control plane version per the configured source, without a leading "v".

    With the OpenShift version claim as the source and no such claim on the ManagedCluster,
    the cluster's ManagedClusterInfo answers: `status.distributionInfo.ocp.version`
    (stolostron/cluster-lifecycle-api clusterinfo/v1beta1/types.go OCPDistributionInfo.Version,
    which the foundation agent copies from the same version.openshift.io claim,
    multicloud-operators-foundation pkg/klusterlet/clusterinfo/distributionInfo_sync.go).
    The claim wins when both exist: that field is "Deprecated in release 2.3 ... Use
    clusterClaim version.openshift.io instead", and it is a copy of the claim made on a
    separate sync, so it can only lag it.
    """
    status = obj.get("status") or {}
    kind, _, name = source.partition(":")
    raw: Any = ""
    if kind == "kubernetes":
        raw = (status.get("version") or {}).get("kubernetes", "")
    elif kind == "clusterClaim":
        for claim in status.get("clusterClaims") or []:
            if isinstance(claim, Mapping) and claim.get("name") == name:
                raw = claim.get("value", "")
                break
        if not raw and name == OPENSHIFT_VERSION_CLAIM and cluster_info is not None:
            info_status = cluster_info.get("status") or {}
            ocp = ((info_status.get("distributionInfo") or {}).get("ocp")) or {}
            raw = ocp.get("version", "") if isinstance(ocp, Mapping) else ""
    elif kind == "label":
        raw = ((obj.get("metadata") or {}).get("labels") or {}).get(name, "")
    text = str(raw or "").strip()
    return text[1:] if text[:1] in ("v", "V") and text[1:2].isdigit() else text


def availability(obj: Mapping[str, Any]) -> tuple[bool, str]:
    """(available, why not): ManagedClusterConditionAvailable True and no hub taint set."""
    cond = condition((obj.get("status") or {}).get("conditions"), AVAILABLE)
    if cond is None:
        return False, f"{AVAILABLE} not reported yet"
    if cond.get("status") != "True":
        reason = cond.get("reason") or "no reason"
        message = cond.get("message") or ""
        text = f"{AVAILABLE} is {cond.get('status')} ({reason})"
        return False, f"{text}: {message}" if message else text
    for taint in _taints(obj):
        if taint.get("key") in HUB_TAINTS:
            return False, f"the hub set taint {taint.get('key')}"
    return True, ""


def labels_of(obj: Mapping[str, Any], claim_prefix: str) -> dict[str, str]:
    """The ManagedCluster's labels plus its ClusterClaims as labels named prefix + claim."""
    labels = {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items()}
    for claim in (obj.get("status") or {}).get("clusterClaims") or []:
        if isinstance(claim, Mapping) and claim.get("name"):
            labels[f"{claim_prefix}{claim['name']}"] = str(claim.get("value", ""))
    return labels


def to_cluster(
    obj: Mapping[str, Any], cfg: OcmConfig, version: str, current: cluster_pb2.Operation | None
) -> cluster_pb2.Cluster:
    """The contract's view of one ManagedCluster (no node pools: OCM does not report them);
    version: its control plane version as HubCaches.version reads it."""
    available, reason = availability(obj)
    cluster = cluster_pb2.Cluster(
        id=str((obj.get("metadata") or {}).get("name", "")),
        labels=labels_of(obj, cfg.cluster_claim_label_prefix),
        control_plane_version=version,
        available=available,
        unavailable_reason=reason,
        in_service=not has_our_taint(obj, cfg.taint),
    )
    if current is not None:
        cluster.current_operation.CopyFrom(current)
    return cluster


PLACEMENT_LABEL = "cluster.open-cluster-management.io/placement"
"""The label a PlacementDecision carries: the name of its Placement (same namespace)."""


def placements_selecting(
    cluster: str,
    decisions: list[Mapping[str, Any]],
    placements: Mapping[tuple[str, str], Mapping[str, Any]],
    taint: TaintConfig,
) -> list[str]:
    """The Placements (namespace/name, sorted) whose PlacementDecisions still select the
    cluster though they do not tolerate our NoSelect taint: the placement controller drops the
    cluster from them when it next schedules (asynchronously). A Placement that tolerates the
    taint keeps the cluster by design and is not waited for; a decision whose Placement is
    gone is not either."""
    holding = set()
    for decision in decisions:
        meta = decision.get("metadata") or {}
        chosen = {
            str(d.get("clusterName"))
            for d in (decision.get("status") or {}).get("decisions") or []
            if isinstance(d, Mapping)
        }
        if cluster not in chosen:
            continue
        namespace = str(meta.get("namespace", ""))
        name = str((meta.get("labels") or {}).get(PLACEMENT_LABEL, ""))
        placement = placements.get((namespace, name))
        if placement is None:
            continue
        tolerations = (placement.get("spec") or {}).get("tolerations") or []
        if not _tolerates(tolerations, taint):
            holding.add(f"{namespace}/{name}")
    return sorted(holding)


def _tolerates(tolerations: list[Any], taint: TaintConfig) -> bool:
    """Whether a Placement's tolerations match our NoSelect taint, as the placement
    controller matches them (open-cluster-management-io/ocm, pkg/placement/plugins/
    tainttoleration: key (empty with Exists matches every key), operator Equal (value must
    match) or Exists, effect empty or equal). A tolerationSeconds toleration is counted as
    expired: it keeps the cluster only for a while, and the cluster is out once it lapses."""
    for tol in tolerations:
        if not isinstance(tol, Mapping):
            continue
        key = str(tol.get("key") or "")
        operator = str(tol.get("operator") or "Equal")
        if key and key != taint.key:
            continue
        if not key and operator != "Exists":
            continue
        if operator == "Equal" and str(tol.get("value") or "") != taint.value:
            continue
        if tol.get("effect") and tol.get("effect") != "NoSelect":
            continue
        if tol.get("tolerationSeconds") is not None:
            continue
        return True
    return False
