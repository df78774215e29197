"""EKS's upgrade rules, one home for PreflightUpgrade and the upgrade RPCs: version offers,
one minor at a time, node groups matching and not ahead of the control plane, node group
health. Each raises the refusal a mutation answers; plugins.sdk.preflight turns it into a
verdict."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from plugins.sdk import FailedPrecondition, InvalidArgument, NotFound, Reason, parse_version

__all__ = [
    "UNHEALTHY_RETRY_SECONDS",
    "check_control_plane",
    "check_pool",
    "check_pool_health",
    "eks_version",
    "minor_of",
    "same_minor",
]

_MINOR = re.compile(r"^v?(\d+)\.(\d+)$")
UNHEALTHY_RETRY_SECONDS = 60.0
"""When to ask again about a node group with health issues (DEGRADED)."""


def minor_of(field: str, version: str) -> tuple[int, int]:
    """(major, minor) of an EKS version. EKS versions are minor versions ("1.30": DescribeCluster
    Cluster.version, DescribeClusterVersions clusterVersion); a patch cannot be asked for.
    Malformed text is INVALID_ARGUMENT; a patch version is VERSION_NOT_OFFERED."""
    try:
        parsed = parse_version(version)
    except ValueError as exc:
        raise InvalidArgument(field, str(exc)) from None
    if not _MINOR.match(version.strip()):
        raise FailedPrecondition(
            f"{field}: EKS offers Kubernetes minor versions, not {version}; set the target to "
            f"{parsed.major}.{parsed.minor}",
            reason=Reason.VERSION_NOT_OFFERED,
        )
    return parsed.major, parsed.minor


def eks_version(field: str, version: str) -> str:
    """The version as EKS spells it ("v1.30" → "1.30"); refusals as minor_of."""
    major, minor = minor_of(field, version)
    return f"{major}.{minor}"


def same_minor(a: str, b: str) -> bool:
    """True when two EKS versions name the same minor version."""
    return parse_version(a)[:2] == parse_version(b)[:2]


def check_control_plane(
    cluster: Mapping[str, Any],
    nodegroups: Mapping[str, Mapping[str, Any]],
    target: str,
    offered: Collection[str],
) -> None:
    """The refusals EKS would answer to UpdateClusterVersion(target), never as asked (no
    RetryInfo). The target being the cluster's version is no refusal (nothing to do)."""
    current = str(cluster["version"])
    want = minor_of("version", target)
    now = parse_version(current)[:2]
    if want == now:
        return
    if want < now:
        raise FailedPrecondition(
            f"version: {target} is older than the control plane's {current}; EKS never "
            "downgrades a cluster",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )
    if f"{want[0]}.{want[1]}" not in offered:
        raise FailedPrecondition(
            f"version: EKS does not offer {target} (DescribeClusterVersions lists "
            f"{', '.join(sorted(offered, key=parse_version)) or 'none'}); change the target",
            reason=Reason.VERSION_NOT_OFFERED,
        )
    if want != (now[0], now[1] + 1):
        raise FailedPrecondition(
            f"version: EKS upgrades a control plane one minor version at a time; {current} "
            f"to {target} skips one; target {now[0]}.{now[1] + 1} first",
            reason=Reason.MINOR_VERSION_SKIP,
        )
    lagging = sorted(n for n, ng in nodegroups.items() if not same_minor(ng["version"], current))
    if lagging:
        # UpdateClusterVersion: "all of your node groups' Kubernetes versions must match the
        # cluster's Kubernetes version in order to update the cluster to a new version".
        raise FailedPrecondition(
            f"node groups {', '.join(lagging)} are not at the control plane's {current}; EKS "
            "upgrades the control plane only when every managed node group matches it; "
            "upgrade them first",
        )


def check_pool(
    cluster: Mapping[str, Any],
    nodegroups: Mapping[str, Mapping[str, Any]],
    pool: str,
    target: str,
    control_plane_target: str = "",
) -> None:
    """The never-as-asked refusals of UpdateNodegroupVersion(pool, target): unknown node group
    (NOT_FOUND), newer than the control plane (its target when one is given), downgrade."""
    nodegroup = nodegroups.get(pool)
    if nodegroup is None:
        raise NotFound(
            f"node_pool: cluster {cluster['arn']} has no managed node group {pool}",
            reason=Reason.NODE_POOL_NOT_FOUND,
        )
    want = minor_of(f"node_pool_versions[{pool}]", target)
    plane = control_plane_target or str(cluster["version"])
    if want > parse_version(plane)[:2]:
        raise FailedPrecondition(
            f"node_pool {pool}: {target} is newer than the control plane's {plane}; upgrade "
            "the control plane first",
            reason=Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
        )
    if want < parse_version(str(nodegroup["version"]))[:2]:
        raise FailedPrecondition(
            f"node_pool {pool}: {target} is older than its {nodegroup['version']}; EKS never "
            "rolls a node group back to an earlier Kubernetes version",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )


def check_pool_health(nodegroup: Mapping[str, Any]) -> None:
    """A node group with health issues (status DEGRADED, Nodegroup.health.issues) is refused
    for now: EKS answers InvalidRequestException until they are resolved."""
    issues = nodegroup.get("health", {}).get("issues", [])
    if issues or nodegroup.get("status") == "DEGRADED":
        codes = ", ".join(sorted({str(i.get("code", "Unknown")) for i in issues})) or "DEGRADED"
        raise FailedPrecondition(
            f"node group {nodegroup['nodegroupName']} has health issues ({codes}); resolve "
            "them (aws eks describe-nodegroup shows each), then the upgrade goes on",
            reason=Reason.CLUSTER_UNAVAILABLE,
            retry_after=UNHEALTHY_RETRY_SECONDS,
        )
