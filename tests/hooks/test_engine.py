"""Hook phases through the real RunDriver and engine on a model fleet: preUpgrade before the
service-out (held, still in service), postUpgrade after the checks and before the service-in,
failures and timeouts failing the cluster with the hook's words, restarts (an HTTP hook is never
sent twice; a Job is adopted by its name) and the floor with clusters held in a hook."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from orchestrator import api
from orchestrator.engine.conditions import parse_time
from orchestrator.engine.decide import POST_HOOK, PRE_HOOK, HookObs, hook_id
from orchestrator.pipeline.driver import HookRequest
from orchestrator.pipeline.simulate import T0, simulate
from tests.engine.model import LIFECYCLE, Harness, U, harness, health_checks, make_fleet, spec_for
from tests.sim.hooks import HookWorld, MemoryHooks

NEW = "1.29.1"


def _http(timeout: str = "2m") -> dict[str, Any]:
    return {"http": {"url": "http://127.0.0.1:9/hook"}, "timeout": timeout}


def _job(timeout: str = "2m") -> dict[str, Any]:
    container = {"name": "hook", "image": "busybox", "command": ["true"]}
    template = {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    return {"job": {"template": template}, "timeout": timeout}


def _setup(
    n: int,
    required: int,
    pre: dict[str, Any] | None = None,
    post: dict[str, Any] | None = None,
    outcome: Any = None,
    **extra: Any,
) -> tuple[Harness, HookWorld]:
    fleet = make_fleet(n)
    hooks = {k: v for k, v in (("preUpgrade", pre), ("postUpgrade", post)) if v is not None}
    h = harness(spec_for(fleet, NEW, required=required, hooks=hooks, **extra), fleet)
    world = HookWorld(now=lambda: h.now)
    if outcome is not None:
        world.outcome = outcome
    h.driver.hooks = MemoryHooks(world)
    return h, world


def _order(h: Harness, cid: str) -> list[str]:
    """The phases a cluster went through, in order."""
    return [phase for _, c, phase, _ in h.transitions if c == cid]


def _status(h: Harness, cid: str) -> api.ClusterUpgradeStatus:
    return h.by_cluster()[cid]


def test_pre_and_post_hooks_run_once_each_in_their_place() -> None:
    h, world = _setup(4, required=2, pre=_http(), post=_job(), _healthChecks=health_checks())
    assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert all(c.in_service and c.control_plane_version == NEW for c in h.fleet.clusters.values())
    for cid in h.fleet.clusters:
        assert _order(h, cid) == [
            "PreUpgradeHook",
            "ServicingOut",
            "UpgradingControlPlane",
            "UpgradingNodePools",
            "Verifying",
            "PostUpgradeHook",
            "ServicingIn",
            "Upgraded",
        ]
        assert h.steps_of(cid) == LIFECYCLE
        st = _status(h, cid)
        assert st.hook is not None
        assert st.hook.kind == POST_HOOK
        assert st.hook.phase == api.HookPhase.SUCCEEDED
    assert Counter(r.kind for r in world.runs) == {PRE_HOOK: 4, POST_HOOK: 4}
    assert world.twice() == []
    # Held while its hook runs: the floor counts a cluster in a hook as down.
    assert h.fleet.min_available_in_service >= 2
    assert h.max_held() <= 2


def test_post_hook_runs_after_the_checks_passed() -> None:
    h, world = _setup(2, required=1, post=_http(), _healthChecks=health_checks(success=2))
    assert h.run()
    for cid in h.fleet.clusters:
        run = next(r for r in world.runs if r.cluster_id == cid)
        passes = [e.at for e in h.checker.evaluations if cid in e.clusters and e.passed]
        assert len(passes) >= 2
        assert (run.at - T0).total_seconds() >= max(passes)


def test_failing_pre_hook_fails_the_cluster_in_service_never_drained() -> None:
    def outcome(request: HookRequest) -> tuple[bool, float]:
        return (request.cluster_id != "c00001", 3.0)

    h, _ = _setup(3, required=1, pre=_http(), outcome=outcome, onFailure="Continue")
    assert h.run()
    st = _status(h, "c00001")
    assert st.phase == U.FAILED
    assert st.reason == "PreUpgradeHookFailed"
    assert "http hook said no (exit 1)" in (st.message or "")
    assert st.hook is not None and st.hook.phase == api.HookPhase.FAILED
    assert "c00001" not in h.touched()  # never serviced out, never upgraded
    assert h.fleet.clusters["c00001"].in_service
    assert h.fleet.clusters["c00001"].control_plane_version != NEW
    assert {_status(h, c).phase for c in ("c00000", "c00002")} == {U.UPGRADED}


def test_pre_hook_past_its_timeout_fails_the_cluster() -> None:
    h, world = _setup(
        2,
        required=1,
        pre=_http(timeout="30s"),
        outcome=lambda r: (True, 600.0),
        onFailure="Continue",
    )
    assert h.run()
    for cid in ("c00000", "c00001"):
        st = _status(h, cid)
        assert st.phase == U.FAILED
        assert st.reason == "PreUpgradeHookFailed"
        assert "did not finish within 30s" in (st.message or "")
        assert st.end_time is not None and st.hook is not None
        took = parse_time(st.end_time) - parse_time(st.hook.start_time)
        assert timedelta(seconds=30) < took <= timedelta(seconds=36)
    assert h.touched() == set()
    assert len(world.runs) == 2


def test_failing_post_hook_fails_the_cluster_out_of_service() -> None:
    h, _ = _setup(2, required=1, post=_job(), outcome=lambda r: (r.cluster_id != "c00000", 2.0))
    assert h.run()
    st = _status(h, "c00000")
    assert st.phase == U.FAILED
    assert st.reason == "PostUpgradeHookFailed"
    assert "job hook said no" in (st.message or "")
    assert h.steps_of("c00000") == LIFECYCLE[:-1]  # upgraded, never serviced in
    assert not h.fleet.clusters["c00000"].in_service


def test_http_hook_running_across_a_restart_is_not_sent_again() -> None:
    h, world = _setup(2, required=1, pre=_http(), outcome=lambda r: (True, 60.0))
    assert h.run(until=lambda x: _status(x, "c00000").phase == U.PRE_HOOK)
    hid = hook_id("uid-1", "c00000", PRE_HOOK, 0)
    assert _status(h, "c00000").hook == api.HookStatus(
        kind=PRE_HOOK,
        id=hid,
        start_time=_status(h, "c00000").hook.start_time,  # type: ignore[union-attr]
    )
    h.driver.hooks = MemoryHooks(world)  # the orchestrator restarts: its memory is gone
    assert h.run()
    st = _status(h, "c00000")
    assert st.phase == U.FAILED
    assert st.reason == "PreUpgradeHookFailed"
    assert "hook outcome unknown after a restart; retry the cluster to run it again" in (
        st.message or ""
    )
    assert world.received[hid] == 1
    assert "c00000" not in h.touched()
    # A retry is a new attempt: a new id, sent once, and the cluster goes on.
    h.run(retry=frozenset({"c00000"}))
    assert _status(h, "c00000").phase == U.UPGRADED
    again = hook_id("uid-1", "c00000", PRE_HOOK, 1)
    assert world.received[hid] == 1
    assert world.received[again] == 1
    assert world.twice() == []


def test_job_hook_survives_a_restart_by_its_name() -> None:
    h, world = _setup(2, required=1, pre=_job(), outcome=lambda r: (True, 60.0))
    assert h.run(until=lambda x: _status(x, "c00000").phase == U.PRE_HOOK)
    h.driver.hooks = MemoryHooks(world)  # restart: the Job is still in the apiserver
    assert h.run()
    assert _status(h, "c00000").phase == U.UPGRADED
    assert [r.cluster_id for r in world.runs] == ["c00000", "c00001"]
    assert world.twice() == []


@dataclass
class _DropFirstStart:
    """A process that records the intent, then dies before creating the hook."""

    inner: MemoryHooks
    dropped: list[str] = field(default_factory=list)

    def start(self, request: HookRequest) -> None:
        if not self.dropped:
            self.dropped.append(request.id)
            return
        self.inner.start(request)

    def observe(self, request: HookRequest) -> HookObs:
        return self.inner.observe(request)


def test_job_not_created_before_a_crash_is_created_once_after_it() -> None:
    h, world = _setup(2, required=1, pre=_job())
    h.driver.hooks = _DropFirstStart(MemoryHooks(world))
    assert h.run()
    assert _status(h, "c00000").phase == U.UPGRADED
    assert [r.id for r in world.runs] == [
        hook_id("uid-1", c, PRE_HOOK, 0) for c in ("c00000", "c00001")
    ]


def test_stopping_during_a_pre_hook_never_drains_the_cluster() -> None:
    h, world = _setup(2, required=1, pre=_http(), outcome=lambda r: (True, 30.0))
    assert h.run(until=lambda x: _status(x, "c00000").phase == U.PRE_HOOK)
    h.spec = h.spec.model_copy(update={"state": api.RunState.STOP})
    assert h.run()
    assert h.phase == api.RunPhase.STOPPED
    st = _status(h, "c00000")
    assert st.phase == U.PENDING
    assert st.reason == "RunStopped"
    assert st.hook is not None and st.hook.phase == api.HookPhase.SUCCEEDED
    assert h.touched() == set()
    assert [r.cluster_id for r in world.runs] == ["c00000"]
    # Resumed: the same attempt's hook passed already; it is not run again.
    h.spec = h.spec.model_copy(update={"state": api.RunState.RUN})
    assert h.run()
    assert _status(h, "c00000").phase == U.UPGRADED
    assert [r.cluster_id for r in world.runs] == ["c00000", "c00001"]


def test_clusters_in_a_pre_hook_count_against_the_floor() -> None:
    h, _ = _setup(6, required=4, pre=_http(), outcome=lambda r: (True, 40.0))
    busy = {U.PRE_HOOK, U.SERVICING_OUT, U.UPGRADING_CONTROL_PLANE, U.UPGRADING_NODE_POOLS}
    busy |= {U.VERIFYING, U.SERVICING_IN}
    most: list[int] = []

    def watch(x: Harness) -> bool:
        most.append(sum(1 for p in x.phases().values() if p in busy))
        return False

    assert h.run(until=watch)
    assert h.phase == api.RunPhase.SUCCEEDED
    # Two clusters in their 40 s hooks hold the whole budget: nobody else starts meanwhile.
    assert max(most) == 2
    assert h.fleet.min_available_in_service >= 4


def test_hook_ids_are_deterministic_dns_labels_per_attempt() -> None:
    a = hook_id("3f1c-uid", "projects/p/locations/l/clusters/Prod_East.1", PRE_HOOK, 0)
    assert a == hook_id("3f1c-uid", "projects/p/locations/l/clusters/Prod_East.1", PRE_HOOK, 0)
    assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", a) and len(a) <= 63
    others = {
        hook_id("3f1c-uid", "projects/p/locations/l/clusters/Prod_East.1", PRE_HOOK, 1),
        hook_id("3f1c-uid", "projects/p/locations/l/clusters/Prod_East.1", POST_HOOK, 0),
        hook_id("other-uid", "projects/p/locations/l/clusters/Prod_East.1", PRE_HOOK, 0),
        hook_id("3f1c-uid", "x" * 500, PRE_HOOK, 99999),
    }
    assert a not in others and len(others) == 4
    assert all(len(i) <= 63 for i in others)


def test_a_hook_start_is_never_made_before_its_intent_is_on_record() -> None:
    """The start of a pre-hook follows the write of its HookStatus Running (invariant 6)."""
    h, world = _setup(2, required=1, pre=_http())
    seen: list[api.HookStatus | None] = []
    inner = MemoryHooks(world)

    @dataclass
    class Recording:
        def start(self, request: HookRequest) -> None:
            seen.append(_status(h, request.cluster_id).hook)
            inner.start(request)

        def observe(self, request: HookRequest) -> HookObs:
            return inner.observe(request)

    h.driver.hooks = Recording()
    assert h.run()
    assert len(seen) == 2
    assert all(s is not None and s.phase == api.HookPhase.RUNNING for s in seen)
    assert h.steps_of("c00000") == LIFECYCLE


def test_the_what_if_plan_assumes_hooks_pass() -> None:
    fleet = make_fleet(3)
    spec = spec_for(fleet, NEW, required=2, hooks={"preUpgrade": _job(), "postUpgrade": _http()})
    rollout = simulate(fleet, spec)
    assert rollout.settled and rollout.last is not None
    assert rollout.last.decision.phase == api.RunPhase.SUCCEEDED
    assert {u.status.hook.kind for u in rollout.upgrades.values() if u.status.hook} == {POST_HOOK}


def test_a_cluster_failed_by_its_pre_hook_is_never_taken_for_one_of_ours() -> None:
    """Drained by someone else after its pre-hook failed: neither the failed-cluster policy nor
    a retry services it in or goes on with it as if this run had taken it out."""
    h, _ = _setup(
        3,
        required=1,
        pre=_http(),
        outcome=lambda r: (r.cluster_id != "c00001", 2.0),
        onFailure="Continue",
        failedClusterPolicy="ServiceInIfHealthy",
    )
    assert h.run(until=lambda x: _status(x, "c00001").phase == U.FAILED)
    h.fleet.clusters["c00001"] = replace(h.fleet.clusters["c00001"], in_service=False)
    h.run()
    assert "c00001" not in h.touched()
    assert not h.fleet.clusters["c00001"].in_service
    h.run(retry=frozenset({"c00001"}))
    st = _status(h, "c00001")
    assert st.phase == U.PENDING and st.reason == "OutOfService", st
    assert "c00001" not in h.touched()


def test_a_pre_hook_passing_after_the_run_halted_never_drains_its_cluster() -> None:
    """c00000's pre-hook fails fast and halts the run (no failure budget); c00001's pre-hook,
    running meanwhile, passes later: c00001 stays in service, Pending with the reason."""

    def outcome(r: HookRequest) -> tuple[bool, float]:
        return (False, 5.0) if r.cluster_id == "c00000" else (True, 30.0)

    h, world = _setup(3, required=1, pre=_http(), outcome=outcome, maxConcurrency=2)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    for _ in range(200):  # the halted run is still reconciled: c00001's hook passes
        result = h.step(frozenset(), frozenset(), frozenset())
        if _status(h, "c00001").phase != U.PRE_HOOK:
            break
        h.fleet.now += max(result.requeue_after or 1.0, 0.001)
        h.fleet.advance_to(h.fleet.now)
    assert h.phase == api.RunPhase.HALTED
    assert _status(h, "c00000").phase == U.FAILED
    st = _status(h, "c00001")
    assert st.phase == U.PENDING, st
    assert st.reason == "RunHalted", st
    assert st.hook is not None and st.hook.phase == api.HookPhase.SUCCEEDED
    assert h.touched() == set()  # nothing was ever taken out of service
    assert sorted(r.cluster_id for r in world.runs) == ["c00000", "c00001"]
