"""Pure rules for starting runs: pin a run's ClusterUpgrades, and a ClusterVersion's next run.

- `pin_upgrades` resolves an UpdateRun's targets and stages over the inventory once, at start,
  into one ClusterUpgrade per cluster with a deterministic name; later inventory changes cannot
  change what the run does (they show up as drift on the affected ClusterUpgrade).
- `run_for` turns a ClusterVersion into the UpdateRun it wants: the name carries a digest of the
  targets and strategy, so an unchanged ClusterVersion maps to the same run and any change to a
  new one (the previous run is then stopped by the ClusterVersion controller).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import api
from orchestrator.engine.decide import Upgrade, cluster_set_digest
from orchestrator.engine.observations import ClusterObs
from orchestrator.engine.validate import Problem, resolve_targets, validate_spec

__all__ = [
    "LIVE_FIELDS",
    "Pinned",
    "as_cluster_version_spec",
    "live_fields",
    "pin_upgrades",
    "run_for",
    "run_name",
    "superseded",
    "upgrade_name",
]


@dataclass(frozen=True)
class Pinned:
    """A run's pinned cluster set."""

    upgrades: list[Upgrade]
    digest: str
    stage_names: list[str]


def upgrade_name(run: str, cluster_id: str) -> str:
    """The deterministic ClusterUpgrade name of a cluster in a run (ids may hold '/')."""
    digest = hashlib.sha256(cluster_id.encode()).hexdigest()[:12]
    return f"{run[:240]}-{digest}"


def as_cluster_version_spec(spec: api.UpdateRunSpec) -> api.ClusterVersionSpec:
    """The ClusterVersion-shaped view of a run's targets (one validation serves both kinds)."""
    return api.ClusterVersionSpec(
        required_available_count=spec.required_available_count,
        ops_endpoint=spec.ops_endpoint,
        provider_ref=spec.provider_ref,
        provider_refs=spec.provider_refs,
        version=spec.version,
        clusters=spec.clusters,
        strategy=spec.strategy,
        health_checks=spec.health_checks,
        skip=spec.skip,
        retry=spec.retry,
    )


def pin_upgrades(
    run: str,
    spec: api.UpdateRunSpec,
    inventory: Mapping[str, ClusterObs],
    source: api.ClusterVersionSpec | None = None,
    provider: str | None = None,
    provider_id: str | None = None,
    provider_name: str | None = None,
) -> Pinned | list[Problem]:
    """One ClusterUpgrade per resolved cluster, or what is wrong with the spec.

    source: the ClusterVersion spec a ClusterVersion-created run is pinned from.
    provider: the plugin endpoint the run was allowed to use (orchestrator.engine.access), pinned in
    every ClusterUpgrade; default: spec.opsEndpoint's, else the providerRef's name.
    provider_id: what that plugin is (orchestrator.pipeline.crossrun.provider_identity), pinned
    beside it: clusters are (provider identity, cluster id) wherever runs meet.
    provider_name: the FleetProvider (spec.providerRef) the run reached it through, if any.
    A run over several providers is pinned by orchestrator.pipeline.multi.pin_across.
    """
    if provider is None:
        ref = spec.provider_ref.name if spec.provider_ref else "unresolved"
        provider = spec.ops_endpoint.endpoint if spec.ops_endpoint else f"providerRef:{ref}"
    cv_spec = source if source is not None else as_cluster_version_spec(spec)
    problems = validate_spec(cv_spec)
    if problems:
        return problems
    targets = resolve_targets(cv_spec, inventory)
    if isinstance(targets, list):
        return targets
    upgrades: list[Upgrade] = []
    for cid, target in sorted(targets.by_cluster.items()):
        pools = [api.NodePoolTarget(name=n, version=v) for n, v in sorted(target.pools.items())]
        upgrades.append(
            Upgrade(
                name=upgrade_name(run, cid),
                spec=api.ClusterUpgradeSpec(
                    cluster_id=cid,
                    stage=targets.stage_names[target.stage],
                    stage_index=target.stage,
                    version=target.version,
                    node_version=target.node_version,
                    node_pools=pools or None,
                    provider=provider,
                    provider_id=provider_id,
                    provider_name=provider_name,
                ),
                status=api.ClusterUpgradeStatus(),
            )
        )
    digest = cluster_set_digest(
        (u.cluster_id, u.spec.version, u.spec.node_version) for u in upgrades
    )
    return Pinned(upgrades, digest, list(targets.stage_names))


#: ClusterVersion fields that change the current run in place rather than start a new one.
LIVE_FIELDS = ("requiredAvailableCount", "skip", "retry", "notifications")


def _digest(cv: api.ClusterVersionSpec) -> str:
    """Digest of what a run pins: targets, stages, checks, provider (not floor, not paused)."""
    body = cv.dump()
    for key in LIVE_FIELDS:
        body.pop(key, None)
    body.get("strategy", {}).pop("paused", None)
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def run_name(cv_name: str, cv: api.ClusterVersionSpec) -> str:
    """The UpdateRun a ClusterVersion's spec maps to: same spec, same name."""
    return f"{cv_name[:240]}-{_digest(cv)}"


def run_for(
    cv_name: str, generation: int, cv: api.ClusterVersionSpec, timeouts: api.StepTimeouts | None
) -> tuple[str, api.UpdateRunSpec]:
    """The name and spec of the run a ClusterVersion wants now (its targets and strategy).

    The cluster list is not copied (the run stays small): the run is pinned from the
    ClusterVersion's spec when it starts, while `run_name(cv)` still equals the run's name.
    """
    spec = api.UpdateRunSpec(
        state=api.RunState.RUN,
        cluster_version_ref=api.ClusterVersionRef(name=cv_name, generation=generation),
        required_available_count=cv.required_available_count,
        ops_endpoint=cv.ops_endpoint,
        provider_ref=cv.provider_ref,
        provider_refs=cv.provider_refs,
        version=cv.version,
        clusters=None,
        strategy=cv.strategy,
        health_checks=cv.health_checks,
        timeouts=timeouts,
    )
    return run_name(cv_name, cv), spec


#: Run phases after which a ClusterVersion has nothing to stop: finished, or Invalid.
_NOTHING_TO_STOP = frozenset(p.value for p in (*api.FINISHED_PHASES, api.RunPhase.INVALID))


def superseded(runs: Iterable[tuple[str, str | None, str | None]], current: str) -> list[str]:
    """Supersede (the ClusterVersion → UpdateRun rule): of a ClusterVersion's runs, as (name,
    spec.state, status.phase), those to set to `state: Stop` now that it wants `current` (""
    for none: it is invalid): every other one not stopped already and not ended. The
    ClusterVersion controller and the simulation both call this."""
    return [
        name
        for name, state, phase in runs
        if name != current
        and state != api.RunState.STOP.value
        and (phase or "") not in _NOTHING_TO_STOP
    ]


def live_fields(run_spec: Mapping[str, Any], cv: api.ClusterVersionSpec) -> dict[str, Any]:
    """The current run's spec fields that follow its ClusterVersion in place (LIVE_FIELDS and
    strategy.paused), where they differ: key (camelCase, as stored) → the value wanted (None:
    unset). The ClusterVersion controller and the simulation both call this."""
    out: dict[str, Any] = {}
    if run_spec.get("requiredAvailableCount") != cv.required_available_count:
        out["requiredAvailableCount"] = cv.required_available_count
    paused = bool(cv.strategy and cv.strategy.paused)
    if bool((run_spec.get("strategy") or {}).get("paused")) != paused:
        out["strategy"] = {"paused": paused}
    # Only these (a ClusterVersion's whole spec lists its clusters: 0.9 ms to dump at 5,000).
    wanted = cv.dump({"skip", "retry", "notifications"})
    for key in ("skip", "retry", "notifications"):
        if run_spec.get(key) != wanted.get(key):
            out[key] = wanted.get(key)
    return out
