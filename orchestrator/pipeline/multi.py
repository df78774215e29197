"""Runs over several providers (spec.providerRefs): one driver `Provider` over several members.

A run may span the clusters of several FleetProviders (GKE, EKS, AKS, OCM...) under one
`requiredAvailableCount`. Everything here is pure (no I/O): the UpdateRun controller
(orchestrator.controllers.updaterun) builds it over gRPC providers, the simulation (tests/sim)
over its model providers, so the simulation checks the class that ships.

The rules, each with one home here:

- **Cluster ids.** A multi-provider run spells a cluster by the id its provider reports,
  unchanged (so ClusterUpgrade names, `spec.clusters[].id`, stage lists, skip and retry lists
  mean what they mean in a one-provider run). An id reported by two of the run's providers
  is ambiguous: the run is refused when it is pinned (`union_inventory`), naming the id and
  both FleetProviders. Once pinned, a cluster is reached only through the member it was pinned
  on (its ClusterUpgrade's providerId and providerName: `route`), whatever the others report.
- **Labels.** Every cluster of the union inventory carries `multicluster-ops.io/provider:
  <FleetProvider name>` (api.LABEL_PROVIDER), so stages select by provider and labels.
- **Identity.** Each ClusterUpgrade records its member's endpoint, identity and FleetProvider
  name (`pin_across`); holdings and floors across runs meet on (identity, cluster id)
  (`neighbours_across`); a member that now points at another provider refuses the run (`route`).
- **A member down.** Its clusters are `Snapshot.unknown` (absent from the inventory: counted as
  unavailable by every floor, never taken for gone; nothing is decided on them); the others go
  on where the floor allows. `MultiProvider.down` names the FleetProviders that did not answer
  (the run's Degraded condition).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import TypeVar

from orchestrator import api
from orchestrator.engine.decide import Call, Floor, Preflight, Verdict
from orchestrator.engine.initialize import Pinned, pin_upgrades
from orchestrator.engine.observations import ClusterObs, OpObs, Snapshot
from orchestrator.engine.validate import Problem
from orchestrator.pipeline.crossrun import Holding, neighbours
from orchestrator.pipeline.driver import (
    CallError,
    Provider,
    Question,
    StartsBatches,
    StartsRequests,
)

__all__ = [
    "FIELD",
    "Member",
    "MultiProvider",
    "StartingMultiProvider",
    "degraded_message",
    "labelled",
    "named",
    "neighbours_across",
    "pin_across",
    "route",
    "union_inventory",
]

#: The spec field every problem of a multi-provider run names.
FIELD = "spec.providerRefs"

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Member:
    """One FleetProvider of a run over several: its name, how it is reached, what it is."""

    #: The FleetProvider's name (as listed in spec.providerRefs).
    name: str
    #: The plugin endpoint it declares (recorded as ClusterUpgrade spec.provider).
    endpoint: str
    #: What its plugin says it is (crossrun.provider_identity): spec.providerId.
    identity: str
    provider: Provider


def labelled(obs: ClusterObs, name: str) -> ClusterObs:
    """The cluster as a multi-provider run sees it: labelled with its FleetProvider's name."""
    if obs.labels.get(api.LABEL_PROVIDER) == name:
        return obs
    return replace(obs, labels={**obs.labels, api.LABEL_PROVIDER: name})


def union_inventory(
    inventories: Mapping[str, Mapping[str, ClusterObs]],
) -> dict[str, tuple[str, ClusterObs]] | list[Problem]:
    """Every member's inventory as one (cluster id → (FleetProvider name, labelled cluster)),
    or one Problem per id two members report (it names both, and the fix)."""
    out: dict[str, tuple[str, ClusterObs]] = {}
    problems: list[Problem] = []
    for name in sorted(inventories):
        for cid, obs in sorted(inventories[name].items()):
            known = out.get(cid)
            if known is not None:
                problems.append(
                    Problem(
                        FIELD,
                        f"cluster id {cid} is reported by both FleetProvider {known[0]} and "
                        f"FleetProvider {name}: in a run over several providers an id must name "
                        "one cluster; upgrade these providers' clusters in separate runs (one "
                        "providerRef each), or remove one of them from providerRefs",
                    )
                )
                continue
            out[cid] = (name, labelled(obs, name))
    return problems or out


def pin_across(
    run: str,
    spec: api.UpdateRunSpec,
    members: Sequence[Member],
    inventories: Mapping[str, Mapping[str, ClusterObs]],
    source: api.ClusterVersionSpec | None = None,
) -> Pinned | list[Problem]:
    """`initialize.pin_upgrades` over the union of the members' inventories; each
    ClusterUpgrade records the member it belongs to (endpoint, identity, FleetProvider name)."""
    union = union_inventory(inventories)
    if isinstance(union, list):
        return union
    pinned = pin_upgrades(
        run, spec, {cid: obs for cid, (_, obs) in union.items()}, source, provider=FIELD
    )
    if isinstance(pinned, list):
        return pinned
    by_name = {m.name: m for m in members}
    upgrades = []
    for u in pinned.upgrades:
        m = by_name[union[u.cluster_id][0]]
        spec_ = u.spec.model_copy(
            update={"provider": m.endpoint, "provider_id": m.identity, "provider_name": m.name}
        )
        upgrades.append(replace(u, spec=spec_))
    return Pinned(upgrades, pinned.digest, pinned.stage_names)


def route(
    pins: Iterable[tuple[str, str, str | None]], members: Sequence[Member]
) -> dict[str, str] | Problem:
    """Cluster id → the FleetProvider name it is reached through, from what each
    ClusterUpgrade pinned: (cluster id, providerId, providerName). A Problem when a cluster's
    FleetProvider left spec.providerRefs or now points at another provider (its clusters were
    pinned there: reaching them elsewhere would act on other clusters)."""
    by_name = {m.name: m for m in members}
    out: dict[str, str] = {}
    for cid, identity, name in sorted(pins, key=lambda p: p[0]):
        m = by_name.get(name or "")
        if m is None:
            return Problem(
                FIELD,
                f"cluster {cid} was pinned on FleetProvider {name or '(none)'} (provider "
                f"{identity}), which is no longer in spec.providerRefs; list it again, or stop "
                "this run and start a new one",
            )
        if m.identity != identity:
            return Problem(
                FIELD,
                f"cluster {cid} was pinned on provider {identity} but FleetProvider {m.name} now "
                f"points at {m.endpoint} (provider {m.identity}); point it back, or stop this "
                "run and start a new one",
            )
        out[cid] = m.name
    return out


def neighbours_across(
    holdings: Sequence[Holding],
    floor_of: Callable[[str], int | None],
    own: Mapping[str, str],
    run: str,
) -> tuple[dict[str, str], list[Floor], dict[str, str]]:
    """`crossrun.neighbours` for a run over several providers, keyed by (identity, cluster id).

    own: this run's clusters, cluster id → provider identity. Returns the clusters of this run
    other runs hold (cluster id → run), the floors of the other live runs sharing clusters with
    it (over their members on this run's providers), and the cluster id → identity of those
    members this run must observe too (its own are not repeated).

    Every holding on one of this run's providers is spelled as the one snapshot spells it, and
    `crossrun.neighbours` decides on the spelled keys (its rule, one home): this run's clusters
    by their ids; another's by its id when that id names one cluster here, else under a
    spelling no provider reports, so it counts as down. Conservative by construction
    (invariant 1): another run's members on a provider this run does not use cannot be
    observed, so they are left out of its floor, which then requires its whole count of the
    members that are observed (as if the others were down).
    """
    observed = set(own.values())
    seen = [h for h in holdings if h.provider in observed]
    claims: dict[str, set[str]] = {}
    for h in seen:
        claims.setdefault(h.cluster_id, set()).add(h.provider)

    def spelled(identity: str, cid: str) -> str:
        if own.get(cid) == identity:
            return cid
        if cid not in own and claims[cid] == {identity}:
            return cid
        return f"{identity}|{cid}"  # not this snapshot's to tell apart: never observed, down

    merged = [replace(h, provider="*", cluster_id=spelled(h.provider, h.cluster_id)) for h in seen]
    held, floors = neighbours(merged, floor_of, "*", run, set(own))
    extra = {
        h.cluster_id: h.provider
        for h in seen
        if h.cluster_id not in own
        and spelled(h.provider, h.cluster_id) == h.cluster_id
        and any(h.cluster_id in f.members for f in floors)
    }
    return held, floors, extra


def degraded_message(down: Mapping[str, str]) -> str:
    """The run's Degraded message when members did not answer (the FleetProviders named)."""
    names = ", ".join(f"FleetProvider {n} ({why})" for n, why in sorted(down.items()))
    return (
        f"unavailable: {names}; its clusters count as unavailable for "
        "requiredAvailableCount and none of them is acted on until it answers; the other "
        "providers' clusters go on where the floor allows"
    )


@dataclass
class MultiProvider:
    """The driver's `Provider` over a run's members: the union of their inventories (each
    cluster labelled with its FleetProvider), every call routed to the cluster's member."""

    members: Sequence[Member]
    #: Cluster id → FleetProvider name (`route`, plus `neighbours_across`'s extra members).
    routes: Mapping[str, str]
    #: Stamps the answer given for a member that declares no PreflightUpgrade.
    clock: Callable[[], datetime]
    #: FleetProvider name → why its last snapshot failed (this pass).
    down: dict[str, str] = field(default_factory=dict)

    @classmethod
    def over(
        cls, members: Sequence[Member], routes: Mapping[str, str], clock: Callable[[], datetime]
    ) -> MultiProvider:
        """The view over these members: a StartingMultiProvider when every member starts its
        requests (driver.StartsRequests), so the driver starts a pass's from its thread and
        batches each member's calls; else this class, whose calls block a worker each."""
        if all(isinstance(m.provider, StartsRequests) for m in members):
            return StartingMultiProvider(members, routes, clock)
        return cls(members, routes, clock)

    def _routed(self, cluster_id: str) -> Member | None:
        name = self.routes.get(cluster_id)
        return next((m for m in self.members if m.name == name), None)

    def _member(self, cluster_id: str) -> Member:
        m = self._routed(cluster_id)
        if m is None:
            raise CallError(
                "NOT_FOUND", f"cluster {cluster_id} belongs to no provider of this run", False
            )
        return m

    @property
    def supports_preflight(self) -> bool:
        """Any member declares PreflightUpgrade (a member that does not is answered for by
        `preflight`, as a one-provider run without it goes on without asking; one that cannot
        be asked now has its clusters unknown, and is not counted)."""
        return any(_declares_preflight(m) for m in self.members)

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        """Each member asked for its clusters; a member that fails makes its clusters unknown
        (named in `down`), never the whole pass."""
        wanted: dict[str, list[str]] = {}
        for cid in cluster_ids:
            name = self.routes.get(cid)
            if name is not None:
                wanted.setdefault(name, []).append(cid)
        clusters: dict[str, ClusterObs] = {}
        operations: dict[str, OpObs] = {}
        forgotten: set[str] = set()
        unknown: dict[str, str] = {}
        self.down = {}
        for m in sorted(self.members, key=lambda m: m.name):
            mine = wanted.get(m.name)
            if not mine:
                continue
            try:
                snap = m.provider.snapshot(mine)
            except CallError as err:
                self.down[m.name] = f"{err.code}: {err.message}"
                why = f"FleetProvider {m.name} is unavailable ({err.code})"
                unknown.update(dict.fromkeys(mine, why))
                continue
            for cid in mine:
                obs = snap.clusters.get(cid)
                if obs is not None:
                    clusters[cid] = labelled(obs, m.name)
            operations.update(snap.operations)
            forgotten |= snap.forgotten
        return Snapshot(clusters, operations, frozenset(forgotten), unknown)

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        """The cluster's member's verdict; a member without PreflightUpgrade is not asked."""
        m = self._member(cluster_id)
        try:
            declared = m.provider.supports_preflight
        except CallError as err:
            raise named(m.name, err) from err
        if not declared:
            return Preflight(
                Verdict.ACCEPTED,
                self.clock(),
                "PreflightNotDeclared",
                f"FleetProvider {m.name} declares no PreflightUpgrade",
            )
        try:
            return m.provider.preflight(cluster_id, version, pools)
        except CallError as err:
            raise named(m.name, err) from err

    def call(self, call: Call) -> OpObs:
        """The call, made to the cluster's member (its errors name the FleetProvider)."""
        m = self._member(call.cluster_id)
        try:
            return m.provider.call(call)
        except CallError as err:
            raise named(m.name, err) from err


@dataclass
class StartingMultiProvider(MultiProvider):
    """MultiProvider over members that each start their requests (driver.StartsRequests: the
    gRPC adapter; a member down answers at once): its preflights and calls are started on the
    cluster's member, and a batch of calls or of preflights (driver.StartsBatches) goes to
    each member as one batch of its own clusters'. Every answer and error is the one
    MultiProvider's blocking methods give (`preflight`, `call`: what is decided without a
    member's RPC is answered at once by them; a member's errors name its FleetProvider)."""

    def start_preflight(
        self, cluster_id: str, version: str, pools: Mapping[str, str]
    ) -> Callable[[], Preflight]:
        """preflight, started on the cluster's member when it declares PreflightUpgrade."""
        m = self._asked(cluster_id, _declares_preflight)
        if m is None:
            return _at_once(lambda: self.preflight(cluster_id, version, pools))
        assert isinstance(m.provider, StartsRequests)
        return _naming(m.name, m.provider.start_preflight(cluster_id, version, pools))

    def start_call(self, call: Call) -> Callable[[], OpObs]:
        """call, started on the cluster's member."""
        m = self._asked(call.cluster_id)
        if m is None:
            return _at_once(lambda: self.call(call))
        assert isinstance(m.provider, StartsRequests)
        return _naming(m.name, m.provider.start_call(call))

    def start_calls(self, calls: Sequence[Call]) -> list[Callable[[], OpObs] | None]:
        """Each member's calls started as one batch of its own (in the order given); None for
        a call whose member does not batch (the driver starts it alone, bounded as any)."""
        return self._per_member(
            calls,
            [c.cluster_id for c in calls],
            lambda batcher, mine: batcher.start_calls(mine),
            self.call,
        )

    def start_preflights(
        self, questions: Sequence[Question]
    ) -> list[Callable[[], Preflight] | None]:
        """Each member's preflights started as one batch of its own, as `start_calls`; one
        whose member declares no PreflightUpgrade is answered at once (`preflight`)."""
        return self._per_member(
            questions,
            [q[0] for q in questions],
            lambda batcher, mine: batcher.start_preflights(mine),
            lambda q: self.preflight(*q),
            asks=_declares_preflight,
        )

    def _per_member(
        self,
        items: Sequence[T],
        clusters: Sequence[str],
        start: Callable[[StartsBatches, list[T]], Sequence[Callable[[], R] | None] | None],
        at_once: Callable[[T], R],
        asks: Callable[[Member], bool] = lambda m: True,
    ) -> list[Callable[[], R] | None]:
        """items (one per cluster, in order) started on their members, one batch per member
        (start); an item whose cluster has no member, or whose member is not asked (asks), is
        answered at once by the blocking view (at_once); None for one whose member does not
        batch."""
        answers: list[Callable[[], R] | None] = [None] * len(items)
        mine: dict[str, list[int]] = {}
        for at, (item, cid) in enumerate(zip(items, clusters, strict=True)):
            m = self._asked(cid, asks)
            if m is None:
                answers[at] = _at_once(partial(at_once, item))
            else:
                mine.setdefault(m.name, []).append(at)
        for m in self.members:
            ats = mine.get(m.name)
            if not ats or not isinstance(m.provider, StartsBatches):
                continue
            started = start(m.provider, [items[at] for at in ats])
            for at, answer in zip(ats, started or [None] * len(ats), strict=True):
                answers[at] = None if answer is None else _naming(m.name, answer)
        return answers

    def _asked(
        self, cluster_id: str, asks: Callable[[Member], bool] = lambda m: True
    ) -> Member | None:
        """The member a cluster's question is started on: its own, when asks says it is asked
        (None: answered at once by the blocking view, as for a cluster of no member)."""
        m = self._routed(cluster_id)
        return m if m is not None and asks(m) else None


def _at_once(answer: Callable[[], T]) -> Callable[[], T]:
    """What a start returns for a question answered without waiting: the answer, or its
    CallError when asked for (never raised by the start)."""
    try:
        value = answer()
    except CallError as err:
        failure = err

        def failed() -> T:
            raise failure

        return failed
    return lambda: value


def _naming(name: str, answer: Callable[[], T]) -> Callable[[], T]:
    """A member's started answer, its error naming the member's FleetProvider (`named`)."""

    def named_answer() -> T:
        try:
            return answer()
        except CallError as err:
            raise named(name, err) from err

    return named_answer


def _declares_preflight(m: Member) -> bool:
    try:
        return m.provider.supports_preflight
    except CallError:
        return False


def named(name: str, err: CallError) -> CallError:
    """A member's error, its words saying which FleetProvider answered."""
    return CallError(
        err.code, f"FleetProvider {name}: {err.message}", err.retryable, err.retry_after
    )
