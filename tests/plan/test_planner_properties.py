"""Property tests: over random fleets, budgets, durations and failures the invariants hold."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.fleet import OpKind
from orchestrator.simulate import simulate
from tests.plan.model import make_fleet, spec_for

ORDER = [OpKind.SERVICE_OUT, OpKind.CONTROL_PLANE, OpKind.NODE_POOL, OpKind.SERVICE_IN]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, object]:
    n = draw(st.integers(min_value=2, max_value=25))
    return {
        "n": n,
        "required": draw(st.integers(min_value=1, max_value=n - 1)),
        "pools": draw(st.integers(min_value=0, max_value=3)),
        "unavailable": draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=3)),
        "durations": draw(st.fixed_dictionaries({k: st.integers(1, 4) for k in OpKind})),
        "failures": draw(
            st.sets(st.tuples(st.integers(0, n - 1), st.sampled_from(list(OpKind))), max_size=2)
        ),
        "concurrency": draw(
            st.one_of(st.none(), st.integers(1, 5), st.sampled_from(["10%", "50%"]))
        ),
        "on_failure": draw(st.sampled_from(["Halt", "Continue"])),
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants_hold(sc: dict[str, object]) -> None:
    n, pools = int(sc["n"]), int(sc["pools"])  # type: ignore[call-overload]
    fleet = make_fleet(n, pools=pools)
    for i in sc["unavailable"]:  # type: ignore[attr-defined]
        cid = f"c{i:05d}"
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False, unavailable_reason="x")
    fleet.durations = {k: float(v) for k, v in sc["durations"].items()}  # type: ignore[call-overload]
    fleet.fail = {(f"c{i:05d}", k) for i, k in sc["failures"]}  # type: ignore[attr-defined]
    fleet.min_available_in_service = 10**9
    fleet.observe()
    initial = fleet.min_available_in_service
    strategy: dict[str, object] = {"onFailure": sc["on_failure"]}
    if sc["concurrency"] is not None:
        strategy["maxConcurrency"] = sc["concurrency"]
    required = int(sc["required"])  # type: ignore[call-overload]
    outcome = simulate(fleet, spec_for(fleet, "1.29.1", required, **strategy), max_rounds=5000)
    result = outcome.last
    stalled_on_budget = "no availability budget" in (result.status.conditions or [])[0].message
    assert outcome.settled or stalled_on_budget, "neither finished nor stalled for a reason"

    # The floor: never below the requirement unless it started below it.
    assert fleet.min_available_in_service >= min(required, initial)
    # No step twice; per cluster the steps come in lifecycle order.
    assert max(Counter(fleet.started_steps).values(), default=1) == 1
    for cid in fleet.clusters:
        kinds = [k for c, k, _, _ in fleet.started_steps if c == cid]
        assert kinds == sorted(kinds, key=ORDER.index)
    failed = {e.id for e in result.status.clusters or [] if e.phase == api.ClusterPhase.FAILED}
    if (not fleet.fail or not failed) and result.status.phase == api.RolloutPhase.COMPLETED:
        assert all(c.control_plane_version == "1.29.1" for c in fleet.clusters.values())
    if failed and sc["on_failure"] == "Halt":
        assert result.status.phase == api.RolloutPhase.HALTED
    # A cluster whose ServiceIn started was upgraded fully first.
    for cid, kind, _, _ in fleet.started_steps:
        if kind is OpKind.SERVICE_IN:
            c = fleet.clusters[cid]
            assert c.control_plane_version == "1.29.1"
            assert all(p.version == "1.29.1" for p in c.node_pools)
