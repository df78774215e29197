"""Seeded histories of rollouts with hooks through the real driver and engine: random hook kinds
(HTTP or Job), outcomes, durations and timeouts, and orchestrator restarts at random steps (the
executor's memory lost). After every step: the floor holds; no hook id ever ran twice. At the
end: every service-out followed a passed pre-hook of that cluster, every service-in a passed
post-hook, a cluster whose pre-hook failed was never touched, and every cluster settled."""

from __future__ import annotations

import random
from typing import Any

import pytest

from orchestrator import api
from orchestrator.engine.decide import POST_HOOK, PRE_HOOK
from orchestrator.engine.observations import OpKind
from orchestrator.pipeline.driver import HookRequest
from orchestrator.pipeline.simulate import T0
from tests.engine.model import Harness, U, harness, make_fleet, spec_for
from tests.sim.hooks import HookWorld, MemoryHooks

NEW = "1.29.1"


def _hook(rng: random.Random) -> dict[str, Any]:
    timeout = rng.choice(("20s", "1m", "5m"))
    if rng.random() < 0.5:
        return {"http": {"url": "http://127.0.0.1:9/h"}, "timeout": timeout}
    container = {"name": "h", "image": "busybox"}
    template = {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    return {"job": {"template": template}, "timeout": timeout}


@pytest.mark.parametrize("seed", range(40))
def test_hooks_hold_their_promises_over_seeded_histories(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(3, 9)
    required = rng.randint(1, n - 1)
    fleet = make_fleet(n, pools=rng.randint(0, 2))
    hooks: dict[str, Any] = {}
    if rng.random() < 0.8:
        hooks["preUpgrade"] = _hook(rng)
    if rng.random() < 0.8 or not hooks:
        hooks["postUpgrade"] = _hook(rng)
    spec = spec_for(
        fleet,
        NEW,
        required=required,
        hooks=hooks,
        onFailure="Continue",
        # A cluster failed by its post-hook goes back in once healthy, so the floor frees up.
        failedClusterPolicy="ServiceInIfHealthy",
        maxConcurrency=rng.choice((1, 2, 3, "50%")),
    )
    h: Harness = harness(spec, fleet)
    fail_rate = rng.choice((0.0, 0.2, 0.5))

    def outcome(request: HookRequest) -> tuple[bool, float]:
        return (rng.random() >= fail_rate, rng.choice((0.0, 3.0, 15.0, 45.0, 400.0)))

    world = HookWorld(now=lambda: h.now, outcome=outcome)
    h.driver.hooks = MemoryHooks(world)
    crashes = 0

    def check(x: Harness) -> bool:
        nonlocal crashes
        assert world.twice() == [], f"seed {seed}: a hook ran twice"
        assert fleet.min_available_in_service >= required, f"seed {seed}: floor broken"
        if rng.random() < 0.05:
            x.driver.hooks = MemoryHooks(world)  # the orchestrator restarts
            crashes += 1
        return False

    assert h.run(until=check), f"seed {seed}: the run never settled ({h.phase})"
    phases = h.phases()
    assert set(phases.values()) <= {U.UPGRADED, U.FAILED}, f"seed {seed}: {phases}"
    runs = {(r.cluster_id, r.kind): r for r in world.runs}
    final = h.by_cluster()
    for (cid, kind, _, _), at in zip(fleet.started_steps, fleet.started_at, strict=True):
        when = T0.timestamp() + at
        hook_kind = {OpKind.SERVICE_OUT: PRE_HOOK, OpKind.SERVICE_IN: POST_HOOK}.get(kind)
        if hook_kind is None or hook_kind not in hooks:
            continue
        if hook_kind == POST_HOOK and final[cid].phase != U.UPGRADED:
            continue  # a failed cluster serviced back in by the policy, without its hook
        run = runs.get((cid, hook_kind))
        assert run is not None and run.passes, f"seed {seed}: {kind} of {cid} without its hook"
        assert run.ends.timestamp() <= when, f"seed {seed}: {kind} of {cid} before its hook ended"
    for cid, st in final.items():
        if st.reason == "PreUpgradeHookFailed":
            assert cid not in h.touched(), f"seed {seed}: {cid} drained after its pre-hook failed"
            assert fleet.clusters[cid].in_service
        if st.phase == U.FAILED:
            assert st.reason in ("PreUpgradeHookFailed", "PostUpgradeHookFailed"), st
            assert st.hook is not None and st.hook.phase == api.HookPhase.FAILED
        else:
            assert fleet.clusters[cid].control_plane_version == NEW
        assert fleet.clusters[cid].in_service, f"seed {seed}: {cid} left out of service"
