"""A pass costs what changed (issue 21): the index a run's driver keeps between passes
(engine.index) must agree with one made from scratch, and a decision taken with it must be the
decision taken from scratch, after EVERY step of simulated histories: the adversarial
simulation's seeded worlds (restarts, conflicts, lost writes, drift, other runs, hooks) and
what-if rollouts whose clusters wait for the availability budget, by stage and concurrency.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from dataclasses import FrozenInstanceError, dataclass, replace
from datetime import timedelta

import pytest
from pydantic import ValidationError

from orchestrator import api
from orchestrator.engine import decide as engine
from orchestrator.engine.decide import Decision, RunInput, with_status
from orchestrator.engine.index import FULL_EVERY, FULL_SECONDS, RunIndex
from orchestrator.engine.initialize import Pinned, pin_upgrades
from orchestrator.engine.observations import (
    ClusterObs,
    OpKind,
    OpObs,
    OpState,
    PoolObs,
    apply_succeeded,
)
from orchestrator.pipeline import driver as driver_module
from orchestrator.pipeline.driver import RunDriver
from orchestrator.pipeline.simulate import T0, ModelFleet, simulate
from tests.sim.world import Config
from tests.sim.world import simulate as sim_world
from tests.support.told import Held, NoChecks, TellingFleet, TellingStore


@dataclass
class _Tally:
    """How many decisions were compared, and how often the memos stood in for a look."""

    decisions: int = 0
    waited: int = 0
    quiet: int = 0


def _same_decision(kept: Decision, fresh: Decision) -> None:
    assert kept == fresh
    # The writes go in the decision's order (new service-outs last): order is part of it.
    assert list(kept.changed) == list(fresh.changed)


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Tally]:
    """Every decision any driver takes is taken twice, from scratch first (no index: what a
    full pass sees), then with the driver's kept index; both must be the same, and the kept
    index must then agree with one made from scratch of the same upgrades."""
    tally = _Tally()
    real = engine.decide

    def both(inp: RunInput) -> Decision:
        assert inp.index is not None, "the driver decides with its kept index"
        fresh = real(replace(inp, index=None))
        waiting, quiet = dict(inp.index.waiting), dict(inp.index.quiet)
        kept = real(inp)
        _same_decision(kept, fresh)
        fresh_index = RunIndex.build(inp.uid, inp.upgrades, inp.snapshot.clusters, inp.held_by)
        assert inp.index.differences(fresh_index) == []
        tally.decisions += 1
        tally.waited += sum(1 for n, w in waiting.items() if inp.index.waiting.get(n) is w)
        tally.quiet += sum(1 for n, q in quiet.items() if inp.index.quiet.get(n) is q)
        return kept

    monkeypatch.setattr(driver_module, "decide", both)
    yield tally


@pytest.mark.parametrize("seed", range(0, 240, 8))
def test_kept_index_agrees_over_seeded_histories(checked: _Tally, seed: int) -> None:
    sim_world(seed, Config.draw(seed, large=False))
    assert checked.decisions > 0


def test_kept_index_agrees_on_a_large_fleet(checked: _Tally) -> None:
    cfg = Config.draw(136)
    assert cfg.clusters >= 500
    cfg.active_seconds = 120
    cfg.quiet_cap = 300
    sim_world(136, cfg)
    assert checked.decisions > 0


def _fleet(count: int) -> dict[str, ClusterObs]:
    return {
        f"c-{i:04d}": ClusterObs(
            id=f"c-{i:04d}",
            control_plane_version="1.28.5",
            node_pools=(PoolObs("pool", "1.28.5"),),
            labels={"stage": "canary" if i < count // 10 else "main"},
        )
        for i in range(count)
    }


@pytest.mark.parametrize(
    ("stages", "max_concurrency", "fail"),
    [(False, None, False), (True, None, True), (True, "5%", False), (False, 7, True)],
)
def test_kept_index_agrees_while_clusters_wait_for_budget(
    checked: _Tally, stages: bool, max_concurrency: int | str | None, fail: bool
) -> None:
    """A what-if rollout of 200 clusters with a floor of 150: most of them wait for budget on
    most passes (the `waiting` memo), those in flight wait for their operations (`quiet`);
    failures count against budgets by stage."""
    clusters = _fleet(200)
    strategy = api.Strategy(
        max_concurrency=max_concurrency,
        max_failures="10%",
        stages=[
            api.Stage(name=s, selector=api.LabelSelector(match_labels={"stage": s}))
            for s in ("canary", "main")
        ]
        if stages
        else None,
    )
    spec = api.ClusterVersionSpec(
        required_available_count=150,
        ops_endpoint=api.OpsEndpoint(endpoint="127.0.0.1:9090", insecure=True),
        clusters=[api.ClusterSpec(id=c, version="1.29.4") for c in clusters],
        strategy=strategy,
    )
    failing = {("c-0013", OpKind.CONTROL_PLANE), ("c-0150", OpKind.NODE_POOL)} if fail else set()
    fleet = ModelFleet(clusters, durations={k: 30.0 for k in OpKind}, fail=failing)
    rollout = simulate(fleet, spec)
    assert rollout.last is not None
    assert fleet.min_available_in_service >= 150
    assert checked.decisions > 20
    if max_concurrency is None:  # with a concurrency limit, the offer stops at it instead
        assert checked.waited > 0, "the budget memo was never used: the test lost its point"
    assert checked.quiet > 0, "the in-flight memo was never used: the test lost its point"


def _thirty() -> tuple[dict[str, ClusterObs], api.UpdateRunSpec, Pinned]:
    """30 clusters, a run of them all with floor 25, and its pinned ClusterUpgrades."""
    clusters = _fleet(30)
    spec = api.UpdateRunSpec(
        required_available_count=25,
        ops_endpoint=api.OpsEndpoint(endpoint="127.0.0.1:9090", insecure=True),
        clusters=[api.ClusterSpec(id=c, version="1.29.4") for c in clusters],
    )
    pinned = pin_upgrades("t", spec, clusters)
    assert not isinstance(pinned, list)
    return clusters, spec, pinned


def test_the_driver_rebuilds_a_kept_index_that_disagrees() -> None:
    """The periodic full pass: an index whose counts went wrong (here, corrupted on purpose)
    is found out within FULL_EVERY passes and rebuilt, and decisions go on from the truth."""
    clusters, spec, pinned = _thirty()
    upgrades = {u.name: u for u in pinned.upgrades}

    class Store:
        def write_upgrade_status(self, u: engine.Upgrade, st: api.ClusterUpgradeStatus) -> None:
            upgrades[u.name] = with_status(upgrades[u.name], st)

    fleet = ModelFleet(clusters, durations=dict.fromkeys(OpKind, 1e9))
    drv = RunDriver(fleet, Store(), NoChecks(), Held())  # type: ignore[arg-type]

    def step() -> Decision:
        return drv.step(
            key="t/t",
            uid="t",
            spec=spec,
            upgrades=dict(upgrades),
            stages=[],
            held_by={},
            now=T0,
        ).decision

    step()
    assert len(fleet.started_steps) == 5  # the floor lets five go
    # Corrupt the kept counts: the five in flight are forgotten by the index (counted as
    # Pending, so not held: a decision on these counts would take five more out).
    for name in sorted(drv.index.phases.by_phase[api.UpgradePhase.SERVICING_OUT]):
        drv.index.phases.by_phase[api.UpgradePhase.SERVICING_OUT].discard(name)
        drv.index.phases.by_phase[api.UpgradePhase.PENDING].add(name)
    assert drv.index.differences(RunIndex.build("t", upgrades)) != []
    drv.index.passes = FULL_EVERY - 1  # the next pass is a full one
    decision = step()
    assert drv.index.differences(RunIndex.build("t", upgrades)) == []
    assert (decision.counts.in_flight, decision.counts.pending) == (5, 25)
    assert len(fleet.started_steps) == 5  # nothing more was taken out: the floor held


def test_a_quiet_step_still_times_out(checked: _Tally) -> None:
    """Control-plane upgrades that never end: followed on the `quiet` memo while they wait,
    each still fails StepTimedOut at its deadline, as a decision from scratch has it."""
    clusters = _fleet(40)
    spec = api.ClusterVersionSpec(
        required_available_count=30,
        ops_endpoint=api.OpsEndpoint(endpoint="127.0.0.1:9090", insecure=True),
        clusters=[api.ClusterSpec(id=c, version="1.29.4") for c in clusters],
        strategy=api.Strategy(max_failures="100%"),
        timeouts=api.StepTimeouts(control_plane="10m"),
    )
    durations = dict.fromkeys(OpKind, 20.0)
    durations[OpKind.CONTROL_PLANE] = 1e9
    fleet = ModelFleet(clusters, durations=durations)
    rollout = simulate(fleet, spec, horizon_seconds=4 * 3600.0)
    timed_out = [u for u in rollout.upgrades.values() if u.status.reason == "StepTimedOut"]
    # The floor lets 10 go; failed, they stay out of service, so no more start.
    assert len(timed_out) == 10
    assert all(u.status.phase == api.UpgradePhase.FAILED for u in timed_out)
    assert checked.quiet > 0


def _told_rollout(
    count: int,
    floor: int,
    untold_clusters: frozenset[str] = frozenset(),
    untold_names: frozenset[str] = frozenset(),
) -> tuple[RunDriver, TellingFleet, TellingStore, Decision, int]:
    """A rollout whose callers say what changed (the fleet's snapshots their `Changes`, the
    store what it wrote, passed as `RunDriver.step(changed=...)`), less what they are told to
    forget; returns the driver, fleet, store, last decision and how many passes were decided
    on an index that rested on their word (`RunIndex.told` after the pass)."""
    clusters = _fleet(count)
    spec = api.UpdateRunSpec(
        required_available_count=floor,
        ops_endpoint=api.OpsEndpoint(endpoint="127.0.0.1:9090", insecure=True),
        clusters=[api.ClusterSpec(id=c, version="1.29.4") for c in clusters],
        strategy=api.Strategy(max_failures="10%"),
    )
    pinned = pin_upgrades("t", spec, clusters)
    assert not isinstance(pinned, list)
    fleet = TellingFleet(
        clusters, durations=dict.fromkeys(OpKind, 3.0), untold=set(untold_clusters)
    )
    store = TellingStore({u.name: u for u in pinned.upgrades}, untold=set(untold_names))

    drv = RunDriver(fleet, store, NoChecks(), Held())  # type: ignore[arg-type]
    stages: list[api.StageStatus] = []
    told = 0
    decision = None
    for _ in range(2000):
        fleet.advance_to(fleet.now)
        result = drv.step(
            key="t/t",
            uid="t",
            spec=spec,
            upgrades=dict(store.upgrades),
            stages=stages,
            held_by={},
            now=T0 + timedelta(seconds=fleet.now),
            changed=store.take(),
        )
        decision = result.decision
        stages = list(decision.stages)
        told += drv.index.told
        if decision.phase in api.FINISHED_PHASES:
            break
        fleet.now += 1.0
    assert decision is not None
    return drv, fleet, store, decision, told


def test_kept_index_agrees_when_callers_say_what_changed(checked: _Tally) -> None:
    """Callers that say what changed (the operation watch's clusters and operations, the
    ClusterUpgrade watch's names): every decision is the decision from scratch, the kept index
    agrees with one made from scratch after every step, and most passes looked at no more."""
    _, fleet, _, decision, told = _told_rollout(120, 100)
    assert decision.phase == api.RunPhase.SUCCEEDED
    assert fleet.min_available_in_service >= 100
    assert checked.decisions > 50
    assert told > checked.decisions // 2, "the callers' word was never taken: no point"


def test_a_caller_that_forgets_cannot_break_the_floor(caplog: pytest.LogCaptureFixture) -> None:
    """A provider that never says when some clusters change (their service-outs take effect
    unseen: they stay up by the index's count) and a watch that misses some writes: no floor
    lets a cluster go on that word (the decision compares every object first), the periodic
    full pass finds and repairs what was missed, and the rollout still finishes."""
    untold = frozenset(f"c-{i:04d}" for i in range(0, 120, 3))
    drv, fleet, store, decision, _ = _told_rollout(120, 100, untold_clusters=untold)
    assert fleet.min_available_in_service >= 100
    assert decision.phase == api.RunPhase.SUCCEEDED
    forgetful = frozenset(sorted(store.upgrades)[::4])
    drv, fleet, store, decision, _ = _told_rollout(
        120, 100, untold_clusters=untold, untold_names=forgetful
    )
    assert fleet.min_available_in_service >= 100
    assert decision.phase == api.RunPhase.SUCCEEDED
    fresh = RunIndex.build("t", store.upgrades)
    drv.index.observe("t", store.upgrades)  # what the next full pass compares
    assert drv.index.differences(fresh) == []


@pytest.mark.parametrize("kind", list(OpKind))
def test_apply_succeeded_is_the_observation_replaced(kind: OpKind) -> None:
    """A pass's effective observation of a cluster whose operation succeeded (built without
    dataclasses.replace, as one is made per changed cluster) is exactly the replaced one, and
    the snapshot's own observation is left as it was."""
    before = ClusterObs(
        "c-1",
        "1.28.5",
        (PoolObs("a", "1.28.5", ready=False), PoolObs("b", "1.28.5")),
        {"stage": "main"},
        in_service=kind is not OpKind.SERVICE_OUT,
    )
    op = OpObs("op-1", kind, "c-1", OpState.SUCCEEDED, "r", node_pool="a", target_version="1.29.4")
    expected = {
        OpKind.SERVICE_OUT: replace(before, in_service=False),
        OpKind.SERVICE_IN: replace(before, in_service=True),
        OpKind.CONTROL_PLANE: replace(before, control_plane_version="1.29.4"),
        OpKind.NODE_POOL: replace(
            before, node_pools=(PoolObs("a", "1.29.4", ready=True), PoolObs("b", "1.28.5"))
        ),
    }[kind]
    after = apply_succeeded(before, op)
    assert after == expected
    assert type(after) is ClusterObs
    assert (before.control_plane_version, before.node_pools[0].version) == ("1.28.5", "1.28.5")
    with pytest.raises(FrozenInstanceError):
        after.in_service = True  # type: ignore[misc]


def test_a_status_updated_by_a_decision_is_its_model_copy() -> None:
    """The status a decision builds (decide._updated, made without pydantic's generic copy)
    is what model_copy makes: the same fields, the same fields set, equal, dumped alike; the
    old one unchanged."""
    old = api.ClusterUpgradeStatus(
        phase=api.UpgradePhase.SERVICING_OUT,
        step="serviceOut",
        request_id="t:c-1:serviceOut:1.29.4:0",
        attempt=2,
        conditions=[],
    )
    changes = {
        "phase": api.UpgradePhase.UPGRADING_CONTROL_PLANE,
        "step": "controlPlane",
        "operation_id": None,
        "message": None,
        "last_transition_time": "2026-01-01T00:00:00Z",
    }
    before = old.model_dump()
    fast, slow = engine._updated(old, changes), old.model_copy(update=changes)
    assert type(fast) is type(slow)
    assert fast == slow
    assert fast.__dict__ == slow.__dict__
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.dump() == slow.dump()
    assert fast.__pydantic_extra__ == slow.__pydantic_extra__
    assert fast.__pydantic_private__ == slow.__pydantic_private__
    assert old.model_dump() == before
    with pytest.raises(ValidationError):
        fast.phase = api.UpgradePhase.PENDING  # frozen, as model_copy's is
    # Changes that change no field: the very status, no copy (what _Run.set relies on).
    assert engine._updated(old, {"step": old.step, "attempt": 2}) is old


def _told_run() -> tuple[TellingFleet, TellingStore, RunDriver, Callable[..., Decision]]:
    """A 30-cluster run (floor 25) whose driver is told what changed, and its step at a
    second of the run's clock."""
    clusters, spec, pinned = _thirty()
    fleet = TellingFleet(clusters, durations=dict.fromkeys(OpKind, 1e9))
    store = TellingStore({u.name: u for u in pinned.upgrades})
    drv = RunDriver(fleet, store, NoChecks(), Held())  # type: ignore[arg-type]

    def step(seconds: float = 0.0) -> Decision:
        return drv.step(
            key="t/t",
            uid="t",
            spec=spec,
            upgrades=dict(store.upgrades),
            stages=[],
            held_by={},
            now=T0 + timedelta(seconds=seconds),
            changed=store.take(),
        ).decision

    return fleet, store, drv, step


def _skip_unsaid(store: TellingStore) -> None:
    """Someone else skips a waiting cluster; the caller does not say so."""
    name = next(n for n, u in store.upgrades.items() if u.status.phase == api.UpgradePhase.PENDING)
    u = store.upgrades[name]
    store.upgrades[name] = with_status(
        u, u.status.model_copy(update={"phase": api.UpgradePhase.SKIPPED, "reason": "Elsewhere"})
    )


def test_a_change_not_said_is_found_within_full_seconds_of_the_runs_clock(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the index rests on what the caller said, the full pass also runs FULL_SECONDS
    after the last one by the run's clock, however few passes there were: a change the caller
    did not say holds the run back for seconds, not for FULL_EVERY passes (which, a pass every
    30 s, outlast a step's timeout)."""
    _, store, drv, step = _told_run()
    step(0)
    step(1)  # told: the index's clock of full passes starts here
    _skip_unsaid(store)
    assert step(1 + FULL_SECONDS / 2).counts.skipped == 0  # behind, within FULL_SECONDS
    assert drv.index.passes < FULL_EVERY
    with caplog.at_level("ERROR"):
        decision = step(1 + FULL_SECONDS)
    assert "disagreed with a full pass" in caplog.text
    assert drv.index.differences(RunIndex.build("t", store.upgrades)) == []
    assert decision.counts.skipped == 1


def test_the_full_pass_finds_what_a_caller_did_not_say(caplog: pytest.LogCaptureFixture) -> None:
    """A ClusterUpgrade changed by someone else (another replica, a person) that the caller
    does not name in `changed`: the kept index is left behind (nothing here lets a cluster go,
    so no decision compares every object), until the periodic full pass finds the difference,
    logs it and rebuilds the index; the decision of that pass counts the change."""
    fleet, store, drv, step = _told_run()
    step()
    step()
    assert len(fleet.started_steps) == 5  # the floor lets five go; the rest wait
    _skip_unsaid(store)
    decision = step()
    assert drv.index.told
    assert drv.index.differences(RunIndex.build("t", store.upgrades)) != []
    assert decision.counts.skipped == 0  # the kept index's word: behind
    drv.index.passes = FULL_EVERY - 1  # the next pass is a full one
    with caplog.at_level("ERROR"):
        decision = step()
    assert "disagreed with a full pass" in caplog.text
    assert drv.index.differences(RunIndex.build("t", store.upgrades)) == []
    assert (decision.counts.skipped, decision.counts.in_flight) == (1, 5)
    assert len(fleet.started_steps) == 5  # and nothing more was taken out: the floor held


def test_the_index_holds_the_newest_object_of_each_clusterupgrade_and_lets_older_ones_go() -> None:
    """Issue 21's memory: after a status change the index's members by stage are the very
    objects it saw last (no copy of the run as of its last rebuild kept alive), in the same
    engine order, whether the caller said what changed or every object was compared."""
    stages = {"c-5": 2, "c-1": 0, "c-9": 1, "c-3": 0, "c-7": 2, "c-2": 1}  # input order
    upgrades = {
        f"u-{cid}": engine.Upgrade(
            name=f"u-{cid}",
            spec=api.ClusterUpgradeSpec(
                cluster_id=cid,
                stage=f"s{index}",
                stage_index=index,
                version="1.29.4",
                node_version="1.29.4",
                provider="127.0.0.1:9090",
            ),
            status=api.ClusterUpgradeStatus(),
        )
        for cid, index in stages.items()
    }
    index = RunIndex.build("t", upgrades)
    order = {s: [u.name for u in m] for s, m in index.by_stage.items()}
    assert order == {0: ["u-c-1", "u-c-3"], 1: ["u-c-2", "u-c-9"], 2: ["u-c-5", "u-c-7"]}
    gone = []
    for hint in (None, ["u-c-3", "u-c-7"], ["u-c-9"]):
        names = list(upgrades) if hint is None else hint
        for name in names:
            old = upgrades[name]
            gone.append(weakref.ref(old))
            upgrades[name] = with_status(
                old, api.ClusterUpgradeStatus(phase=api.UpgradePhase.SERVICING_OUT, step="x")
            )
        del old
        index.observe("t", dict(upgrades), hint)
        assert {s: [u.name for u in m] for s, m in index.by_stage.items()} == order
        for members in index.by_stage.values():
            for u in members:
                assert u is index.seen[u.name] is upgrades[u.name]
        assert index.differences(RunIndex.build("t", upgrades)) == []
    gc.collect()
    assert [ref() for ref in gone] == [None] * len(gone)  # no older copy is held
    assert index.phases.count(api.UpgradePhase.SERVICING_OUT) == len(upgrades)
