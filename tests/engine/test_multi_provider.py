"""Runs over several providers (orchestrator.pipeline.multi): one floor over every provider's
clusters, calls routed to each cluster's provider, a provider down counted as unavailable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

import pytest

from orchestrator import api
from orchestrator.controllers.reach import Reached, RunPlugins, Unreached
from orchestrator.engine.decide import (
    PROVIDER_UNAVAILABLE,
    Call,
    Preflight,
    Upgrade,
    Verdict,
    with_status,
)
from orchestrator.engine.observations import ClusterObs, OpKind, OpObs, PoolObs, Snapshot
from orchestrator.engine.validate import Problem
from orchestrator.pipeline.crossrun import Holding
from orchestrator.pipeline.driver import CallError, Question, RunDriver
from orchestrator.pipeline.multi import (
    Member,
    MultiProvider,
    StartingMultiProvider,
    neighbours_across,
    pin_across,
    route,
    union_inventory,
)
from orchestrator.pipeline.simulate import T0, ModelFleet
from tests.support.starting import StartsAtOnce

U = api.UpgradePhase
GKE = "gke.fleetupgrade.io/projects/p"
EKS = "eks.fleetupgrade.io/111122223333"


def _fleet(prefix: str, n: int, **labels: str) -> ModelFleet:
    return ModelFleet(
        {
            f"{prefix}{i}": ClusterObs(
                id=f"{prefix}{i}",
                control_plane_version="1.28.5",
                labels=dict(labels),
                node_pools=(PoolObs("pool-0", "1.28.5"),),
            )
            for i in range(n)
        }
    )


@dataclass
class Outage:
    """A member's plugin that can be made unreachable: every question fails UNAVAILABLE."""

    fleet: ModelFleet
    down: bool = False
    asked: list[str] = field(default_factory=list)

    def _check(self, what: str) -> None:
        self.asked.append(what)
        if self.down:
            raise CallError("UNAVAILABLE", "connection refused", True)

    @property
    def supports_preflight(self) -> bool:
        return True

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        self._check("snapshot")
        return self.fleet.snapshot(cluster_ids)

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        self._check("preflight")
        return self.fleet.preflight(cluster_id, version, pools)

    def call(self, call: Call) -> OpObs:
        self._check("call")
        return self.fleet.call(call)


@dataclass
class Starting(StartsAtOnce, Outage):
    """The same member, which starts its requests (driver.StartsRequests, as the gRPC adapter
    does)."""


@dataclass
class Batching(Starting):
    """... which also starts many calls, or many preflights, as one request
    (driver.StartsBatches: StartOperations, PreflightUpgrades), recording the clusters of each
    batch."""

    batches: list[list[str]] = field(default_factory=list)
    preflight_batches: list[list[str]] = field(default_factory=list)

    def start_calls(self, calls: Sequence[Call]) -> list[Callable[[], OpObs]] | None:
        self.batches.append([c.cluster_id for c in calls])
        return [self.start_call(c) for c in calls]

    def start_preflights(
        self, questions: Sequence[Question]
    ) -> list[Callable[[], Preflight]] | None:
        self.preflight_batches.append([q[0] for q in questions])
        return [self.start_preflight(*q) for q in questions]


#: How the members take requests: each blocks a worker (MultiProvider); both start them
#: (StartingMultiProvider); gke-prod also batches them while eks-prod only starts them.
STARTS = {
    "blocking": (Outage, Outage),
    "started": (Starting, Starting),
    "mixed": (Batching, Starting),
}


@dataclass
class World:
    """Two providers (gke-prod, eks-prod), one run over both, the real driver, one clock.
    starts: a STARTS key (not "blocking": the driver starts a pass's requests, 4 at most)."""

    required: int
    gke: Outage = field(default_factory=lambda: Outage(_fleet("g", 3, team="a")))
    eks: Outage = field(default_factory=lambda: Outage(_fleet("e", 3, team="a")))
    now: float = 0.0
    upgrades: dict[str, Upgrade] = field(default_factory=dict)
    stages: list[api.StageStatus] = field(default_factory=list)
    #: The fewest clusters available and in service (ground truth, over both fleets).
    lowest: int = 10**9
    last_down: dict[str, str] = field(default_factory=dict)
    timeouts: api.StepTimeouts | None = None
    starts: str = "blocking"

    def __post_init__(self) -> None:
        gke, eks = STARTS[self.starts]
        self.gke, self.eks = gke(self.gke.fleet), eks(self.eks.fleet)
        self.members = [
            Member("eks-prod", "eks:9000", EKS, self.eks),
            Member("gke-prod", "gke:9000", GKE, self.gke),
        ]
        self.spec = api.UpdateRunSpec.model_validate(
            {
                "requiredAvailableCount": self.required,
                "providerRefs": [{"name": "gke-prod"}, {"name": "eks-prod"}],
                "version": "1.29.1",
                "strategy": {
                    "stages": [{"name": "all", "selector": {"matchLabels": {"team": "a"}}}]
                },
                **({"timeouts": self.timeouts.dump()} if self.timeouts else {}),
            }
        )
        pinned = pin_across(
            "run",
            self.spec,
            self.members,
            {"gke-prod": self.gke.fleet.clusters, "eks-prod": self.eks.fleet.clusters},
        )
        assert not isinstance(pinned, list), pinned
        self.upgrades = {u.name: u for u in pinned.upgrades}
        self.driver = RunDriver(self.provider(), self, _Passing(), _Leader())
        if self.starts != "blocking":
            self.driver.parallelism = 4
            self.driver.executor = ThreadPoolExecutor(4, thread_name_prefix="test-write")

    def provider(self) -> MultiProvider:
        routes = route(
            [
                (u.cluster_id, u.spec.provider_id or "", u.spec.provider_name)
                for u in self.upgrades.values()
            ],
            self.members,
        )
        assert not isinstance(routes, Problem)
        provider = MultiProvider.over(self.members, routes, lambda: self.wall)
        assert isinstance(provider, StartingMultiProvider) == (self.starts != "blocking")
        return provider

    @property
    def wall(self) -> datetime:
        return T0 + timedelta(seconds=self.now)

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        self.upgrades[upgrade.name] = with_status(self.upgrades[upgrade.name], status)

    def phases(self) -> dict[str, U]:
        return {u.cluster_id: u.status.phase for u in self.upgrades.values()}

    def status_of(self, cid: str) -> api.ClusterUpgradeStatus:
        return next(u.status for u in self.upgrades.values() if u.cluster_id == cid)

    def observe(self) -> None:
        clusters = [*self.gke.fleet.clusters.values(), *self.eks.fleet.clusters.values()]
        self.lowest = min(self.lowest, sum(1 for c in clusters if c.available and c.in_service))

    def step(self) -> api.RunPhase:
        provider = self.provider()
        self.driver.provider = provider
        result = self.driver.step(
            key="ns/run",
            uid="uid-1",
            spec=self.spec,
            upgrades=dict(self.upgrades),
            stages=self.stages,
            held_by={},
            now=self.wall,
        )
        self.stages = list(result.decision.stages)
        self.last_decision = result.decision
        self.last_down = dict(provider.down)
        self.observe()
        return result.decision.phase

    def run_for(self, seconds: float) -> api.RunPhase:
        """Step every simulated second for a while (operations take 2 s)."""
        phase = self.step()
        end = self.now + seconds
        while self.now < end and phase not in api.FINISHED_PHASES:
            self.now += 1.0
            for f in (self.gke.fleet, self.eks.fleet):
                f.now = self.now
                f.advance_to(self.now)
            self.observe()
            phase = self.step()
        return phase


class _Passing:
    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        return [api.CheckResult(name=c.name, passed=True) for c in checks.checks]


class _Leader:
    def held(self) -> bool:
        return True


# -- pinning ---------------------------------------------------------------------------------


def test_each_cluster_is_pinned_on_its_provider_and_labelled_with_it() -> None:
    w = World(required=1)
    by_cluster = {u.cluster_id: u.spec for u in w.upgrades.values()}
    assert sorted(by_cluster) == ["e0", "e1", "e2", "g0", "g1", "g2"]
    assert {
        (s.provider, s.provider_id, s.provider_name) for c, s in by_cluster.items() if c[0] == "g"
    } == {("gke:9000", GKE, "gke-prod")}
    assert {
        (s.provider, s.provider_id, s.provider_name) for c, s in by_cluster.items() if c[0] == "e"
    } == {("eks:9000", EKS, "eks-prod")}


def test_stages_select_by_provider() -> None:
    gke, eks = _fleet("g", 2), _fleet("e", 2)
    spec = api.UpdateRunSpec.model_validate(
        {
            "providerRefs": [{"name": "gke-prod"}, {"name": "eks-prod"}],
            "version": "1.29.1",
            "strategy": {
                "stages": [
                    {
                        "name": "eks-first",
                        "selector": {"matchLabels": {api.LABEL_PROVIDER: "eks-prod"}},
                    },
                    {
                        "name": "then-gke",
                        "selector": {"matchLabels": {api.LABEL_PROVIDER: "gke-prod"}},
                    },
                ]
            },
        }
    )
    members = [
        Member("gke-prod", "g:1", GKE, Outage(gke)),
        Member("eks-prod", "e:1", EKS, Outage(eks)),
    ]
    pinned = pin_across("run", spec, members, {"gke-prod": gke.clusters, "eks-prod": eks.clusters})
    assert not isinstance(pinned, list)
    assert {u.cluster_id: u.spec.stage for u in pinned.upgrades} == {
        "e0": "eks-first",
        "e1": "eks-first",
        "g0": "then-gke",
        "g1": "then-gke",
    }


def test_an_id_two_providers_report_is_refused_naming_both() -> None:
    found = union_inventory(
        {"gke-prod": _fleet("c", 2).clusters, "eks-prod": _fleet("c", 1).clusters}
    )
    assert isinstance(found, list)
    assert [p.field for p in found] == ["spec.providerRefs"]
    assert (
        "cluster id c0 is reported by both FleetProvider eks-prod and FleetProvider gke-prod"
        in (found[0].message)
    )
    assert "separate runs" in found[0].message


def test_a_member_pointing_elsewhere_or_removed_refuses_the_run() -> None:
    members = [Member("gke-prod", "g:1", GKE, Outage(_fleet("g", 1)))]
    moved = route([("g0", "gke.fleetupgrade.io/projects/other", "gke-prod")], members)
    assert isinstance(moved, Problem) and moved.field == "spec.providerRefs"
    assert "FleetProvider gke-prod now points at g:1" in moved.message
    gone = route([("e0", EKS, "eks-prod")], members)
    assert isinstance(gone, Problem)
    assert (
        "FleetProvider eks-prod" in gone.message
        and "no longer in spec.providerRefs" in gone.message
    )
    assert route([("g0", GKE, "gke-prod")], members) == {"g0": "gke-prod"}


# -- calls go to each cluster's provider -----------------------------------------------------


@pytest.mark.parametrize("starts", list(STARTS))
def test_one_run_upgrades_both_providers_under_one_floor(starts: str) -> None:
    w = World(required=4, starts=starts)
    assert w.run_for(600) == api.RunPhase.SUCCEEDED
    assert set(w.phases().values()) == {U.UPGRADED}
    # Every step went to the cluster's own provider, and the floor held over both together.
    assert {c for c, *_ in w.gke.fleet.started_steps} == {"g0", "g1", "g2"}
    assert {c for c, *_ in w.eks.fleet.started_steps} == {"e0", "e1", "e2"}
    assert w.lowest >= 4
    for f in (w.gke.fleet, w.eks.fleet):
        assert {c.control_plane_version for c in f.clusters.values()} == {"1.29.1"}
    if isinstance(w.gke, Batching):
        # gke-prod's calls went as batches of its own clusters; eks-prod's one by one.
        assert w.gke.batches and {c for b in w.gke.batches for c in b} == {"g0", "g1", "g2"}
        assert sum(map(len, w.gke.batches)) == w.gke.asked.count("call")
        batched = [c for b in w.gke.preflight_batches for c in b]
        assert set(batched) == {"g0", "g1", "g2"}
        assert len(batched) == w.gke.asked.count("preflight")
        assert "call" in w.eks.asked and not isinstance(w.eks, Batching)


# -- a provider down -------------------------------------------------------------------------


@pytest.mark.parametrize("starts", list(STARTS))
def test_a_provider_down_counts_as_unavailable_and_nothing_goes_out_below_the_floor(
    starts: str,
) -> None:
    # 6 clusters, floor 4: with eks-prod's 3 unknown, only 3 can be verified available (< 4).
    w = World(required=4, starts=starts)
    w.eks.down = True
    w.run_for(120)
    assert w.gke.fleet.started_steps == [] and w.eks.fleet.started_steps == []
    assert "call" not in w.gke.asked
    assert w.last_down == {"eks-prod": "UNAVAILABLE: connection refused"}
    for cid in ("e0", "e1", "e2"):
        st = w.status_of(cid)
        # Not taken for gone: waiting for its provider, which it names.
        assert (st.phase, st.reason) == (U.PENDING, PROVIDER_UNAVAILABLE)
        assert "FleetProvider eks-prod is unavailable" in (st.message or "")
    # It returns: the run goes on and finishes, the floor held throughout.
    w.eks.down = False
    assert w.run_for(900) == api.RunPhase.SUCCEEDED
    assert w.lowest >= 4


@pytest.mark.parametrize("starts", list(STARTS))
def test_the_other_providers_clusters_go_on_where_the_floor_allows(starts: str) -> None:
    # Floor 2: eks-prod's 3 unknown count as down, gke-prod's 3 leave room for one at a time.
    w = World(required=2, starts=starts)
    w.eks.down = True
    w.run_for(300)
    assert {w.status_of(c).phase for c in ("g0", "g1", "g2")} == {U.UPGRADED}
    assert w.eks.fleet.started_steps == []
    gke_up = [c for c in w.gke.fleet.clusters.values() if c.available and c.in_service]
    assert len(gke_up) == 3
    # Never more than one gke-prod cluster out at once (3 known available - 2 required).
    out_at_once = _most_out(w.gke.fleet)
    assert out_at_once == 1


def test_a_run_left_waiting_only_for_a_provider_says_so() -> None:
    """Invariant 4 (simulation seed 7501): gke-prod's clusters done, eks-prod's waiting for it,
    nothing in flight: the run names what it waits for (waitingReason ProviderUnavailable and
    the first cluster), it is never Progressing saying nothing."""
    w = World(required=2)
    w.eks.down = True
    assert w.run_for(300) == api.RunPhase.PROGRESSING
    assert {w.status_of(c).phase for c in ("g0", "g1", "g2")} == {U.UPGRADED}
    decision = w.last_decision
    assert decision.waiting_reason == PROVIDER_UNAVAILABLE
    assert decision.message is not None and "waiting: e0:" in decision.message
    assert "FleetProvider eks-prod is unavailable" in decision.message


def _most_out(fleet: ModelFleet) -> int:
    """The most clusters of the fleet between a service-out start and a service-in end."""
    events: list[tuple[float, int]] = []
    for (_, kind, _, _), start in zip(fleet.started_steps, fleet.started_at, strict=True):
        if kind.value == "serviceOut":
            events.append((start, 1))
        elif kind.value == "serviceIn":
            events.append((start + fleet.durations[kind], -1))
    most = out = 0
    for _, delta in sorted(events):
        out += delta
        most = max(most, out)
    return most


@pytest.mark.parametrize("starts", list(STARTS))
def test_a_cluster_in_flight_waits_for_its_provider_then_fails_within_its_bound(
    starts: str,
) -> None:
    w = World(required=5, timeouts=api.StepTimeouts(control_plane="5m"), starts=starts)
    # Run until an eks-prod cluster is upgrading its control plane, then take eks-prod away.
    for _ in range(600):
        w.run_for(1)
        if any(w.status_of(c).phase == U.UPGRADING_CONTROL_PLANE for c in ("e0", "e1", "e2")):
            break
    cid = next(c for c in ("e0", "e1", "e2") if w.status_of(c).phase == U.UPGRADING_CONTROL_PLANE)
    w.eks.down = True
    w.run_for(60)
    st = w.status_of(cid)
    assert st.phase == U.UPGRADING_CONTROL_PLANE  # neither gone nor failed within its bound
    assert "waiting for its provider (counted as unavailable)" in (st.message or "")
    w.run_for(400)
    st = w.status_of(cid)
    assert (st.phase, st.reason) == (U.FAILED, PROVIDER_UNAVAILABLE)
    assert "FleetProvider eks-prod is unavailable" in (st.message or "")


@pytest.mark.parametrize("starts", list(STARTS))
def test_errors_of_a_member_name_its_fleet_provider(starts: str) -> None:
    w = World(required=1, starts=starts)
    w.eks.down = True
    provider = w.provider()
    with pytest.raises(CallError) as err:
        provider.preflight("e0", "1.29.1", {})
    assert err.value.message == "FleetProvider eks-prod: connection refused"
    assert err.value.retryable
    if not isinstance(provider, StartingMultiProvider):
        return
    # Started, the same errors come with the answers, never from the start.
    call = Call(OpKind.SERVICE_OUT, "e0", "uid-1:e0:serviceOut:1.29.1:1", "run-e0")
    stray = replace(call, cluster_id="nowhere")
    preflight = provider.start_preflight("e0", "1.29.1", {})
    answers = provider.start_calls([call, stray, replace(call, cluster_id="g0")])
    for answer in (preflight, provider.start_call(call)):
        with pytest.raises(CallError) as err:
            answer()
        assert err.value.message == "FleetProvider eks-prod: connection refused"
    with pytest.raises(CallError) as err:
        provider.start_call(stray)()
    assert err.value.code == "NOT_FOUND" and "belongs to no provider" in err.value.message
    assert answers[1] is not None
    with pytest.raises(CallError):
        answers[1]()
    # A member that batches starts its calls with the batch; one that does not leaves them
    # to the driver, which starts them alone.
    assert (answers[0] is None, answers[2] is None) == (
        not isinstance(w.eks, Batching),
        not isinstance(w.gke, Batching),
    )


# -- where runs meet -------------------------------------------------------------------------


def _holding(run: str, provider: str, cid: str, active: bool = False) -> Holding:
    return Holding(run=run, provider=provider, cluster_id=cid, holds=active)


def test_a_run_sharing_one_provider_binds_with_its_members_on_every_provider() -> None:
    # ns/other shares g1 on GKE only; its EKS members e5, e6 are observed too (one floor).
    holdings = [
        _holding("ns/other", GKE, "g1"),
        _holding("ns/other", EKS, "e5"),
        _holding("ns/other", EKS, "e6"),
    ]
    own = {"g1": GKE, "e1": EKS}
    _, floors, extra = neighbours_across(holdings, lambda run: 2, own, "ns/me")
    assert [(f.run, set(f.members), f.required) for f in floors] == [
        ("ns/other", {"g1", "e5", "e6"}, 2)
    ]
    assert extra == {"e5": EKS, "e6": EKS}


def test_holdings_and_floors_meet_on_provider_and_cluster_id() -> None:
    holdings = [
        # Another run holds "x" on EKS: not this run's "x", which is on GKE.
        _holding("ns/other", EKS, "x", active=True),
        _holding("ns/other", EKS, "e1"),
        # A third run holds this run's GKE g1 and shares e1 on EKS too.
        _holding("ns/third", GKE, "g1", active=True),
        _holding("ns/third", EKS, "e1"),
        _holding("ns/third", EKS, "e9"),
        # ...and has a cluster on a provider this run does not use: it cannot be observed.
        _holding("ns/third", "aks.fleetupgrade.io/sub", "a1"),
    ]
    own = {"x": GKE, "g1": GKE, "e1": EKS}
    held, floors, extra = neighbours_across(holdings, lambda run: 3, own, "ns/me")
    # Held: this run's g1 (by ns/third); ns/other's x is not this run's x.
    assert held == {"g1": "ns/third", f"{EKS}|x": "ns/other"}
    assert {f.run: (set(f.members), f.required) for f in floors} == {
        # Its EKS x cannot be spelled "x" here (this run's x is on GKE): it counts as down.
        "ns/other": ({"e1", f"{EKS}|x"}, 3),
        # One floor over both providers; a1 is left out (so the observed must keep all 3).
        "ns/third": ({"g1", "e1", "e9"}, 3),
    }
    assert extra == {"e9": EKS}


def test_an_id_another_run_has_on_two_providers_counts_as_down() -> None:
    holdings = [
        _holding("ns/other", GKE, "x"),
        _holding("ns/other", GKE, "g1"),
        _holding("ns/other", EKS, "x"),
        _holding("ns/other", EKS, "e1"),
    ]
    own = {"g1": GKE, "e1": EKS, "x": GKE}
    _, floors, extra = neighbours_across(holdings, lambda run: 2, own, "ns/me")
    (floor,) = floors
    # Its x on GKE is this run's x; its x on EKS cannot be spelled "x" in this run's snapshot:
    # it is spelled so that no provider reports it (counted as down, the safe side).
    assert floor.members == frozenset({"g1", "e1", "x", f"{EKS}|x"})
    assert extra == {}


def test_a_member_without_preflight_is_answered_for_not_asked() -> None:
    w = World(required=1)

    @dataclass
    class NoPreflight(Outage):
        @property
        def supports_preflight(self) -> bool:
            return False

    bare = NoPreflight(w.eks.fleet)
    members = [replace(w.members[0], provider=bare), w.members[1]]
    provider = MultiProvider(members, {"e0": "eks-prod", "g0": "gke-prod"}, lambda: w.wall)
    assert provider.supports_preflight
    answer = provider.preflight("e0", "1.29.1", {})
    assert answer.reason == "PreflightNotDeclared" and "eks-prod" in answer.message
    assert "preflight" not in bare.asked


def test_a_member_that_cannot_say_what_it_declares_does_not_stop_the_others() -> None:
    w = World(required=1)

    @dataclass
    class Unasked(Outage):
        @property
        def supports_preflight(self) -> bool:
            raise CallError("UNAVAILABLE", "connection refused", True)

    members = [replace(w.members[0], provider=Unasked(w.eks.fleet)), w.members[1]]
    provider = MultiProvider(members, {"e0": "eks-prod", "g0": "gke-prod"}, lambda: w.wall)
    assert provider.supports_preflight  # gke-prod's answer
    with pytest.raises(CallError) as err:
        provider.preflight("e0", "1.29.1", {})
    assert err.value.message == "FleetProvider eks-prod: connection refused"
    assert provider.preflight("g0", "1.29.1", {}).verdict == Verdict.ACCEPTED


@dataclass
class _Counting(_Passing):
    asked: list[tuple[str, ...]] = field(default_factory=list)

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        self.asked.append(tuple(c.id for c in clusters))
        return super().evaluate(checks, clusters, stage)


def test_no_stage_check_passes_without_a_member_whose_provider_is_down() -> None:
    w = World(required=1)
    checks = {
        "interval": "1s",
        "checks": [
            {
                "name": "app",
                "workloads": {"endpoint": "gke:9000", "items": [{"namespace": "d", "name": "app"}]},
            }
        ],
    }
    spec = w.spec.model_copy(update={"health_checks": api.HealthChecks.model_validate(checks)})
    checker = _Counting()
    driver = RunDriver(w.provider(), w, checker, _Leader())
    verifying = api.StageStatus(
        name="all",
        phase=api.StagePhase.VERIFYING,
        total=6,
        upgraded=6,
        health=api.HealthState(since="2026-01-01T00:00:00Z"),
    )
    snap = w.provider().snapshot(sorted(u.cluster_id for u in w.upgrades.values()))
    unknown = replace(snap, unknown={"e0": "FleetProvider eks-prod is unavailable (UNAVAILABLE)"})
    later = w.wall + timedelta(seconds=5)
    (after,) = driver._evaluate_stages("ns/run", spec, w.upgrades, [verifying], unknown, later)
    assert checker.asked == [] and after == verifying  # no pass counted without e0
    (after,) = driver._evaluate_stages("ns/run", spec, w.upgrades, [verifying], snap, later)
    assert checker.asked == [("e0", "e1", "e2", "g0", "g1", "g2")]
    assert after.health is not None and after.health.passes == 1


def test_a_run_whose_members_start_requests_is_driven_started_even_with_one_down() -> None:
    """RunPlugins.provider: members that start their requests (the gRPC adapter) and a member
    whose plugin did not answer (down for the pass, answering at once) make the started view;
    the down member's errors come with the answers, naming it. One member that only blocks (a
    composed FleetProvider) makes the blocking view."""
    w = World(required=1, starts="started")
    down = CallError("UNAVAILABLE", "connection refused", True)
    routes = {"g0": "gke-prod", "e0": "eks-prod"}
    plugins = RunPlugins(
        [
            Reached("gke-prod", "gke:9000", GKE, cast(Any, w.gke)),
            Unreached("eks-prod", "eks:9000", down),
        ],
        True,
        lambda: w.wall,
    )
    provider = plugins.provider(routes)
    assert isinstance(provider, StartingMultiProvider)
    answer = provider.start_call(
        Call(OpKind.SERVICE_OUT, "e0", "uid-1:e0:serviceOut:1.29.1:1", "e")
    )
    with pytest.raises(CallError) as err:
        answer()
    assert err.value.message == "FleetProvider eks-prod: connection refused"
    blocking = Reached("eks-prod", "eks:9000", EKS, cast(Any, Outage(w.eks.fleet)))
    plugins = RunPlugins([plugins.plugins[0], blocking], True, lambda: w.wall)
    assert type(plugins.provider(routes)) is MultiProvider
