"""A run's one plugin down (simulation seeds 81718, 85618): the pass goes on with the run's
clusters unknown, so nothing is decided on them and a step in flight fails at its bound
(invariant 4), as a member of several does (tests/engine/test_multi_provider.py). Before, a
failed inventory read aborted the whole pass, and a cluster stayed out of service past its
bound for as long as the plugin was down."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator import api
from orchestrator.engine.conditions import parse_time
from orchestrator.engine.decide import (
    PROVIDER_UNAVAILABLE,
    UNREACHABLE_GRACE,
    Call,
    Preflight,
)
from orchestrator.engine.observations import OpKind, OpObs, Snapshot
from orchestrator.pipeline.driver import CallError
from orchestrator.pipeline.simulate import T0, ModelFleet
from tests.engine.model import Harness, as_run_spec, health_checks, make_fleet, spec_for

U = api.UpgradePhase
DOWN = CallError("UNAVAILABLE", "connection refused", True)


@dataclass
class Down:
    """The plugin, unreachable: every question fails."""

    fleet: ModelFleet

    @property
    def supports_preflight(self) -> bool:
        return False

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        raise DOWN

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        raise DOWN

    def call(self, call: Call) -> OpObs:
        raise DOWN


def _upgrading(required: int = 3) -> tuple[Harness, str]:
    """A run of 4 clusters, one at a time, stopped with a cluster upgrading its control plane
    (bound 5 minutes)."""
    fleet = make_fleet(4)
    spec = spec_for(fleet, "1.29.1", required, _timeouts={"controlPlane": "5m"})
    h = Harness(fleet, as_run_spec(spec))
    assert h.run(until=lambda h: U.UPGRADING_CONTROL_PLANE in h.phases().values())
    cid = next(c for c, p in h.phases().items() if p == U.UPGRADING_CONTROL_PLANE)
    return h, cid


def _advance(h: Harness, seconds: float) -> None:
    """Step every 10 simulated seconds (the plugin's operations do not end while it is down:
    the fleet is not advanced)."""
    end = h.fleet.now + seconds
    while h.fleet.now < end:
        h.fleet.now += 10.0
        h.step()


def test_a_step_in_flight_waits_for_the_plugin_then_fails_within_its_bound() -> None:
    h, cid = _upgrading()
    started = list(h.fleet.started_steps)
    h.driver.provider = Down(h.fleet)
    _advance(h, 60)
    st = h.by_cluster()[cid]
    # Within its bound: neither failed nor taken for gone; it says what it waits for.
    assert st.phase == U.UPGRADING_CONTROL_PLANE
    assert "waiting for its provider (counted as unavailable)" in (st.message or "")
    assert "its plugin is unavailable (UNAVAILABLE)" in (st.message or "")
    assert h.last is not None and h.last.unreachable is DOWN
    _advance(h, 300)
    st = h.by_cluster()[cid]
    assert (st.phase, st.reason) == (U.FAILED, PROVIDER_UNAVAILABLE)
    assert "did not answer within the step's bound" in (st.message or "")
    # Nothing was asked of it meanwhile, and no other cluster was taken out.
    assert h.fleet.started_steps == started
    assert [c for c, p in h.phases().items() if p in (U.PENDING,)] == [
        c for c in sorted(h.fleet.clusters) if c != cid and not h.steps_of(c)
    ]


def test_pending_clusters_are_not_started_while_the_plugin_is_down_and_go_on_after() -> None:
    h, cid = _upgrading(required=3)
    h.driver.provider = Down(h.fleet)
    _advance(h, 30)
    # The one in flight finishes its steps once the plugin answers; nothing new began before.
    assert {c for c, *_ in h.fleet.started_steps} == {cid}
    h.driver.provider = h.fleet
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert set(h.phases().values()) == {U.UPGRADED}
    assert all(OpKind.SERVICE_IN in h.steps_of(c) for c in h.fleet.clusters)


def test_under_service_in_if_healthy_a_failure_while_down_is_brought_back_once_it_answers() -> None:
    """The last cluster's step fails at its bound while the plugin is down, the other one done:
    within the failure budget the run would end Failed and never be looked at again, leaving
    the cluster out. failedClusterPolicy ServiceInIfHealthy brings it back once the plugin
    answers, so the run does not end before (engine.decide.brought_back)."""
    fleet = make_fleet(2)
    spec = spec_for(
        fleet,
        "1.29.1",
        1,
        failedClusterPolicy="ServiceInIfHealthy",
        maxFailures=1,
        _timeouts={"controlPlane": "5m"},
    )
    h = Harness(fleet, as_run_spec(spec))
    assert h.run(
        until=lambda h: sorted(h.phases().values()) == [U.UPGRADED, U.UPGRADING_CONTROL_PLANE]
    )
    cid = next(c for c, p in h.phases().items() if p == U.UPGRADING_CONTROL_PLANE)
    h.driver.provider = Down(h.fleet)
    _advance(h, 400)
    st = h.by_cluster()[cid]
    assert (st.phase, st.reason) == (U.FAILED, PROVIDER_UNAVAILABLE)
    assert not fleet.clusters[cid].in_service
    assert h.phase not in api.FINISHED_PHASES  # still the run's to bring back
    h.driver.provider = h.fleet
    assert h.run()
    assert fleet.clusters[cid].in_service
    assert h.by_cluster()[cid].phase == U.FAILED  # it stays Failed; it is back in service
    assert h.phase == api.RunPhase.FAILED


def test_one_unanswered_read_as_the_bound_passes_does_not_decide_for_the_next() -> None:
    """Simulation seed 99711: a cluster that left the inventory mid-step waits as gone; its
    plugin failed one inventory read just after the step's bound passed. That one read failed
    the step ProviderUnavailable (a failure against the budget, halting the run), where the next
    read, a poll later, records the drift (Skipped ClusterGone). The step fails for its provider
    only once the provider has not answered for UNREACHABLE_GRACE past the bound."""
    h, cid = _upgrading()
    del h.fleet.clusters[cid]  # gone from the inventory mid-step
    start = parse_time(h.by_cluster()[cid].step_start_time or "")
    h.step()
    assert "not in the plugin's inventory; waiting" in (h.by_cluster()[cid].message or "")
    up = h.driver.provider
    h.driver.provider = Down(h.fleet)
    h.fleet.now = (start - T0).total_seconds() + 301  # the bound (5m) just passed
    h.step()
    st = h.by_cluster()[cid]
    assert st.phase == U.UPGRADING_CONTROL_PLANE, st
    assert "waiting for its provider" in (st.message or "")
    h.driver.provider = up
    h.fleet.now += 2.0
    h.step()
    st = h.by_cluster()[cid]
    assert (st.phase, st.reason) == (U.SKIPPED, "ClusterGone"), st
    # Down for longer than the grace past the bound: it fails for its provider.
    h2, cid2 = _upgrading()
    start2 = parse_time(h2.by_cluster()[cid2].step_start_time or "")
    h2.driver.provider = Down(h2.fleet)
    h2.fleet.now = (start2 - T0).total_seconds() + 301
    h2.step()
    assert h2.by_cluster()[cid2].phase == U.UPGRADING_CONTROL_PLANE
    h2.fleet.now += UNREACHABLE_GRACE.total_seconds() + 1
    h2.step()
    st = h2.by_cluster()[cid2]
    assert (st.phase, st.reason) == (U.FAILED, PROVIDER_UNAVAILABLE), st


def test_a_plugin_that_fails_one_read_in_several_is_not_down() -> None:
    """Simulation seed 137463: a plugin failed every few inventory reads, the others answered.
    A cluster verifying past its step's bound (and the grace) failed ProviderUnavailable at the
    first read that failed, though its provider had answered the read 5 s before; and each
    failed read dropped its health, so its checks never passed meanwhile (seed 1121: past the
    stranding bound). One failed read now misses no evaluation (its health stands), and the
    step fails for its provider only once the run's reads went unanswered for
    UNREACHABLE_GRACE (RunInput.unknown_since), as docs/operations.md ("One provider down")
    promises."""
    fleet = make_fleet(4)
    spec = spec_for(
        fleet,
        "1.29.1",
        3,
        _timeouts={"ready": "2m"},
        _healthChecks=health_checks(interval="10m", success=2, timeout="1h"),
    )
    h = Harness(fleet, as_run_spec(spec))
    assert h.run(until=lambda h: U.VERIFYING in h.phases().values())
    cid = next(c for c, p in h.phases().items() if p == U.VERIFYING)
    start = parse_time(h.by_cluster()[cid].step_start_time or "")
    up = h.driver.provider
    h.fleet.now = (start - T0).total_seconds() + 120 + UNREACHABLE_GRACE.total_seconds() + 5
    h.step()  # answered: its first evaluation (the next is 10 minutes away)
    health = h.by_cluster()[cid].health
    assert health is not None and health.passes == 1
    h.fleet.now += 5.0
    for _ in range(6):  # past the bound and the grace: reads fail and answer in turn
        h.driver.provider = Down(h.fleet)
        h.step()
        st = h.by_cluster()[cid]
        assert st.phase == U.VERIFYING, st
        assert "waiting for its provider" in (st.message or "")
        assert st.health == health  # one failed read misses no evaluation: its passes stand
        h.fleet.now += 5.0
        h.driver.provider = up
        h.step()
        assert h.by_cluster()[cid].phase == U.VERIFYING
        h.fleet.now += 5.0
    # Then down for good: UNREACHABLE_GRACE after the first read it failed, it fails for it.
    h.driver.provider = Down(h.fleet)
    h.step()
    h.fleet.now += UNREACHABLE_GRACE.total_seconds() - 1
    h.step()
    assert h.by_cluster()[cid].phase == U.VERIFYING
    h.fleet.now += 1
    h.step()
    st = h.by_cluster()[cid]
    assert (st.phase, st.reason) == (U.FAILED, PROVIDER_UNAVAILABLE), st
