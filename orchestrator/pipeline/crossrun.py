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

import sys
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from orchestrator import api
from orchestrator.engine.decide import Floor
from orchestrator.engine.index import holds_cluster

__all__ = [
    "UNSEEN",
    "Holding",
    "HoldingIndex",
    "RunNotSeen",
    "endpoint_identity",
    "holding",
    "holding_of",
    "neighbours",
    "pinned_provider",
    "provider_identity",
]

K = TypeVar("K", bound=Hashable)
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
    #: The run holds the cluster (`engine.index.holds_cluster`: an ACTIVE phase, or an ended
    #: attempt that keeps its step).
    holds: bool
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
    status = obj.get("status") or {}
    owned = bool(meta.get("ownerReferences"))
    # One string for every holding of a run, of a provider (issue 21's memory: at 10,000
    # ClusterUpgrades a "namespace/run" each was 0.6 MiB).
    return holding(
        sys.intern(f"{meta['namespace']}/{run}"),
        sys.intern(provider),
        str(spec.get("clusterId", "")),
        status.get("phase"),
        status.get("step"),
        owned,
    )


def holding(
    run: str,
    provider: str,
    cluster_id: str,
    phase: str | None,
    step: str | None,
    owned: bool = True,
) -> Holding:
    """The Holding of a ClusterUpgrade of run with this status phase and step (the one place
    a holding is made: `holding_of` from a raw object, the simulation from its store)."""
    return Holding(run, provider, cluster_id, holds_cluster(phase, step, owned), owned)


def neighbours(
    holdings: Iterable[Holding],
    floor_of: Callable[[str], int | None],
    provider: str,
    run: str,
    own: Collection[str],
) -> tuple[dict[str, str], list[Floor]]:
    """For run (on provider, with clusters own): the clusters other runs on the same provider
    hold (cluster id → "ns/run"; the least such run where several do), and the floors of the
    other live runs that share clusters with it (`HoldingIndex.neighbours`, over holdings).

    floor_of(run) is that run's requiredAvailableCount while it is live (api.run_is_live),
    None when it is finished or gone (a finished run's floor binds no one), UNSEEN when the
    reader has not seen the run yet: then RunNotSeen is raised, as nothing may be decided.
    """
    return HoldingIndex.on(provider, holdings).neighbours(floor_of, provider, run, own)


def _count(counts: dict[str, int], key: str, by: int) -> bool:
    """Add by to counts[key] (dropped at 0); True when key appeared or disappeared."""
    n = counts.get(key, 0) + by
    if n:
        counts[key] = n
    else:
        del counts[key]
    return n in (by, 0)


class HoldingIndex(Generic[K]):
    """Holdings by key (one per ClusterUpgrade: the reader's key for it), with what
    `neighbours` reads of them kept beside, per change: a run's neighbours then cost what
    other runs hold and share with it, not a look at every ClusterUpgrade of every run. The
    rule is `neighbours` here, whether the index is kept (the UpdateRun controller, per cache
    change) or made at once from a list of holdings (the module function, the simulation)."""

    def __init__(self) -> None:
        self._by_key: dict[K, Holding] = {}
        #: provider → cluster id → run → how many of its ClusterUpgrades hold it (`Holding.holds`).
        self._held: dict[str, dict[str, dict[str, int]]] = {}
        #: provider → run → cluster id → how many of its owned ClusterUpgrades name it.
        self._members: dict[str, dict[str, dict[str, int]]] = {}
        #: run → provider → how many of its ClusterUpgrades belong to it (owned or not).
        self._providers: dict[str, dict[str, int]] = {}
        #: (provider, run) → its members as a Floor takes them, until they change.
        self._frozen: dict[tuple[str, str], frozenset[str]] = {}

    @staticmethod
    def on(provider: str, holdings: Iterable[Holding]) -> HoldingIndex[int]:
        """What `neighbours` reads of holdings on provider, at once (no key is recorded: for
        one question, as the module function and the simulation ask it)."""
        index: HoldingIndex[int] = HoldingIndex()
        for h in holdings:
            if h.provider == provider:
                index._add(h, 1)
        return index

    def get(self, key: K) -> Holding | None:
        """The holding recorded under key."""
        return self._by_key.get(key)

    def keys(self) -> set[K]:
        """The keys of the holdings recorded."""
        return set(self._by_key)

    def holdings(self) -> list[Holding]:
        """Every holding recorded."""
        return list(self._by_key.values())

    def providers_of(self, run: str) -> frozenset[str]:
        """The providers run's ClusterUpgrades belong to (`Holding.provider`)."""
        return frozenset(self._providers.get(run, ()))

    def put(self, key: K, holding: Holding | None) -> None:
        """Record the holding of key (None: key is gone)."""
        old = self._by_key.get(key)
        if old == holding:
            return
        if old is not None:
            self._add(old, -1)
            del self._by_key[key]
        if holding is not None:
            self._add(holding, 1)
            self._by_key[key] = holding

    def _add(self, h: Holding, by: int) -> None:
        providers = self._providers.setdefault(h.run, {})
        _count(providers, h.provider, by)
        if not providers:
            del self._providers[h.run]
        if h.owned:
            runs = self._members.setdefault(h.provider, {})
            cids = runs.setdefault(h.run, {})
            if _count(cids, h.cluster_id, by):
                self._frozen.pop((h.provider, h.run), None)
            if not cids:
                del runs[h.run]
            if not runs:
                del self._members[h.provider]
        if h.holds:
            held = self._held.setdefault(h.provider, {})
            holders = held.setdefault(h.cluster_id, {})
            _count(holders, h.run, by)
            if not holders:
                del held[h.cluster_id]
            if not held:
                del self._held[h.provider]

    def neighbours(
        self,
        floor_of: Callable[[str], int | None],
        provider: str,
        run: str,
        own: Collection[str],
    ) -> tuple[dict[str, str], list[Floor]]:
        """`neighbours` (the module function) over the holdings recorded here."""
        held: dict[str, str] = {}
        for cid, holders in self._held.get(provider, {}).items():
            others = [r for r in holders if r != run]
            if others:
                held[cid] = min(others)
        floors: list[Floor] = []
        runs = self._members.get(provider, {})
        for other in sorted(runs):
            if other == run:
                continue
            cids = self._frozen.get((provider, other))
            if cids is None:
                cids = self._frozen[(provider, other)] = frozenset(runs[other])
            if cids.isdisjoint(own):
                continue
            required = floor_of(other)
            if required == UNSEEN:
                raise RunNotSeen(other)
            if required is None:
                continue
            floors.append(Floor(other, cids, required))
        return held, floors

    def differences(self, other: HoldingIndex[K]) -> list[str]:
        """What of this index differs from other (empty: they agree), by part."""
        parts = ("_by_key", "_held", "_members", "_providers")
        found = [p.strip("_") for p in parts if getattr(self, p) != getattr(other, p)]
        for (provider, run), cids in self._frozen.items():
            if set(cids) != set(self._members.get(provider, {}).get(run, {})):
                found.append(f"members of {run} on {provider}")
        return found
