"""The UpdateRun controller's view of the ClusterUpgrade cache, kept per change, not per pass.

A reconcile used to look at every ClusterUpgrade it had: each of its run's (parsed, finalizer,
being deleted, in flight, the phases the metrics count) and every run's (the holdings and the
members other runs' floors read, orchestrator.pipeline.crossrun). Here all of that is kept per
ClusterUpgrade and brought up to date for those the cache says changed (`ObjectCache.follow`):
a reconcile costs what changed since the last one. Every FULL_EVERY syncs it is also made from
scratch and compared: a difference is a bug, logged as one, and the fresh state is kept.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from orchestrator import api
from orchestrator.adapters.cache import ObjectCache
from orchestrator.engine.decide import ACTIVE, Upgrade
from orchestrator.engine.index import holds_cluster
from orchestrator.pipeline import deletion
from orchestrator.pipeline.crossrun import HoldingIndex, holding_of

__all__ = ["FULL_EVERY", "NOT_STARTED", "Children", "KeptUpgrades", "parse_status"]

log = logging.getLogger(__name__)
#: Every this many syncs, the kept state is also made from scratch and compared.
FULL_EVERY = 200
Key = tuple[str, str]


#: A ClusterUpgrade object as the engine's Upgrade, given its spec as parsed before when that
#: has not changed (None: parse it too).
Parse = Callable[[Mapping[str, Any], api.ClusterUpgradeSpec | None], Upgrade]

#: The status of a ClusterUpgrade with none written (not started): one model for all of them
#: (models are frozen), not ~550 bytes each (issue 21: at 10,000 clusters, ~8,000 of them
#: when the first wave is up to date).
NOT_STARTED = api.ClusterUpgradeStatus()


#: How many distinct statuses `parse_status` keeps one model of (`_status_of`).
_STATUSES_MAX = 1024


def parse_status(status: Mapping[str, Any]) -> api.ClusterUpgradeStatus:
    """A ClusterUpgrade's status as stored, parsed (NOT_STARTED, shared, when empty; one
    model for equal statuses, `_status_of`); raises pydantic's ValidationError when it does
    not parse."""
    if not status:
        return NOT_STARTED
    try:
        key = orjson.dumps(status, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON orjson writes (an integer past 64 bits): parsed, not shared
        return api.ClusterUpgradeStatus.model_validate(status)
    return _status_of(key)


@functools.lru_cache(maxsize=_STATUSES_MAX)
def _status_of(key: bytes) -> api.ClusterUpgradeStatus:
    """The status of this JSON (sorted keys), one model for equal statuses (models are frozen).
    Every ClusterUpgrade the apiserver makes has `{"phase": "Pending"}` (the CRD's default)
    until it is first written: at 10,000 clusters, 8,000 equal models of ~520 bytes each when
    the first wave is up (issue 21). What does not parse is not remembered (lru_cache keeps no
    exception)."""
    return api.ClusterUpgradeStatus.model_validate(orjson.loads(key))


def _rv(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _same_spec(before: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> bool:
    """obj is the object before was (its uid: not one deleted and made again under its name)
    at the same spec (its generation: with the status subresource, only a spec change moves
    it)."""
    if before is None:
        return False
    old, new = before["metadata"], obj["metadata"]
    uid, gen = new.get("uid"), new.get("generation")
    return bool(uid and gen) and old.get("uid") == uid and old.get("generation") == gen


@dataclass
class Children:
    """One run's ClusterUpgrades as the cache has them (by name), with what a pass reads of
    each kept beside it."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Parsed, again only when the object's resourceVersion moves.
    upgrades: dict[str, Upgrade] = field(default_factory=dict)
    #: The resourceVersion each of upgrades was parsed from.
    parsed_at: dict[str, str] = field(default_factory=dict)
    #: Cluster id → its pinned spec.providerId ("" where none is pinned).
    own: dict[str, str] = field(default_factory=dict)
    #: Cluster id → the name of the ClusterUpgrade naming it, or, when several do (made by
    #: hand), their names with each one's providerId; `own` has the least name's. (One name,
    #: not a dict each: ~200 bytes a cluster at 10,000, issue 21.)
    own_by: dict[str, str | dict[str, str]] = field(default_factory=dict)
    #: The steps in flight (an ACTIVE phase with a request id): (request id, operation id,
    #: cluster id) by name, as GrpcProvider.learn takes them; a chain of node pools
    #: (status.nextRequestIds) adds one for each pool after the first, by "name/request id".
    steps: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    #: Those being deleted (a ClusterUpgrade deleted alone): name → cluster id.
    deleting: dict[str, str] = field(default_factory=dict)
    #: Those without the finalizer and not being deleted (it is added: UpdateRunController._hold).
    unfinalized: set[str] = field(default_factory=set)
    #: status.phase as stored ("Pending" where none): the metrics' count per phase.
    phases: Counter[str | None] = field(default_factory=Counter)
    #: Those that hold their cluster (engine.index.holds_cluster: active, or an ended attempt
    #: that keeps it): a run with any does not rest, whatever its phase says (decide.rests).
    holding: set[str] = field(default_factory=set)
    #: The names put or dropped since the driver last took them (`take_changed`); None until
    #: then (made afresh: every object is new to the driver's index).
    touched: set[str] | None = None

    def put(
        self,
        name: str,
        obj: dict[str, Any],
        parse: Parse,
        known: Children | None = None,
    ) -> None:
        """Record obj as name's object, in its place (the order of names stays, as the driver's
        RunIndex reads it); parsed again only when its resourceVersion is not the one known's
        parse came from (known: self by default), and then with the spec parsed before when
        the object's spec has not changed since (`_same_spec`: issue 21's memory, one spec
        model per ClusterUpgrade across its status changes)."""
        known = self if known is None else known
        if self.touched is not None:
            self.touched.add(name)
        rv = _rv(obj)
        if known.parsed_at.get(name) == rv:
            upgrade = known.upgrades[name]
        else:
            before = known.objects.get(name)
            spec = known.upgrades[name].spec if _same_spec(before, obj) else None
            upgrade = parse(obj, spec)
        if name in self.objects:
            self._unindex(name)
        self.objects[name] = obj
        self.upgrades[name] = upgrade
        self.parsed_at[name] = rv
        cid = upgrade.cluster_id
        self._own(cid, name, upgrade.spec.provider_id or "")
        st = upgrade.status
        if st.phase in ACTIVE and st.request_id:
            self.steps[name] = (st.request_id, st.operation_id or "", cid)
            for rid in st.next_request_ids or ():
                self.steps[f"{name}/{rid}"] = (rid, "", cid)
        if holds_cluster(st.phase, st.step):
            self.holding.add(name)
        if deletion.deleting(obj):
            self.deleting[name] = cid
        elif not deletion.has_finalizer(obj):
            self.unfinalized.add(name)
        self.phases[(obj.get("status") or {}).get("phase", "Pending")] += 1

    def drop(self, name: str) -> None:
        """Forget name's object (no-op when it is not here)."""
        if name not in self.objects:
            return
        if self.touched is not None:
            self.touched.add(name)
        self._unindex(name)
        del self.objects[name], self.upgrades[name], self.parsed_at[name]

    def _unindex(self, name: str) -> None:
        """Take name's object out of everything kept beside it."""
        obj, upgrade = self.objects[name], self.upgrades[name]
        self._disown(upgrade.cluster_id, name)
        if self.steps.pop(name, None) is not None:
            for rid in upgrade.status.next_request_ids or ():
                self.steps.pop(f"{name}/{rid}", None)
        self.holding.discard(name)
        self.deleting.pop(name, None)
        self.unfinalized.discard(name)
        phase = (obj.get("status") or {}).get("phase", "Pending")
        self.phases[phase] -= 1
        if not self.phases[phase]:
            del self.phases[phase]

    def _own(self, cid: str, name: str, provider: str) -> None:
        """name's ClusterUpgrade names cid, pinned to provider (not already recorded)."""
        names = self.own_by.get(cid)
        if names is None:
            self.own_by[cid], self.own[cid] = name, provider
            return
        if isinstance(names, str):
            names = self.own_by[cid] = {names: self.own[cid]}
        names[name] = provider
        self.own[cid] = names[min(names)]

    def _disown(self, cid: str, name: str) -> None:
        """name's ClusterUpgrade no longer names cid."""
        names = self.own_by[cid]
        if isinstance(names, str):
            del self.own_by[cid], self.own[cid]
            return
        del names[name]
        least = min(names)
        self.own[cid] = names[least]
        if len(names) == 1:
            self.own_by[cid] = least

    def take_changed(self) -> frozenset[str] | None:
        """The names whose objects may differ from those the driver was handed last time
        (RunDriver.step's `changed`), and from now on a fresh account; None: not known (these
        Children were made afresh since), so the driver's index compares every object."""
        out = None if self.touched is None else frozenset(self.touched)
        self.touched = set()
        return out

    def differences(self, other: Children) -> list[str]:
        """What of this differs from other (empty: they agree), by part."""
        found = [
            part
            for part in (
                "parsed_at",
                "own",
                "own_by",
                "steps",
                "holding",
                "deleting",
                "unfinalized",
            )
            if getattr(self, part) != getattr(other, part)
        ]
        if self.phases != other.phases:
            found.append("phases")
        if self.objects.keys() != other.objects.keys() or any(
            o is not other.objects[n] for n, o in self.objects.items()
        ):
            found.append("objects")
        if self.upgrades.keys() != other.upgrades.keys():
            found.append("upgrades")
        return found


class KeptUpgrades:
    """The ClusterUpgrade cache as the UpdateRun controller reads it: every ClusterUpgrade's
    crossrun Holding (`holdings`) and, for each run asked about, its `Children`; brought up to
    date by `sync` from the keys the cache says changed. One reader at a time (the reconcile
    loop)."""

    def __init__(
        self,
        cache: ObjectCache,
        identities: Callable[[], dict[str, str]],
        parse: Parse,
    ) -> None:
        """identities: endpoint → provider identity, as learned (crossrun.holding_of reads
        it); parse: a ClusterUpgrade object as the engine's Upgrade."""
        self._cache = cache
        self._take = cache.follow()
        self._identities_of = identities
        self._parse = parse
        self._identities: dict[str, str] = {}
        self.holdings: HoldingIndex[Key] = HoldingIndex()
        #: "namespace/run" → its Children, for the runs asked about.
        self._runs: dict[str, Children] = {}
        #: Key of a ClusterUpgrade → the run whose Children have it.
        self._where: dict[Key, str] = {}
        self.syncs = 0

    def sync(self) -> None:
        """Bring everything up to date with the cache; every FULL_EVERY calls, also compare
        with a state made from scratch."""
        identities = self._identities_of()
        keys = self._take()
        if keys is None or identities != self._identities:
            # Everything: a re-list, or a plugin's identity learned (holdings spell it).
            self._identities = identities
            keys = self._everything()
        for key in keys:
            self._update(key)
        self.syncs += 1
        if self.syncs % FULL_EVERY == 0:
            self.check()

    def _update(self, key: Key) -> None:
        obj = self._cache.get(*key)
        holding = holding_of(obj, self._identities) if obj is not None else None
        self.holdings.put(key, holding)
        was = self._where.get(key)
        now = holding.run if holding is not None else None
        if was is not None and was != now:
            self._runs[was].drop(key[1])
            del self._where[key]
        if obj is not None and now is not None:
            kept = self._runs.get(now)
            if kept is not None:
                kept.put(key[1], obj, self._parse)
                self._where[key] = now

    def children(self, namespace: str, run: str) -> Children:
        """The run's Children (made from the cache the first time it is asked about)."""
        at = f"{namespace}/{run}"
        kept = self._runs.get(at)
        if kept is None:
            kept = self._runs[at] = Children()
            for obj in self._cache.by_label(namespace, run):
                key = _key(obj)
                was = self._where.get(key)
                if was is not None:  # relabelled since the last sync: here now, not there
                    self._runs[was].drop(key[1])
                kept.put(key[1], obj, self._parse)
                self._where[key] = at
        return kept

    def forget(self, namespace: str, run: str) -> None:
        """Drop a run's Children (the run is gone); its holdings stay while its objects do."""
        at = f"{namespace}/{run}"
        kept = self._runs.pop(at, None)
        if kept is not None:
            for name in kept.objects:
                self._where.pop((namespace, name), None)

    def check(self) -> list[str]:
        """Make the state from scratch and compare; where it differs (a bug), log it and keep
        the fresh state. Returns the differences (none when the cache moved meanwhile: the
        comparison is left to the next time)."""
        objs = self._cache.items()
        found = self._compare(objs)
        moved = self._take()
        if moved is None or moved:
            # The cache changed while it was read: not one state to compare against.
            self._take_back(moved)
            return []
        if found:
            log.error(
                "the kept ClusterUpgrade state disagreed with one made from scratch (%s); "
                "the fresh one is kept",
                ", ".join(found),
            )
            self.holdings, self._runs, self._where = self._fresh(objs)
        return found

    def _compare(self, objs: list[dict[str, Any]]) -> list[str]:
        """What of the kept state differs from one made from scratch of objs (empty: they
        agree), made and compared one part at a time, the holdings, then each run's Children:
        no more than one part's fresh copy is alive at once (issue 21's memory: the whole
        fresh state was ~5 MiB at 10,000 ClusterUpgrades, every FULL_EVERY syncs)."""
        fresh: HoldingIndex[Key] = HoldingIndex()
        of_run: dict[str, list[dict[str, Any]]] = {at: [] for at in self._runs}
        for obj in objs:
            holding = holding_of(obj, self._identities)
            fresh.put(_key(obj), holding)
            mine = of_run.get(holding.run)
            if mine is not None:
                mine.append(obj)
        found = [f"holdings: {d}" for d in self.holdings.differences(fresh)]
        del fresh
        # `_where` made afresh is every asked run's objects' keys: it agrees when each of
        # those is there under its run and it has no other.
        placed = 0
        for at, kept in self._runs.items():
            one = Children()
            for obj in of_run[at]:
                key = _key(obj)
                one.put(key[1], obj, self._parse, kept)
                placed += self._where.get(key) == at
            found += [f"run {at}: {d}" for d in kept.differences(one)]
        if placed != len(self._where) or placed != sum(map(len, of_run.values())):
            found.append("where")
        return found

    def _fresh(
        self, objs: list[dict[str, Any]]
    ) -> tuple[HoldingIndex[Key], dict[str, Children], dict[Key, str]]:
        """The state made from scratch of objs: holdings, the asked runs' Children, where."""
        fresh: HoldingIndex[Key] = HoldingIndex()
        runs = {at: Children() for at in self._runs}
        where: dict[Key, str] = {}
        for obj in objs:
            key = _key(obj)
            holding = holding_of(obj, self._identities)
            fresh.put(key, holding)
            kept = runs.get(holding.run)
            if kept is not None:
                kept.put(key[1], obj, self._parse, self._runs[holding.run])
                where[key] = holding.run
        return fresh, runs, where

    def _everything(self) -> set[Key]:
        """Every key known here or cached."""
        return self.holdings.keys() | set(self._where) | {_key(o) for o in self._cache.items()}

    def _take_back(self, keys: set[Key] | None) -> None:
        """Apply changes taken out of turn (check's look at the cache)."""
        for key in self._everything() if keys is None else keys:
            self._update(key)


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])
