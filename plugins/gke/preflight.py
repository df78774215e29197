"""PreflightUpgrade for GKE: whether an upgrade to the given versions would be accepted now,
never (GetServerConfig, GKE's skew and downgrade rules, Autopilot node pools), or later (an
operation runs on the cluster; the opt-in maintenance-exclusion policy), without calling any
mutating GKE method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from google.cloud import container_v1

from fleetupgrade.plugin.v1 import cluster_pb2
from plugins.gke.operations import Mirrored
from plugins.gke.policy import (
    BlueGreenPlan,
    Refusal,
    autopilot_refusal,
    blue_green_plan,
    check_control_plane,
    check_node_pool,
    exclusion_refusal,
    is_autopilot,
    resolve_control_plane,
    resolve_node_pool,
)
from plugins.sdk import (
    InvalidArgument,
    NotFound,
    Reason,
    accepted,
    parse_version,
    refused_later,
    verdict_of,
)

__all__ = [
    "BLUE_GREEN_UPGRADE",
    "BUSY_RETRY_SECONDS",
    "blue_green_notice",
    "busy_verdict",
    "judge",
    "verdict",
]

BLUE_GREEN_UPGRADE = "BLUE_GREEN_UPGRADE"
"""reason_code of an ACCEPTED answer that carries a notice: a node pool to upgrade is blue-green,
so its step lasts at least its soak (the contract requires reason and message only for refusals;
on ACCEPTED they inform and change nothing)."""

BUSY_RETRY_SECONDS = 60
"""Asking again after this long may help when an operation runs (GKE gives no end estimate)."""


def verdict(refusal: Refusal | None) -> cluster_pb2.PreflightUpgradeResponse:
    """The response for a refusal (None: ACCEPTED); retryable refusals are REFUSED_LATER."""
    return accepted() if refusal is None else verdict_of(refusal)


def busy_verdict(
    cluster_id: str, running: Sequence[Mirrored]
) -> cluster_pb2.PreflightUpgradeResponse | None:
    """REFUSED_LATER naming every operation running on the cluster (GKE runs one cluster
    operation at a time and answers others "Cluster is running incompatible operation")."""
    if not running:
        return None
    names = "; ".join(f"{info.op_id} ({info.what})" for info in running)
    return refused_later(
        Reason.CLUSTER_BUSY,
        f"cluster {cluster_id} has GKE operation(s) in flight: {names}; GKE refuses another "
        "until they end",
        BUSY_RETRY_SECONDS,
    )


def judge(
    cluster_id: str,
    cluster: container_v1.Cluster,
    config: container_v1.ServerConfig,
    location: str,
    control_plane_version: str,
    node_pool_versions: Mapping[str, str],
    *,
    respect_exclusions: bool,
    now: datetime | None = None,
    changing: list[str] | None = None,
) -> Refusal | None:
    """The first refusal GKE's rules give for the upgrade, never-refusals before later ones;
    None when it would be accepted. Aliases are resolved (one that matches nothing is
    VERSION_NOT_OFFERED naming the field and the valid versions; NotFound for an unknown pool).
    Node pools are judged against the target control plane, as it is upgraded first, or the
    current one when no control-plane target is given (pools only). changing, when given,
    receives the names of the pools the upgrade would change (their resolved target differs
    from what they run)."""
    try:
        return _judge(
            cluster_id,
            cluster,
            config,
            location,
            control_plane_version,
            node_pool_versions,
            respect_exclusions=respect_exclusions,
            now=now,
            changing=changing if changing is not None else [],
        )
    except InvalidArgument as exc:
        # An alias that matches no version GKE offers: never accepted as asked (an upgrade RPC
        # answers it INVALID_ARGUMENT, as GKE does; a verdict is more use to a preflight).
        return Refusal(exc.message, reason=Reason.VERSION_NOT_OFFERED)


def _judge(
    cluster_id: str,
    cluster: container_v1.Cluster,
    config: container_v1.ServerConfig,
    location: str,
    control_plane_version: str,
    node_pool_versions: Mapping[str, str],
    *,
    respect_exclusions: bool,
    now: datetime | None,
    changing: list[str],
) -> Refusal | None:
    current = cluster.current_master_version
    master = current
    minor = False
    if control_plane_version:
        master = resolve_control_plane(
            cluster, config, control_plane_version, field="control_plane_version"
        )
        if master != current:
            try:
                check_control_plane(cluster_id, cluster, master, config, location)
            except Refusal as refusal:
                return refusal
            minor = parse_version(master)[:2] != parse_version(current)[:2]
    nodes = False
    pools = {pool.name: pool for pool in cluster.node_pools}
    for name in sorted(node_pool_versions):
        field = f"node_pool_versions[{name}]"
        if is_autopilot(cluster):
            return autopilot_refusal(cluster_id, field)
        pool = pools.get(name)
        if pool is None:
            raise NotFound(
                f"{field}: cluster {cluster_id} has no node pool {name!r}; its pools: "
                f"{', '.join(sorted(pools)) or 'none'}",
                reason=Reason.NODE_POOL_NOT_FOUND,
            )
        wanted = resolve_node_pool(cluster, config, node_pool_versions[name], master, field)
        if wanted == pool.version:
            continue
        try:
            check_node_pool(cluster_id, cluster, pool, wanted, config, location, master)
        except Refusal as refusal:
            return refusal
        changing.append(name)
        nodes = True
        minor = minor or parse_version(wanted)[:2] != parse_version(pool.version)[:2]
    if respect_exclusions and (master != current or nodes):
        return exclusion_refusal(cluster_id, cluster, minor=minor, node=nodes, now=now)
    return None


def _span(seconds: int) -> str:
    """A duration for people: 1h30m, 45m, 20s, 0s."""
    hours, rest = divmod(max(0, seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    text += f"{secs}s" if secs or not text else ""
    return text


def _plan_text(name: str, plan: BlueGreenPlan) -> str:
    pool_soak = f"nodePoolSoakDuration {_span(plan.pool_soak)}"
    if plan.pool_soak_defaulted:
        pool_soak += " (unset: GKE's default)"
    return (
        f"node pool {name} upgrades BLUE_GREEN: at least {_span(plan.soak)} of soak "
        f"({plan.batches} batch(es) of its {plan.nodes} node(s) x batchSoakDuration "
        f"{_span(plan.batch_soak)} + {pool_soak}), plus creating the green nodes and draining "
        "the blue ones, all in one UPGRADE_NODES operation"
    )


def blue_green_notice(
    cluster_id: str, cluster: container_v1.Cluster, pools: Sequence[str]
) -> cluster_pb2.PreflightUpgradeResponse | None:
    """ACCEPTED with a notice (reason BLUE_GREEN_UPGRADE) when a pool the upgrade would change
    upgrades blue-green: its expected soak from the batch and soak settings (policy.
    blue_green_plan), and that the node-pool step timeout includes it (the plugin reports the
    soak as the pool's upgrade_soak_seconds, and the orchestrator adds it to the pool's
    timeouts.nodePool). None when no such pool changes."""
    by_name = {pool.name: pool for pool in cluster.node_pools}
    notes = []
    total = 0
    for name in pools:
        plan = blue_green_plan(by_name[name]) if name in by_name else None
        if plan is not None:
            notes.append(_plan_text(name, plan))
            total = max(total, plan.soak)
    if not notes:
        return None
    return cluster_pb2.PreflightUpgradeResponse(
        verdict=cluster_pb2.PREFLIGHT_VERDICT_ACCEPTED,
        reason_code=BLUE_GREEN_UPGRADE,
        message=(
            f"cluster {cluster_id}: accepted; {'; '.join(notes)}. The orchestrator adds each "
            "pool's soak to its node-pool step timeout (timeouts.nodePool + the soak, here "
            f"up to + {_span(total)}), so the step is not failed as hung while GKE soaks; "
            "timeouts.nodePool itself must still cover creating and draining the nodes"
        ),
    )
