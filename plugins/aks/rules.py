"""AKS's upgrade rules, judged on the cluster and its upgrade profile before ARM is asked.

One home for them: UpgradeControlPlane / UpgradeNodePool raise the refusal, PreflightUpgrade
turns the same refusal into a verdict (plugins.sdk.preflight.verdict_of_check).

Sources: the upgrade profile (ManagedClusters_GetUpgradeProfile) lists the versions the
control plane and each pool may go to; AKS does not skip minor versions
(https://learn.microsoft.com/azure/aks/upgrade-aks-cluster) and a pool may not be newer than
the control plane (https://learn.microsoft.com/azure/aks/supported-kubernetes-versions); an
operation in progress (a provisioningState other than Succeeded / Failed) refuses another one
(409 OperationNotAllowed); a stopped cluster cannot be upgraded
(https://learn.microsoft.com/azure/aks/start-stop-cluster).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugins.sdk import (
    FailedPrecondition,
    NotFound,
    PluginError,
    Reason,
    is_downgrade,
    is_newer_version,
    parse_version,
    version_meets,
)

__all__ = [
    "BUSY_RETRY_SECONDS",
    "MAX_POOL_MINOR_SKEW",
    "NODE_POOL_TOO_FAR_BEHIND",
    "SETTLED",
    "busy_refusal",
    "cluster_version",
    "judge",
    "pool_profiles",
    "pool_version",
]

Json = dict[str, Any]
SETTLED = frozenset({"Succeeded", "Failed", "Canceled"})
"""provisioningStates in which no operation runs on the resource."""
BUSY_RETRY_SECONDS = 30.0
"""RetryInfo of a refusal because AKS runs an operation the plugin did not start."""
MAX_POOL_MINOR_SKEW = 2
"""A node pool's minor may be at most this many behind the control plane's
(https://learn.microsoft.com/azure/aks/supported-kubernetes-versions: "node pool minor version
must be within two minor versions of the control plane version")."""
NODE_POOL_TOO_FAR_BEHIND = "NODE_POOL_TOO_FAR_BEHIND"
"""ErrorInfo reason (as the GKE plugin's): the control plane's upgrade would leave a pool more
than MAX_POOL_MINOR_SKEW minors behind it."""


def cluster_version(cluster: Json) -> str:
    """The version the control plane runs (currentKubernetesVersion; kubernetesVersion is
    what was asked for)."""
    props = cluster.get("properties") or {}
    return str(props.get("currentKubernetesVersion") or props.get("kubernetesVersion") or "")


def pool_version(pool: Json) -> str:
    """The version a pool runs (currentOrchestratorVersion, else orchestratorVersion)."""
    return str(pool.get("currentOrchestratorVersion") or pool.get("orchestratorVersion") or "")


def pool_profiles(cluster: Json) -> dict[str, Json]:
    """The cluster's agent pools by name (agentPoolProfiles)."""
    props = cluster.get("properties") or {}
    return {str(p["name"]): p for p in props.get("agentPoolProfiles") or [] if p.get("name")}


def _upgrades(profile: Json) -> list[str]:
    return [str(u["kubernetesVersion"]) for u in profile.get("upgrades") or []]


def busy_refusal(cluster: Json, cluster_id: str) -> PluginError | None:
    """AKS runs an operation on the cluster or one of its pools, or the cluster is stopped."""
    props = cluster.get("properties") or {}
    state = str(props.get("provisioningState") or "Succeeded")
    if state not in SETTLED:
        return FailedPrecondition(
            f"cluster {cluster_id}: AKS runs an operation on it (provisioningState {state}); "
            "ask again when it has ended",
            reason=Reason.CLUSTER_BUSY,
            retry_after=BUSY_RETRY_SECONDS,
        )
    for name, pool in sorted(pool_profiles(cluster).items()):
        pool_state = str(pool.get("provisioningState") or "Succeeded")
        if pool_state not in SETTLED:
            return FailedPrecondition(
                f"cluster {cluster_id}: AKS runs an operation on node pool {name} "
                f"(provisioningState {pool_state}); ask again when it has ended",
                reason=Reason.CLUSTER_BUSY,
                retry_after=BUSY_RETRY_SECONDS,
            )
    power = str((props.get("powerState") or {}).get("code") or "Running")
    if power != "Running":
        return FailedPrecondition(
            f"cluster {cluster_id}: the cluster is {power.lower()}; start it to upgrade it",
            reason=Reason.CLUSTER_UNAVAILABLE,
            retry_after=BUSY_RETRY_SECONDS,
        )
    return None


def judge(
    cluster_id: str,
    cluster: Json,
    profile: Json,
    control_plane_version: str,
    node_pool_versions: Mapping[str, str],
) -> PluginError | None:
    """The refusal AKS's rules give these targets, or None when they are acceptable now.

    Never-acceptable targets are judged first (so they answer REFUSED_NEVER even while the
    cluster is busy); targets already met need nothing (None); else the cluster's state (an
    operation of AKS's own, a stopped cluster). NotFound for an unknown pool.
    """
    props = profile.get("properties") or {}
    plane = props.get("controlPlaneProfile") or {}
    current = str(plane.get("kubernetesVersion") or cluster_version(cluster))
    plane_upgrades = _upgrades(plane)
    pools = {str(p.get("name")): p for p in props.get("agentPoolProfiles") or []}
    live = pool_profiles(cluster)
    if control_plane_version:
        refusal = _plane_refusal(cluster_id, current, control_plane_version, plane_upgrades)
        if refusal is None:
            refusal = _skew_refusal(cluster_id, control_plane_version, live)
        if refusal is not None:
            return refusal
    reach = control_plane_version or current
    due = bool(control_plane_version) and not version_meets(current, control_plane_version)
    for name, target in sorted(node_pool_versions.items()):
        if name not in pools and name not in live:
            return NotFound(
                f"node pool {name} not found in cluster {cluster_id}",
                reason=Reason.NODE_POOL_NOT_FOUND,
            )
        pool = pools.get(name) or {}
        now = str(pool.get("kubernetesVersion") or pool_version(live.get(name) or {}))
        offered = set(_upgrades(pool))
        if control_plane_version:
            offered |= set(plane_upgrades) | {current}
        refusal = _pool_refusal(cluster_id, name, now, target, reach, offered)
        if refusal is not None:
            return refusal
        due = due or not now or not version_meets(now, target)
    return busy_refusal(cluster, cluster_id) if due else None


def _plane_refusal(
    cluster_id: str, current: str, target: str, offered: list[str]
) -> PluginError | None:
    if is_downgrade(current, target):
        return FailedPrecondition(
            f"cluster {cluster_id}: the control plane runs {current}; AKS does not downgrade "
            f"to {target}",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )
    if version_meets(current, target):
        return None
    now, want = parse_version(current), parse_version(target)
    if (want.major, want.minor) > (now.major, now.minor + 1):
        return FailedPrecondition(
            f"cluster {cluster_id}: {current} to {target} skips a minor version; AKS upgrades "
            f"one minor at a time (to {now.major}.{now.minor + 1} first)",
            reason=Reason.MINOR_VERSION_SKIP,
        )
    if target not in offered:
        choices = ", ".join(offered) or "none"
        return FailedPrecondition(
            f"cluster {cluster_id}: AKS does not offer {target} for this cluster "
            f"(upgrade profile: {choices})",
            reason=Reason.VERSION_NOT_OFFERED,
        )
    return None


def _skew_refusal(cluster_id: str, target: str, live: Mapping[str, Json]) -> PluginError | None:
    """The control plane at target would leave a pool, as it runs now (the control plane is
    upgraded before the pools), more than MAX_POOL_MINOR_SKEW minors behind."""
    plane = parse_version(target)
    for name, pool in sorted(live.items()):
        now = pool_version(pool)
        if not now:
            continue
        have = parse_version(now)
        if have.major == plane.major and plane.minor - have.minor > MAX_POOL_MINOR_SKEW:
            return FailedPrecondition(
                f"cluster {cluster_id}: the control plane at {target} would leave node pool "
                f"{name} ({now}) more than {MAX_POOL_MINOR_SKEW} minor versions behind; "
                "upgrade the node pool first",
                reason=NODE_POOL_TOO_FAR_BEHIND,
            )
    return None


def _pool_refusal(
    cluster_id: str, name: str, now: str, target: str, plane: str, offered: set[str]
) -> PluginError | None:
    if is_newer_version(target, plane) and not version_meets(plane, target):
        return FailedPrecondition(
            f"cluster {cluster_id}: node pool {name} would run {target}, newer than the "
            f"control plane's {plane}; upgrade the control plane first",
            reason=Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
        )
    if now and is_downgrade(now, target):
        return FailedPrecondition(
            f"cluster {cluster_id}: node pool {name} runs {now}; AKS does not downgrade to "
            f"{target}",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )
    if now and version_meets(now, target):
        return None
    if target not in offered:
        choices = ", ".join(sorted(offered, key=parse_version)) or "none"
        return FailedPrecondition(
            f"cluster {cluster_id}: AKS does not offer {target} for node pool {name} "
            f"(upgrade profile: {choices})",
            reason=Reason.VERSION_NOT_OFFERED,
        )
    return None
