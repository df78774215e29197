"""GKE's documented version rules, checked before calling GKE: version aliases resolved from
GetServerConfig, the versions offered to the cluster (its channel, plus same-minor patches of
newer channels), downgrades, minor skips, node version skew and Autopilot; and the opt-in
refusal inside maintenance exclusions. Each refusal carries a reason code and a message that
names the field and what to do.

Sources (GKE documentation and the container v1 API reference):
- UpdateMasterRequest.master_version / UpdateNodePoolRequest.node_version: the aliases
  "latest", "1.X", "1.X.Y", "-" (default version for control planes, the control plane's
  version for nodes), or an explicit "1.X.Y-gke.N".
- https://cloud.google.com/kubernetes-engine/docs/concepts/release-channels: a cluster in a
  channel may be upgraded to a patch version of a newer channel when it keeps its minor version.
- https://cloud.google.com/kubernetes-engine/docs/how-to/upgrading-a-cluster: control planes
  upgrade one minor version at a time and may be downgraded only to an earlier patch of the
  same minor version; Autopilot node versions are managed by GKE (only the control plane is
  upgraded by hand).
- https://cloud.google.com/kubernetes-engine/versioning: nodes may be up to two minor versions
  older than the control plane and never newer.
- https://cloud.google.com/kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions:
  exclusions forbid automatic maintenance only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from google.cloud import container_v1

from plugins.gke.windows import as_datetime, exclusion_scope
from plugins.sdk import FailedPrecondition, InvalidArgument, Reason, is_newer_version, parse_version

__all__ = [
    "AUTOPILOT_NODE_POOL",
    "DEFAULT_NODE_POOL_SOAK_SECONDS",
    "MAX_NODE_MINOR_SKEW",
    "NODE_POOL_TOO_FAR_BEHIND",
    "BlueGreenPlan",
    "Refusal",
    "autopilot_refusal",
    "blue_green_plan",
    "check_control_plane",
    "check_node_pool",
    "exclusion_refusal",
    "is_autopilot",
    "offered_master_versions",
    "offered_node_versions",
    "resolve_control_plane",
    "resolve_node_pool",
    "upgrade_plan",
]

_Channel = container_v1.ReleaseChannel.Channel
_Scope = container_v1.MaintenanceExclusionOptions.Scope
_SHOWN = 6  # offered versions listed in a refusal
MAX_NODE_MINOR_SKEW = 2
"""Node pools may be this many minor versions older than their control plane (GKE docs)."""

# Channels whose versions are newer than a channel's own (release-channels: new versions reach
# Rapid first, then Regular, then Stable; Extended follows Regular).
_NEWER: dict[int, tuple[int, ...]] = {
    _Channel.RAPID: (),
    _Channel.REGULAR: (_Channel.RAPID,),
    _Channel.STABLE: (_Channel.REGULAR, _Channel.RAPID),
    _Channel.EXTENDED: (_Channel.REGULAR, _Channel.RAPID),
}
_ALIAS = re.compile(r"^\d+\.\d+(\.\d+)?$")


AUTOPILOT_NODE_POOL = "AUTOPILOT_NODE_POOL"
"""ErrorInfo reason: a manual node-pool upgrade asked of an Autopilot cluster."""
NODE_POOL_TOO_FAR_BEHIND = "NODE_POOL_TOO_FAR_BEHIND"
"""ErrorInfo reason: a node version more than MAX_NODE_MINOR_SKEW minors behind its control
plane (the control plane's upgrade would cause it, or the node version asked is that old)."""

Refusal = FailedPrecondition
"""A refusal by GKE's rules: FailedPrecondition with an ErrorInfo reason; retryable (with
retry_after when known) only for the opt-in maintenance-exclusion refusal."""


def autopilot_refusal(cluster_id: str, field: str = "node_pool") -> Refusal:
    """Autopilot: GKE upgrades the nodes itself; only the control plane is upgraded by hand."""
    return Refusal(
        f"{field}: cluster {cluster_id} is an Autopilot cluster; GKE upgrades its nodes itself "
        "after the control plane, so upgrade only the control plane",
        reason=AUTOPILOT_NODE_POOL,
    )


def is_autopilot(cluster: container_v1.Cluster) -> bool:
    """True for an Autopilot cluster (its nodes are upgraded by GKE, never by hand)."""
    return bool(cluster.autopilot.enabled)


def _channel(cluster: container_v1.Cluster) -> int:
    return int(cluster.release_channel.channel)


def _channel_name(value: int) -> str:
    try:
        return str(_Channel(value).name)
    except ValueError:
        return str(value)


def _channel_versions(config: container_v1.ServerConfig, channel: int) -> list[str]:
    for entry in config.channels:
        if int(entry.channel) == channel:
            return list(entry.valid_versions)
    return []


def _channel_default(config: container_v1.ServerConfig, channel: int) -> str:
    for entry in config.channels:
        if int(entry.channel) == channel:
            return str(entry.default_version)
    return ""


def _minor(version: str) -> tuple[int, int]:
    parsed = parse_version(version)
    return parsed.major, parsed.minor


def offered_master_versions(
    cluster: container_v1.Cluster, config: container_v1.ServerConfig
) -> list[str]:
    """Control-plane versions GKE offers the cluster: its channel's, or the no-channel list."""
    channel = _channel(cluster)
    if channel != _Channel.UNSPECIFIED:
        return _channel_versions(config, channel)
    return list(config.valid_master_versions)


def _newer_channel_patches(
    cluster: container_v1.Cluster, config: container_v1.ServerConfig, minor: tuple[int, int]
) -> list[str]:
    """Versions of newer channels with the given minor version (channel clusters only)."""
    found: list[str] = []
    for channel in _NEWER.get(_channel(cluster), ()):
        found.extend(v for v in _channel_versions(config, channel) if _minor(v) == minor)
    return found


def offered_node_versions(
    cluster: container_v1.Cluster, config: container_v1.ServerConfig, master: str = ""
) -> list[str]:
    """Node versions GKE accepts: the valid node versions, the cluster's channel versions and
    the control plane's own (master: the control plane's version to check against)."""
    master = master or cluster.current_master_version
    offered = [*config.valid_node_versions, master, cluster.current_master_version]
    channel = _channel(cluster)
    if channel != _Channel.UNSPECIFIED:
        offered += _channel_versions(config, channel)
        offered += _newer_channel_patches(cluster, config, _minor(master))
    return offered


def _listing(offered: Iterable[str]) -> str:
    ordered = sorted(set(offered), key=parse_version, reverse=True)
    if not ordered:
        return "none"
    shown = ", ".join(ordered[:_SHOWN])
    return shown + (f" and {len(ordered) - _SHOWN} older" if len(ordered) > _SHOWN else "")


def _resolve(field: str, requested: str, offered: list[str], default: str, what: str) -> str:
    """An alias ("latest", "1.X", "1.X.Y", "-") as the explicit version GKE would pick from
    offered; an explicit version unchanged; InvalidArgument when an alias matches nothing."""
    ordered = sorted(set(offered), key=parse_version, reverse=True)
    picked: str | None = None
    if requested == "-":
        picked = default or None
    elif requested == "latest":
        picked = ordered[0] if ordered else None
    elif _ALIAS.match(requested):
        if requested in ordered:
            return requested
        wanted = parse_version(requested)
        depth = 3 if requested.count(".") == 2 else 2
        picked = next((v for v in ordered if parse_version(v)[:depth] == wanted[:depth]), None)
    else:
        return requested  # an explicit version: checked against the offered list later
    if picked is None:
        raise InvalidArgument(
            field,
            f"{requested!r} matches no version GKE offers for {what}; valid: "
            f"{_listing(ordered)} (or an alias: latest, 1.X, 1.X.Y, -)",
        )
    return picked


def resolve_control_plane(
    cluster: container_v1.Cluster,
    config: container_v1.ServerConfig,
    requested: str,
    field: str = "version",
) -> str:
    """The explicit control-plane version GKE would upgrade to for requested."""
    channel = _channel(cluster)
    default = (
        _channel_default(config, channel)
        if channel != _Channel.UNSPECIFIED
        else str(config.default_cluster_version)
    )
    return _resolve(
        field, requested, offered_master_versions(cluster, config), default, "control planes"
    )


def resolve_node_pool(
    cluster: container_v1.Cluster,
    config: container_v1.ServerConfig,
    requested: str,
    master: str = "",
    field: str = "version",
) -> str:
    """The explicit node version GKE would upgrade to for requested ("-": the control plane's
    version; aliases pick among offered node versions not newer than the control plane)."""
    master = master or cluster.current_master_version
    offered = [
        v for v in offered_node_versions(cluster, config, master) if not is_newer_version(v, master)
    ]
    return _resolve(field, requested, offered, master, "node pools")


def _not_offered(
    version: str, what: str, location: str, where: str, cluster_id: str, offered: Iterable[str]
) -> Refusal:
    return Refusal(
        f"version: {version} is not offered by GKE for {what} in {location}{where} "
        f"(cluster {cluster_id}); offered: {_listing(offered)}",
        reason=Reason.VERSION_NOT_OFFERED,
    )


def check_control_plane(
    cluster_id: str,
    cluster: container_v1.Cluster,
    version: str,
    config: container_v1.ServerConfig,
    location: str,
) -> None:
    """Raises the Refusal GKE would answer to a control-plane upgrade to (explicit) version.

    The caller has handled version == current (nothing to do).
    """
    current = cluster.current_master_version
    now, new = _minor(current), _minor(version)
    if is_newer_version(current, version) and new != now:
        raise Refusal(
            f"version: {version} is older than the control plane of cluster {cluster_id} "
            f"({current}); GKE does not downgrade control planes to an earlier minor version "
            "(only to an earlier patch of the same minor)",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )
    if new[0] == now[0] and new[1] > now[1] + 1:
        raise Refusal(
            f"version: {version} skips a minor version from the control plane's {current} "
            f"(cluster {cluster_id}); GKE upgrades control planes one minor version at a time, "
            "so add an intermediate version",
            reason=Reason.MINOR_VERSION_SKIP,
        )
    offered = offered_master_versions(cluster, config)
    newer = _newer_channel_patches(cluster, config, now) if new == now else []
    if version not in offered and version not in newer:
        channel = _channel(cluster)
        where = (
            f" in the {_channel_name(channel)} release channel"
            if channel != _Channel.UNSPECIFIED
            else " without a release channel"
        )
        raise _not_offered(
            version, "control planes", location, where, cluster_id, [*offered, *newer]
        )
    if not is_autopilot(cluster):
        for pool in cluster.node_pools:
            if pool.version and _behind(pool.version, version) > MAX_NODE_MINOR_SKEW:
                raise Refusal(
                    f"version: {version} would leave node pool {pool.name} of cluster "
                    f"{cluster_id} ({pool.version}) more than {MAX_NODE_MINOR_SKEW} minor "
                    "versions behind its control plane; upgrade the node pool first",
                    reason=NODE_POOL_TOO_FAR_BEHIND,
                )


def _behind(node: str, master: str) -> int:
    """How many minor versions node is behind master (same major assumed, as in Kubernetes 1)."""
    return _minor(master)[1] - _minor(node)[1]


def check_node_pool(
    cluster_id: str,
    cluster: container_v1.Cluster,
    pool: container_v1.NodePool,
    version: str,
    config: container_v1.ServerConfig,
    location: str,
    master: str = "",
) -> None:
    """Raises the Refusal GKE (or the plugin's no-downgrade rule) would answer to a node-pool
    upgrade to (explicit) version, against the control plane at master (default: current).

    The caller has handled version == the pool's current version (nothing to do).
    """
    master = master or cluster.current_master_version
    if is_autopilot(cluster):
        raise autopilot_refusal(cluster_id)
    if is_newer_version(version, master):
        raise Refusal(
            f"version: {version} is newer than the control plane of cluster {cluster_id} "
            f"({master}); node pool {pool.name} cannot pass its control plane: upgrade the "
            "control plane first",
            reason=Reason.NODE_POOL_AHEAD_OF_CONTROL_PLANE,
        )
    if _behind(version, master) > MAX_NODE_MINOR_SKEW:
        raise Refusal(
            f"version: {version} is more than {MAX_NODE_MINOR_SKEW} minor versions behind the "
            f"control plane of cluster {cluster_id} ({master}); choose a node version of "
            f"minor {_minor(master)[0]}.{_minor(master)[1] - MAX_NODE_MINOR_SKEW} or newer",
            reason=NODE_POOL_TOO_FAR_BEHIND,
        )
    if is_newer_version(pool.version, version):
        raise Refusal(
            f"version: {version} is older than node pool {pool.name} of cluster {cluster_id} "
            f"({pool.version}); the plugin does not downgrade node pools (use GKE's "
            "rollback for an upgrade in progress)",
            reason=Reason.DOWNGRADE_NOT_SUPPORTED,
        )
    offered = offered_node_versions(cluster, config, master)
    if version not in offered:
        raise _not_offered(version, "node pools", location, "", cluster_id, offered)


def exclusion_refusal(
    cluster_id: str,
    cluster: container_v1.Cluster,
    *,
    minor: bool,
    node: bool,
    now: datetime | None = None,
) -> Refusal | None:
    """The refusal for an upgrade inside an active exclusion whose scope covers it (used only
    with upgrades.respectMaintenanceExclusions: GKE itself lets manual upgrades through)."""
    moment = now or datetime.now(UTC)
    windows = cluster.maintenance_policy.window.maintenance_exclusions
    for name in sorted(windows):
        window = windows[name]
        start = as_datetime(window.start_time) if "start_time" in window else None
        end = as_datetime(window.end_time) if "end_time" in window else None
        if (start is not None and moment < start) or (end is not None and moment >= end):
            continue
        scope = exclusion_scope(window)
        if scope == _Scope.NO_MINOR_UPGRADES:
            blocked = minor
        elif scope == _Scope.NO_MINOR_OR_NODE_UPGRADES:
            blocked = minor or node
        else:
            blocked = True  # NO_UPGRADES, and any scope this plugin does not know
        if not blocked:
            continue
        scope_name = _Scope(scope).name if scope in (0, 1, 2) else str(scope)
        until = end.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if end else "no end date"
        return Refusal(
            f"cluster {cluster_id} is inside maintenance exclusion {name!r} "
            f"(scope {scope_name}, until {until}) and upgrades.respectMaintenanceExclusions is "
            "set; the upgrade is retryable after it ends (or set the option to false: GKE "
            "itself lets manual upgrades through exclusions)",
            reason=Reason.MAINTENANCE_EXCLUSION,
            retry_after=float(int((end - moment).total_seconds()) + 1) if end else None,
            retryable=True,
        )
    return None


#: GKE's node-pool soak when a blue-green pool sets none (GKE documentation, "Node upgrade
#: strategies", blue-green phases: the node pool soak defaults to one hour).
DEFAULT_NODE_POOL_SOAK_SECONDS = 3600


@dataclass(frozen=True)
class BlueGreenPlan:
    """How a blue-green node-pool upgrade runs, from the pool's upgradeSettings: the blue pool
    is drained in `batches`, soaking `batch_soak` seconds after each, then the whole pool soaks
    `pool_soak` seconds before the blue nodes are deleted; all inside one UPGRADE_NODES
    operation."""

    nodes: int
    batches: int
    batch_soak: int
    pool_soak: int
    pool_soak_defaulted: bool  # nodePoolSoakDuration unset: GKE's one-hour default

    @property
    def soak(self) -> int:
        """Seconds the upgrade spends soaking (on top of creating and draining nodes)."""
        return self.batches * self.batch_soak + self.pool_soak


def blue_green_plan(pool: container_v1.NodePool) -> BlueGreenPlan | None:
    """The pool's blue-green plan; None for a surge pool (no soak). A blue-green upgrade drains
    the blue pool in batches, soaking `batchSoakDuration` after each ("Default to zero",
    cluster_service.proto), then soaks `nodePoolSoakDuration` before deleting it. The batch
    count follows standardRolloutPolicy (a node count or a fraction of the pool's nodes; one
    batch when neither is set)."""
    settings = pool.upgrade_settings
    strategy = container_v1.NodePoolUpdateStrategy(settings.strategy)
    if strategy != container_v1.NodePoolUpdateStrategy.BLUE_GREEN:
        return None
    blue_green = settings.blue_green_settings
    policy = blue_green.standard_rollout_policy
    nodes = max(1, pool.initial_node_count) * max(1, len(pool.locations))
    if policy.batch_node_count > 0:
        batch = policy.batch_node_count
    elif policy.batch_percentage > 0:
        batch = max(1, math.ceil(nodes * policy.batch_percentage))
    else:
        batch = nodes
    defaulted = "node_pool_soak_duration" not in blue_green
    return BlueGreenPlan(
        nodes=nodes,
        batches=math.ceil(nodes / batch),
        batch_soak=_seconds(policy.batch_soak_duration),
        pool_soak=(
            DEFAULT_NODE_POOL_SOAK_SECONDS
            if defaulted
            else _seconds(blue_green.node_pool_soak_duration)
        ),
        pool_soak_defaulted=defaulted,
    )


def upgrade_plan(pool: container_v1.NodePool) -> tuple[str, int]:
    """(strategy, soak seconds) of a pool's upgrade: ("SURGE", 0), or ("BLUE_GREEN", the soak
    of its blue_green_plan)."""
    plan = blue_green_plan(pool)
    return ("SURGE", 0) if plan is None else ("BLUE_GREEN", plan.soak)


def _seconds(value: object) -> int:
    """Whole seconds of a proto-plus Duration field (a timedelta at run time)."""
    if isinstance(value, timedelta):
        return int(value.total_seconds())
    return int(getattr(value, "seconds", 0))
