"""Where runs meet: provider identity, holdings and the floors of other live runs (pure).

Invariants 1 (floor) and 2 (one owner) are decided by the engine from two facts about *other*
runs: which clusters they hold, and which floors bind clusters this run shares with them. Both
are computed here, from plain projections of ClusterUpgrades and UpdateRuns, by the UpdateRun
controller (orchestrator.controllers.updaterun) and by the simulation (tests/sim), so the simulation
checks the code that ships. Clusters are identified by (provider identity, cluster id) wherever runs
meet: a provider is what its plugin says it is (GetPluginInfo `fleet_id`), never how its address is
spelled.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator import api
from orchestrator.engine.decide import ACTIVE, Floor

__all__ = [
    "UNSEEN",
    "Holding",
    "RunNotSeen",
    "endpoint_identity",
    "holding_of",
    "neighbours",
    "pinned_provider",
    "provider_identity",
]

_ACTIVE = frozenset(p.value for p in ACTIVE)
#: Prefix of the fallback identity of a plugin that reports no fleet_id.
ENDPOINT_PREFIX = "endpoint/"
#: floor_of's answer for a run whose ClusterUpgrades the reader has but whose UpdateRun its
#: cache has not seen yet (the two watches have no order between them): its floor is unknown.
UNSEEN = -1


class RunNotSeen(Exception):
    """Another run shares clusters with this one, but the reader's run cache has not seen it
    yet, so its floor is unknown: nothing may be decided on this run until it has (invariant
    1; simulation seed 6959 with watch-cache lag: a floor of 26 of 27 was broken by a run that
    read the other run's ClusterUpgrades before its UpdateRun)."""

    def __init__(self, run: str) -> None:
        super().__init__(f"run {run} shares clusters with this one but is not in the cache yet")
        self.run = run


def endpoint_identity(endpoint: str) -> str:
    """The fallback identity of a plugin that reports no fleet_id: its endpoint as spelled,
    with only what cannot name another plugin normalised (case, surrounding space, a `dns:///`
    scheme). Two spellings of one such plugin are two providers: documented in
    docs/plugin-contract.md, "Provider identity", and the reason every plugin here reports one."""
    text = endpoint.strip().lower()
    for scheme in ("dns:///", "dns:"):
        if text.startswith(scheme):
            text = text[len(scheme) :]
            break
    return ENDPOINT_PREFIX + text


def provider_identity(plugin_name: str, fleet_id: str, endpoint: str) -> str:
    """What a provider is: the plugin's name and the fleet it acts on, when it says; else the
    endpoint fallback."""
    fleet_id = fleet_id.strip()
    if not fleet_id:
        return endpoint_identity(endpoint)
    return f"{plugin_name.strip()}/{fleet_id}"


@dataclass(frozen=True, slots=True)
class Holding:
    """One ClusterUpgrade as the runs that meet see it."""

    #: "namespace/name" of the UpdateRun the ClusterUpgrade belongs to.
    run: str
    #: The provider identity the cluster belongs to.
    provider: str
    cluster_id: str
    #: Its phase is one of the engine's ACTIVE phases: the run holds the cluster.
    active: bool
    #: It has an owner (its UpdateRun); an orphan (--cascade=orphan) is no live run's member.
    owned: bool = True


def pinned_provider(provider_id: str | None, endpoint: str, identities: Mapping[str, str]) -> str:
    """The provider identity a ClusterUpgrade belongs to: the one pinned in `spec.providerId`;
    for a ClusterUpgrade pinned before identities existed (only the endpoint, `spec.provider`),
    the identity that endpoint's plugin reported (identities: endpoint → identity, as learned
    from the plugins this controller reached), else the endpoint fallback."""
    return provider_id or identities.get(endpoint) or endpoint_identity(endpoint)


def holding_of(obj: Mapping[str, Any], identities: Mapping[str, str]) -> Holding:
    """A ClusterUpgrade object's Holding (read from the raw object: no parsing per pass)."""
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    provider = pinned_provider(spec.get("providerId"), str(spec.get("provider", "")), identities)
    run = (meta.get("labels") or {}).get(api.LABEL_RUN, "")
    return Holding(
        run=f"{meta['namespace']}/{run}",
        provider=provider,
        cluster_id=str(spec.get("clusterId", "")),
        active=(obj.get("status") or {}).get("phase") in _ACTIVE,
        owned=bool(meta.get("ownerReferences")),
    )


def neighbours(
    holdings: Iterable[Holding],
    floor_of: Callable[[str], int | None],
    provider: str,
    run: str,
    own: Collection[str],
) -> tuple[dict[str, str], list[Floor]]:
    """For run (on provider, with clusters own): the clusters other runs on the same provider
    hold (cluster id → "ns/run"; the least such run where several do), and the floors of the
    other live runs that share clusters with it.

    floor_of(run) is that run's requiredAvailableCount while it is live (api.run_is_live),
    None when it is finished or gone (a finished run's floor binds no one), UNSEEN when the
    reader has not seen the run yet: then RunNotSeen is raised, as nothing may be decided.
    """
    held: dict[str, str] = {}
    members: dict[str, set[str]] = {}
    for h in holdings:
        if h.run == run or h.provider != provider:
            continue
        if h.owned:
            members.setdefault(h.run, set()).add(h.cluster_id)
        if h.active:
            known = held.get(h.cluster_id)
            if known is None or h.run < known:
                held[h.cluster_id] = h.run
    floors: list[Floor] = []
    mine = set(own)
    for other, cids in sorted(members.items()):
        if cids.isdisjoint(mine):
            continue
        required = floor_of(other)
        if required == UNSEEN:
            raise RunNotSeen(other)
        if required is None:
            continue
        floors.append(Floor(other, frozenset(cids), required))
    return held, floors
