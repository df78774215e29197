"""Property tests: over random fleets, floors, stages, checks, durations and failures, whole
rollouts through the real driver keep the floor (strictly), the gate and the order of steps.

The adversarial suite (tests/sim) attacks the same code with crashes, lost writes and spec
edits; here the world is calm and the properties are checked on every completed rollout.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator import api
from orchestrator.engine.observations import OpKind
from tests.engine.model import Harness, as_run_spec, health_checks, make_fleet

ORDER = [OpKind.SERVICE_OUT, OpKind.CONTROL_PLANE, OpKind.NODE_POOL, OpKind.SERVICE_IN]
NEW = "1.29.1"
STAGES = ("canary", "early", "main")


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(min_value=2, max_value=60))
    unavailable = draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=3))
    up = n - len(unavailable)
    assume(up >= 1)
    return {
        "n": n,
        # Never above what is up at the start, and below the fleet size (validation).
        "required": draw(st.integers(min_value=1, max_value=min(up, n - 1))),
        "pools": draw(st.integers(min_value=0, max_value=3)),
        "unavailable": unavailable,
        "durations": draw(st.fixed_dictionaries({k: st.integers(1, 4) for k in OpKind})),
        "failures": draw(
            st.sets(st.tuples(st.integers(0, n - 1), st.sampled_from(list(OpKind))), max_size=2)
        ),
        "concurrency": draw(
            st.one_of(st.none(), st.integers(1, 5), st.sampled_from(["10%", "50%"]))
        ),
        "on_failure": draw(st.sampled_from(["Halt", "Continue"])),
        "staged": draw(st.booleans()),
        "checks": draw(st.sampled_from([None, "run", "stage"])),
        "sick": draw(st.sets(st.integers(0, n - 1), max_size=2)),
        "success": draw(st.integers(1, 3)),
    }


def _spec(sc: dict[str, Any], fleet_ids: list[str]) -> api.UpdateRunSpec:
    strategy: dict[str, Any] = {"onFailure": sc["on_failure"]}
    if sc["concurrency"] is not None:
        strategy["maxConcurrency"] = sc["concurrency"]
    checks = health_checks("10s", sc["success"], 2, "10m")
    if sc["staged"]:
        strategy["stages"] = [
            {
                "name": name,
                "selector": {"matchLabels": {"stage": name}},
                **({"healthChecks": checks} if sc["checks"] == "stage" and i < 2 else {}),
            }
            # Labels go round-robin: two clusters carry no "main", and a stage that selects
            # no cluster makes the run Invalid (issue 19), so it is not written.
            for i, name in enumerate(STAGES[: len(fleet_ids)])
        ]
    body: dict[str, Any] = {
        "requiredAvailableCount": sc["required"],
        "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
        "clusters": [{"id": cid, "version": NEW} for cid in fleet_ids],
        "strategy": strategy,
    }
    if sc["checks"] == "run":
        body["healthChecks"] = checks
    return as_run_spec(api.ClusterVersionSpec.model_validate(body))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_rollouts_keep_the_floor_the_gate_and_the_order(sc: dict[str, Any]) -> None:
    n, required = sc["n"], sc["required"]
    fleet = make_fleet(n, pools=sc["pools"], staged=True)
    for i in sc["unavailable"]:
        cid = f"c{i:05d}"
        fleet.clusters[cid] = replace(fleet.clusters[cid], available=False, unavailable_reason="x")
    fleet.durations = {k: float(v) for k, v in sc["durations"].items()}
    fleet.fail = {(f"c{i:05d}", k) for i, k in sc["failures"]}
    fleet.min_available_in_service = 10**9
    fleet.observe()
    assert fleet.min_available_in_service >= required  # the scenario starts at or above it
    sick = {f"c{i:05d}" for i in sc["sick"]}
    h = Harness(fleet, _spec(sc, sorted(fleet.clusters)))
    h.checker.passes = lambda ids, stage: not (set(ids) & sick)
    settled = h.run(max_rounds=20_000)
    message = h.last.decision.message if h.last is not None else ""
    assert settled or "availability budget" in message, f"stalled without a reason: {message}"

    # 1. The floor, strictly: never below requiredAvailableCount.
    assert fleet.min_available_in_service >= required
    # No step twice; per cluster the steps come in lifecycle order.
    assert max(Counter(fleet.started_steps).values(), default=1) == 1
    for cid in fleet.clusters:
        kinds = h.steps_of(cid)
        assert kinds == sorted(kinds, key=ORDER.index), (cid, kinds)
    # 3. The gate: a service-in follows the full upgrade and successThreshold passing
    # evaluations of that cluster in a row; none follows a failing one.
    started = list(zip(fleet.started_steps, fleet.started_at, strict=True))
    for (cid, kind, _, _), at in started:
        if kind is not OpKind.SERVICE_IN:
            continue
        c = fleet.clusters[cid]
        assert c.control_plane_version == NEW and all(p.version == NEW for p in c.node_pools)
        stage_checked = sc["staged"] and sc["checks"] == "stage" and c.labels["stage"] != "main"
        if sc["checks"] == "run" or stage_checked:
            mine = [e for e in h.checker.evaluations if e.clusters == (cid,) and e.at <= at]
            assert len(mine) >= sc["success"] and all(e.passed for e in mine[-sc["success"] :])
    # Stages: no cluster of a later stage is taken out before every earlier one is done.
    if sc["staged"]:
        rank = STAGES.index
        outs = [(at, cid) for (cid, kind, _, _), at in started if kind is OpKind.SERVICE_OUT]
        ends = {cid: t for t, cid, phase, _ in h.transitions if phase in ("Upgraded", "Skipped")}
        for at, cid in outs:
            stage = rank(fleet.clusters[cid].labels["stage"])
            for other, end in ends.items():
                if rank(fleet.clusters[other].labels["stage"]) < stage:
                    assert at >= end, (cid, other)
    # Outcomes.
    failed = {c for c, p in h.phases().items() if p == api.UpgradePhase.FAILED}
    if h.phase == api.RunPhase.SUCCEEDED:
        assert not failed
        assert all(c.control_plane_version == NEW for c in fleet.clusters.values())
        assert all(c.in_service for c in fleet.clusters.values())
    if failed and sc["on_failure"] == "Halt":
        assert h.phase == api.RunPhase.HALTED
    for cid in failed:  # a failed cluster names why
        assert h.by_cluster()[cid].reason and h.by_cluster()[cid].message
