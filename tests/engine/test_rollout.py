"""Whole rollouts through the real RunDriver and engine on a model fleet: the floor, the order of
steps, stages, soak, approval, node pools, concurrency, failures, retries and pause."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from orchestrator import api
from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.simulate import simulate
from tests.engine.model import (
    LIFECYCLE,
    U,
    harness,
    health_checks,
    make_fleet,
    per_pool,
    spec_for,
    staged_spec,
)

NEW = "1.29.1"


def _select(*stages: str) -> dict[str, object]:
    return {"matchExpressions": [{"key": "stage", "operator": "In", "values": list(stages)}]}


def test_rollout_converges_and_keeps_the_floor_exactly() -> None:
    fleet = make_fleet(20)
    h = harness(spec_for(fleet, NEW, required=15), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert all(c.control_plane_version == NEW for c in fleet.clusters.values())
    assert all(p.version == NEW for c in fleet.clusters.values() for p in c.node_pools)
    assert all(c.in_service for c in fleet.clusters.values())
    assert fleet.min_available_in_service == 15  # the whole budget used, never more
    assert h.max_held() == 5
    assert max(Counter(fleet.started_steps).values()) == 1, "a step was started twice"
    assert h.last is not None
    assert h.last.decision.counts == api.RunCounts(total=20, upgraded=20)
    assert set(h.phases().values()) == {U.UPGRADED}


def test_steps_run_in_order_and_each_transition_is_one_event() -> None:
    fleet = make_fleet(4)
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    assert h.run()
    lifecycle = [
        "ServicingOut",
        "UpgradingControlPlane",
        "UpgradingNodePools",
        "ServicingIn",
        "Upgraded",
    ]
    for cid in fleet.clusters:
        assert h.steps_of(cid) == LIFECYCLE
        mine = [(phase, warning) for c, phase, _, warning in h.events if c == cid]
        assert mine == [(p, False) for p in lifecycle], (cid, mine)
        assert [p for _, c, p, _ in h.transitions if c == cid] == lifecycle


def test_a_failed_step_halts_and_touches_no_other_cluster() -> None:
    fleet = make_fleet(10)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=9), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    assert h.touched() == {"c00000"}
    failed = h.by_cluster()["c00000"]
    assert failed.phase == U.FAILED and failed.reason == "OperationFailed"
    assert "injected failure" in (failed.message or "")
    assert h.last is not None and "c00000" in h.last.decision.message
    assert not fleet.clusters["c00000"].in_service  # left out: nothing verified it
    assert {cid: p for cid, p in h.phases().items() if cid != "c00000"} == {
        f"c{i:05d}": U.PENDING for i in range(1, 10)
    }
    # Nothing moves on its own afterwards.
    before = len(fleet.started_steps)
    h.step()
    h.step()
    assert len(fleet.started_steps) == before and h.phase == api.RunPhase.HALTED


def test_on_failure_continue_upgrades_the_rest_and_ends_failed() -> None:
    fleet = make_fleet(10)
    fleet.fail.add(("c00003", OpKind.NODE_POOL))
    h = harness(spec_for(fleet, NEW, required=8, onFailure="Continue"), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.FAILED
    phases = h.phases()
    assert phases.pop("c00003") == U.FAILED
    assert set(phases.values()) == {U.UPGRADED}
    assert fleet.min_available_in_service >= 8
    assert h.last is not None and h.last.decision.counts.failed == 1


def test_a_failed_cluster_waits_for_a_retry_which_is_a_new_attempt() -> None:
    fleet = make_fleet(3)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    before = len(fleet.started_steps)
    again = h.step()
    assert again.decision.calls == [] and len(fleet.started_steps) == before
    fleet.fail.clear()
    retried = h.step(retry=frozenset({"c00000"}))
    # The failed attempt took it out of service: the retry goes on from there (no second
    # service-out), with request ids of attempt 1.
    assert [c.kind for c in retried.decision.calls] == [OpKind.CONTROL_PLANE]
    assert retried.decision.calls[0].request_id.endswith(":1")
    assert retried.decision.retried == {"c00000"}
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    st = h.by_cluster()["c00000"]
    assert st.phase == U.UPGRADED and st.attempt == 1
    assert h.steps_of("c00000") == [
        OpKind.SERVICE_OUT,
        OpKind.CONTROL_PLANE,  # attempt 0, failed
        OpKind.CONTROL_PLANE,  # attempt 1
        OpKind.NODE_POOL,
        OpKind.NODE_POOL,
        OpKind.SERVICE_IN,
    ]
    assert all(h.steps_of(c) == LIFECYCLE for c in ("c00001", "c00002"))
    # A retry naming a cluster that is not Failed is inert.
    inert = h.step(retry=frozenset({"c00000"}))
    assert inert.decision.calls == [] and h.by_cluster()["c00000"].attempt == 1


def test_a_retry_that_fails_again_stays_failed() -> None:
    fleet = make_fleet(3)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    assert h.run()
    assert h.run(retry=frozenset({"c00000"}))
    st = h.by_cluster()["c00000"]
    assert st.phase == U.FAILED and st.attempt == 1
    assert h.phase == api.RunPhase.HALTED
    attempts = [k for c, k, *_ in fleet.started_steps if c == "c00000"]
    assert attempts == [OpKind.SERVICE_OUT, OpKind.CONTROL_PLANE, OpKind.CONTROL_PLANE]
    before = len(fleet.started_steps)
    for _ in range(3):  # without a new retry nothing is asked again
        assert h.step().decision.calls == []
    assert len(fleet.started_steps) == before
    assert h.by_cluster()["c00000"].attempt == 1


def test_stages_run_in_order_one_after_the_other() -> None:
    fleet = make_fleet(9, staged=True)
    stages: list[dict[str, Any]] = [
        {"name": n, "selector": {"matchLabels": {"stage": n}}} for n in ("canary", "early", "main")
    ]
    h = harness(staged_spec(6, stages), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    rank = ["canary", "early", "main"].index
    starts = {
        cid: at
        for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT
    }
    order = [fleet.clusters[c].labels["stage"] for c in starts]
    assert order == sorted(order, key=rank)
    ends = {cid: t for t, cid, phase, _ in h.transitions if phase == "Upgraded"}
    for cid, start in starts.items():
        stage = rank(fleet.clusters[cid].labels["stage"])
        earlier = [ends[c] for c in ends if rank(fleet.clusters[c].labels["stage"]) < stage]
        assert all(start >= end for end in earlier), cid
    assert [s.phase for s in h.stages] == [api.StagePhase.COMPLETED] * 3
    assert [(s.total, s.upgraded) for s in h.stages] == [(3, 3)] * 3


def test_manual_approval_holds_the_stage_until_approved() -> None:
    fleet = make_fleet(6, staged=True)
    stages: list[dict[str, Any]] = [
        {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}},
        {"name": "rest", "selector": _select("early", "main"), "approval": "Manual"},
    ]
    h = harness(staged_spec(3, stages), fleet)
    assert not h.run()  # nothing more happens without a person
    assert h.last is not None and h.last.decision.current_stage == "rest"
    assert h.stage("rest").phase == api.StagePhase.AWAITING_APPROVAL
    assert api.ANNOTATION_APPROVE_STAGES in h.last.decision.message
    rest = {c for c, o in fleet.clusters.items() if o.labels["stage"] != "canary"}
    assert not h.touched() & rest
    assert h.run(approved=frozenset({"rest"}))
    assert h.phase == api.RunPhase.SUCCEEDED
    assert h.touched() >= rest


def test_soak_delays_the_next_stage_by_exactly_the_soak_time() -> None:
    fleet = make_fleet(6, staged=True)
    stages: list[dict[str, Any]] = [
        {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}, "soakTime": "10m"},
        {"name": "rest", "selector": _select("early", "main"), "soakTime": "1h"},
    ]
    h = harness(staged_spec(3, stages), fleet)
    assert h.run(until=lambda x: x.stage("canary").phase == api.StagePhase.SOAKING)
    canary_done = max(t for t, _, phase, _ in h.transitions if phase == "Upgraded")
    assert h.last is not None and "soaking" in h.last.decision.message
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    rest_start = min(
        at
        for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT and fleet.clusters[cid].labels["stage"] != "canary"
    )
    assert rest_start == canary_done + 600
    rest_done = max(t for t, _, phase, _ in h.transitions if phase == "Upgraded")
    assert fleet.now == rest_done  # no soak after the last stage


def test_node_pools_reach_their_own_targets() -> None:
    fleet = make_fleet(3, pools=3)
    c0 = fleet.clusters["c00000"]
    fleet.clusters["c00000"] = replace(
        c0, node_pools=(*c0.node_pools[:2], replace(c0.node_pools[2], version="1.29.0"))
    )
    spec = api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": 2,
            "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
            "clusters": [
                {
                    "id": "c00000",
                    "version": NEW,
                    "nodeVersion": "1.29.0",
                    "nodePools": [{"name": "pool-1", "version": "1.28.9"}],
                },
                {"id": "c00001", "version": NEW},
                {"id": "c00002", "version": NEW, "nodeVersion": "1.29.0"},
            ],
        }
    )
    h = harness(spec, fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert per_pool(fleet.clusters["c00000"]) == {
        "pool-0": "1.29.0",
        "pool-1": "1.28.9",
        "pool-2": "1.29.0",
    }
    assert per_pool(fleet.clusters["c00001"]) == dict.fromkeys(["pool-0", "pool-1", "pool-2"], NEW)
    assert set(per_pool(fleet.clusters["c00002"]).values()) == {"1.29.0"}
    pool_steps = [(p, v) for c, k, p, v in fleet.started_steps if c == "c00000" and p]
    assert pool_steps == [("pool-0", "1.29.0"), ("pool-1", "1.28.9")]  # pool-2 was at target


def test_max_concurrency_as_count_and_percent() -> None:
    for value, expected in ((3, 3), ("25%", 2), ("5%", 1), ("100%", 10)):
        fleet = make_fleet(10)
        h = harness(spec_for(fleet, NEW, required=1, maxConcurrency=value), fleet)
        assert h.run()
        assert h.phase == api.RunPhase.SUCCEEDED
        cap = min(expected, 9)  # the floor (1 of 10) caps it too
        assert h.max_held() == cap, value
        assert fleet.min_available_in_service == 10 - cap, value


def test_a_stage_max_concurrency_overrides_the_strategy() -> None:
    fleet = make_fleet(9, staged=True)
    stages: list[dict[str, Any]] = [
        {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}, "maxConcurrency": 1},
        {"name": "rest", "selector": _select("early", "main")},
    ]
    h = harness(staged_spec(1, stages, strategy={"maxConcurrency": 4}), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    canary = {c for c, o in fleet.clusters.items() if o.labels["stage"] == "canary"}
    assert h.max_held(canary) == 1
    assert h.max_held(set(fleet.clusters) - canary) == 4


def test_pause_admits_nothing_new_and_lets_the_clusters_in_flight_finish() -> None:
    fleet = make_fleet(10)
    spec = spec_for(fleet, NEW, required=7)
    paused = spec.model_copy(update={"strategy": api.Strategy(paused=True)})
    h = harness(paused, fleet)
    first = h.step()
    assert first.decision.calls == [] and h.touched() == set()
    h.spec = harness(spec, fleet).spec
    assert h.run(until=lambda x: len(x.touched()) == 3)
    in_flight = h.touched()
    h.spec = harness(paused, fleet).spec
    assert not h.run()  # settles with the others waiting
    assert h.touched() == in_flight
    assert {c for c, p in h.phases().items() if p == U.UPGRADED} == in_flight
    assert all(fleet.clusters[c].in_service for c in in_flight)
    assert h.phase == api.RunPhase.PROGRESSING
    h.spec = harness(spec, fleet).spec
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED


def test_health_checks_gate_each_service_in() -> None:
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=3, _healthChecks=health_checks(interval="10s", success=3))
    h = harness(spec, fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    for cid in fleet.clusters:
        mine = [e for e in h.checker.evaluations if e.clusters == (cid,)]
        assert len(mine) == 3, (cid, mine)  # exactly successThreshold evaluations
        assert [e.at - mine[0].at for e in mine] == [0, 10, 20]
        service_in = next(
            at
            for (c, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
            if c == cid and kind is OpKind.SERVICE_IN
        )
        assert service_in == mine[-1].at  # not before the last pass
        assert h.by_cluster()[cid].health is not None
        assert h.by_cluster()[cid].health.passes == 3  # type: ignore[union-attr]


def test_an_unhealthy_cluster_fails_out_of_service_and_halts() -> None:
    fleet = make_fleet(4)
    spec = spec_for(fleet, NEW, required=3, _healthChecks=health_checks(success=3, failure=2))
    h = harness(spec, fleet)
    h.checker.passes = lambda ids, stage: ids != ("c00000",)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    st = h.by_cluster()["c00000"]
    assert st.phase == U.FAILED and st.reason == "HealthCheckFailed"
    assert "value 0 outside [1, ∞]" in (st.message or "")
    assert OpKind.SERVICE_IN not in h.steps_of("c00000")
    assert not fleet.clusters["c00000"].in_service
    assert h.touched() == {"c00000"}
    assert len([e for e in h.checker.evaluations if e.clusters == ("c00000",)]) == 2


def test_stage_checks_gate_the_next_stage() -> None:
    fleet = make_fleet(6, staged=True)
    stages: list[dict[str, Any]] = [
        {
            "name": "canary",
            "selector": {"matchLabels": {"stage": "canary"}},
            "healthChecks": health_checks(interval="30s", success=2),
        },
        {"name": "rest", "selector": _select("early", "main")},
    ]
    h = harness(staged_spec(3, stages), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    canary = tuple(sorted(c for c, o in fleet.clusters.items() if o.labels["stage"] == "canary"))
    stage_evals = [e for e in h.checker.evaluations if e.clusters == canary]
    assert len(stage_evals) == 2 and stage_evals[1].at - stage_evals[0].at == 30
    rest_start = min(
        at
        for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True)
        if kind is OpKind.SERVICE_OUT and cid not in canary
    )
    assert rest_start == stage_evals[-1].at
    # the rest stage has no checks of its own: its clusters are serviced in unverified
    assert all(
        len(e.clusters) == 1 and e.clusters[0] in canary
        for e in h.checker.evaluations
        if e not in stage_evals
    )


def test_failing_stage_checks_halt_before_the_next_stage() -> None:
    fleet = make_fleet(6, staged=True)
    stages: list[dict[str, Any]] = [
        {
            "name": "canary",
            "selector": {"matchLabels": {"stage": "canary"}},
            "healthChecks": health_checks(success=2, failure=2),
        },
        {"name": "rest", "selector": _select("early", "main")},
    ]
    h = harness(staged_spec(3, stages), fleet)
    h.checker.passes = lambda ids, stage: len(ids) == 1  # each cluster passes, the stage not
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    assert h.stage("canary").phase == api.StagePhase.FAILED
    canary = {c for c, o in fleet.clusters.items() if o.labels["stage"] == "canary"}
    assert h.touched() == canary
    assert all(fleet.clusters[c].in_service for c in canary)
    assert h.last is not None and "canary" in h.last.decision.message


def test_the_what_if_runs_the_same_driver_and_finishes_withhealth_checks() -> None:
    fleet = make_fleet(10, staged=True)
    stages: list[dict[str, Any]] = [
        {"name": "canary", "selector": {"matchLabels": {"stage": "canary"}}},
        {"name": "rest", "selector": _select("early", "main")},
    ]
    spec = staged_spec(7, stages, healthChecks=health_checks(interval="30s", success=3))
    outcome = simulate(fleet, spec)
    assert outcome.settled and outcome.last is not None
    assert outcome.last.decision.phase == api.RunPhase.SUCCEEDED
    assert fleet.min_available_in_service == 7
    assert all(c.control_plane_version == NEW for c in fleet.clusters.values())
