"""GKE's version rules as the emulator enforces them on UpdateMaster and UpdateNodePool.

Each rule names its source:
- aliases: container v1 API reference, UpdateMasterRequest.master_version ("latest", "1.X",
  "1.X.Y", "1.X.Y-gke.N", "-" = default version) and UpdateNodePoolRequest.node_version (the
  same, with "-" = the control plane's version);
- versions offered: GetServerConfig (validMasterVersions / validNodeVersions, or the cluster's
  release channel's validVersions), plus patches of newer channels in the cluster's minor
  version (https://cloud.google.com/kubernetes-engine/docs/concepts/release-channels);
- control planes: one minor version at a time; downgrade only to an earlier patch of the same
  minor (https://cloud.google.com/kubernetes-engine/docs/how-to/upgrading-a-cluster);
- nodes: never newer than the control plane, at most two minor versions older
  (https://cloud.google.com/kubernetes-engine/versioning);
- Autopilot: node versions are GKE's to manage; only the control plane is upgraded by hand
  (upgrading-a-cluster: "Autopilot clusters: Upgrade the control plane version").
- maintenance exclusions and windows are NOT checked here: they govern automatic maintenance
  only (https://cloud.google.com/kubernetes-engine/docs/concepts/maintenance-windows-and-
  exclusions), so manual upgrades go through them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from google.cloud import container_v1

from plugins.sdk import versions

__all__ = ["VersionError", "check_master", "check_node", "master_target", "node_target"]

Channel = container_v1.ReleaseChannel.Channel
_NEWER = {
    Channel.REGULAR: (Channel.RAPID,),
    Channel.STABLE: (Channel.REGULAR, Channel.RAPID),
    Channel.EXTENDED: (Channel.REGULAR, Channel.RAPID),
}
_MAX_NODE_SKEW = 2


class VersionError(ValueError):
    """GKE's 400 for a version request (the message is GKE-like)."""


def _minor(version: str) -> tuple[int, int]:
    parsed = versions.parse(version)
    return parsed.major, parsed.minor


def _channel_versions(config: Any, channel: int) -> list[str]:
    for entry in config.channels:
        if entry.channel == channel:
            return list(entry.valid_versions)
    return []


def _own_master_versions(config: Any, cluster: Any) -> list[str]:
    channel = cluster.release_channel.channel
    if channel != Channel.UNSPECIFIED:
        return _channel_versions(config, channel)
    return list(config.valid_master_versions)


def _newer_patches(config: Any, cluster: Any, minor: tuple[int, int]) -> list[str]:
    found: list[str] = []
    for channel in _NEWER.get(cluster.release_channel.channel, ()):
        found += [v for v in _channel_versions(config, channel) if _minor(v) == minor]
    return found


def _default_master(config: Any, cluster: Any) -> str:
    channel = cluster.release_channel.channel
    if channel != Channel.UNSPECIFIED:
        for entry in config.channels:
            if entry.channel == channel:
                return str(entry.default_version)
    return str(config.default_cluster_version)


def _resolve(wanted: str, offered: Sequence[str], default: str) -> str | None:
    """The aliases: "-" default, "latest", "1.X", "1.X.Y", or an exact version."""
    ordered = sorted(set(offered), key=versions.parse, reverse=True)
    if wanted == "-":
        return default or None
    if wanted == "latest":
        return ordered[0] if ordered else None
    if wanted in ordered:
        return wanted
    if re.fullmatch(r"\d+\.\d+(\.\d+)?", wanted):
        depth = 3 if wanted.count(".") == 2 else 2
        want = versions.parse(wanted)[:depth]
        return next((v for v in ordered if versions.parse(v)[:depth] == want), None)
    return None


def master_target(config: Any, cluster: Any, wanted: str) -> str:
    """The explicit version an UpdateMaster for `wanted` goes to; VersionError otherwise."""
    current = cluster.current_master_version
    own = _own_master_versions(config, cluster)
    target = _resolve(wanted, own, _default_master(config, cluster))
    if target is None and wanted in _newer_patches(config, cluster, _minor(current)):
        target = wanted
    if target is None:
        raise VersionError(f'Master version "{wanted}" is unsupported.')
    return target


def check_master(cluster: Any, target: str) -> None:
    """The control-plane rules (downgrade, minor skip, node skew); VersionError on a break."""
    current = cluster.current_master_version
    cur, new = _minor(current), _minor(target)
    if versions.is_newer(current, target) and cur != new:
        raise VersionError(
            f'Master version "{target}" is older than the current master version '
            f'"{current}"; only patch downgrades within the minor version are supported.'
        )
    if new[0] == cur[0] and new[1] > cur[1] + 1:
        raise VersionError(
            f"Master cannot be upgraded from {current} to {target}: upgrade one minor "
            "version at a time."
        )
    if not cluster.autopilot.enabled:
        for pool in cluster.node_pools:
            if new[1] - _minor(pool.version)[1] > _MAX_NODE_SKEW:
                raise VersionError(
                    f"Master cannot be upgraded to {target}: node pool {pool.name} at "
                    f"{pool.version} would be more than {_MAX_NODE_SKEW} minor versions older."
                )


def node_target(config: Any, cluster: Any, wanted: str) -> str:
    """The explicit version an UpdateNodePool for `wanted` goes to; VersionError otherwise."""
    master = cluster.current_master_version
    offered = {*config.valid_node_versions, master}
    if cluster.release_channel.channel != Channel.UNSPECIFIED:
        offered |= set(_own_master_versions(config, cluster))
        offered |= set(_newer_patches(config, cluster, _minor(master)))
    allowed = [v for v in offered if not versions.is_newer(v, master)]
    target = _resolve(wanted, allowed, default=master)
    if target is None:
        if wanted in offered and versions.is_newer(wanted, master):
            raise VersionError(
                f'Node version "{wanted}" must not be newer than the master version "{master}".'
            )
        raise VersionError(f'Node version "{wanted}" is unsupported.')
    return target


def check_node(cluster: Any, target: str) -> None:
    """The node rules (Autopilot, skew); VersionError on a break."""
    if cluster.autopilot.enabled:
        raise VersionError(
            "Node pool upgrades are managed by GKE on Autopilot clusters; upgrade the "
            "cluster's control plane instead."
        )
    master = cluster.current_master_version
    if _minor(master)[1] - _minor(target)[1] > _MAX_NODE_SKEW:
        raise VersionError(
            f'Node version "{target}" is more than {_MAX_NODE_SKEW} minor versions older than '
            f'the master version "{master}".'
        )
