"""What the plugin refuses before calling GKE: versions GKE does not offer, downgrades, node
pools newer than their control plane, minor-version skips, and upgrades inside a maintenance
exclusion. Each refusal is a FailedPrecondition whose message names the field and what to do."""

from __future__ import annotations

from datetime import UTC, datetime

from google.cloud import container_v1
from google.protobuf import timestamp_pb2

from plugins.sdk import versions
from plugins.sdk.errors import FailedPrecondition

__all__ = [
    "check_control_plane",
    "check_node_pool",
    "offered_master_versions",
    "offered_node_versions",
]

_Channel = container_v1.ReleaseChannel.Channel
_Scope = container_v1.MaintenanceExclusionOptions.Scope
_SHOWN = 6  # offered versions listed in a refusal


def _channel(cluster: container_v1.Cluster) -> int:
    return int(cluster.release_channel.channel)


def _channel_name(value: int) -> str:
    try:
        return str(_Channel(value).name)
    except ValueError:
        return str(value)


def offered_master_versions(
    cluster: container_v1.Cluster, config: container_v1.ServerConfig
) -> list[str]:
    """Control-plane versions GKE offers the cluster: its channel's, or the no-channel list."""
    channel = _channel(cluster)
    if channel != _Channel.UNSPECIFIED:
        for entry in config.channels:
            if int(entry.channel) == channel:
                return list(entry.valid_versions)
        return []
    return list(config.valid_master_versions)


def offered_node_versions(
    cluster: container_v1.Cluster, config: container_v1.ServerConfig
) -> list[str]:
    """Node versions GKE accepts: the valid node versions plus the control plane's own."""
    return [*config.valid_node_versions, cluster.current_master_version]


def _listing(offered: list[str]) -> str:
    ordered = sorted(set(offered), key=versions.parse, reverse=True)
    if not ordered:
        return "none"
    shown = ", ".join(ordered[:_SHOWN])
    return shown + (f" and {len(ordered) - _SHOWN} older" if len(ordered) > _SHOWN else "")


def _as_datetime(value: object) -> datetime:
    """proto-plus answers Timestamp fields as datetimes; accept a raw Timestamp as well."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, timestamp_pb2.Timestamp):
        return value.ToDatetime(tzinfo=UTC)
    raise TypeError(f"not a time: {type(value).__name__}")


def _minor(version: str) -> tuple[int, int]:
    parsed = versions.parse(version)
    return parsed.major, parsed.minor


def _exclusion_blocks(
    cluster_id: str,
    cluster: container_v1.Cluster,
    *,
    minor: bool,
    node: bool,
    now: datetime,
) -> None:
    windows = cluster.maintenance_policy.window.maintenance_exclusions
    for name in sorted(windows):
        window = windows[name]
        start = _as_datetime(window.start_time) if "start_time" in window else None
        end = _as_datetime(window.end_time) if "end_time" in window else None
        if start is not None and now < start:
            continue
        if end is not None and now >= end:
            continue
        scope = (
            int(window.maintenance_exclusion_options.scope)
            if "maintenance_exclusion_options" in window
            else int(_Scope.NO_UPGRADES)
        )
        if scope == _Scope.NO_UPGRADES:
            blocked = True
        elif scope == _Scope.NO_MINOR_UPGRADES:
            blocked = minor
        elif scope == _Scope.NO_MINOR_OR_NODE_UPGRADES:
            blocked = minor or node
        else:
            blocked = True
        if not blocked:
            continue
        scope_name = _Scope(scope).name if scope in (0, 1, 2) else str(scope)
        until = end.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if end else "no end date"
        raise FailedPrecondition(
            f"cluster {cluster_id} is inside maintenance exclusion {name!r} "
            f"(scope {scope_name}, until {until}); the upgrade is retryable after it ends "
            "(or remove the exclusion from the cluster's maintenancePolicy)"
        )


def check_control_plane(
    cluster_id: str,
    cluster: container_v1.Cluster,
    version: str,
    config: container_v1.ServerConfig,
    location: str,
    *,
    respect_exclusions: bool = True,
    now: datetime | None = None,
) -> None:
    """Refuses a control-plane upgrade of cluster to version that GKE (or policy) would refuse.

    The caller has handled version == current (nothing to do).
    """
    current = cluster.current_master_version
    if versions.is_newer(current, version):
        raise FailedPrecondition(
            f"version: {version} is older than the control plane of cluster {cluster_id} "
            f"({current}); GKE does not downgrade control planes"
        )
    if _minor(version)[0] == _minor(current)[0] and _minor(version)[1] > _minor(current)[1] + 1:
        raise FailedPrecondition(
            f"version: {version} skips a minor version from the control plane's {current} "
            f"(cluster {cluster_id}); GKE upgrades control planes one minor version at a time, "
            "so add an intermediate version"
        )
    offered = offered_master_versions(cluster, config)
    if version not in offered:
        channel = _channel(cluster)
        where = (
            f"in the {_channel_name(channel)} release channel"
            if channel != _Channel.UNSPECIFIED
            else "without a release channel"
        )
        raise FailedPrecondition(
            f"version: {version} is not offered by GKE for control planes in {location} "
            f"{where} (cluster {cluster_id}); offered: {_listing(offered)}"
        )
    if respect_exclusions:
        _exclusion_blocks(
            cluster_id,
            cluster,
            minor=_minor(version) != _minor(current),
            node=False,
            now=now or datetime.now(UTC),
        )


def check_node_pool(
    cluster_id: str,
    cluster: container_v1.Cluster,
    pool: container_v1.NodePool,
    version: str,
    config: container_v1.ServerConfig,
    location: str,
    *,
    respect_exclusions: bool = True,
    now: datetime | None = None,
) -> None:
    """Refuses a node-pool upgrade that GKE (or policy) would refuse.

    The caller has handled version == the pool's current version (nothing to do).
    """
    master = cluster.current_master_version
    if versions.is_newer(version, master):
        raise FailedPrecondition(
            f"version: {version} is newer than the control plane of cluster {cluster_id} "
            f"({master}); node pool {pool.name} cannot pass its control plane: upgrade the "
            "control plane first"
        )
    if versions.is_newer(pool.version, version):
        raise FailedPrecondition(
            f"version: {version} is older than node pool {pool.name} of cluster {cluster_id} "
            f"({pool.version}); the plugin does not downgrade node pools (use GKE's "
            "rollback for an upgrade in progress)"
        )
    offered = offered_node_versions(cluster, config)
    if version not in offered:
        raise FailedPrecondition(
            f"version: {version} is not offered by GKE for node pools in {location} "
            f"(cluster {cluster_id}); offered: {_listing(offered)}"
        )
    if respect_exclusions:
        _exclusion_blocks(
            cluster_id,
            cluster,
            minor=_minor(version) != _minor(pool.version),
            node=True,
            now=now or datetime.now(UTC),
        )
