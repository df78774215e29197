"""The adversarial simulation with pre/post-upgrade hooks: the same seeded worlds, adversary and
invariants as test_simulation.py, with hooks drawn into the specs (HTTP or Job, outcomes,
durations and timeouts from a stream of their own) and each replica's hook executor
(tests/sim/hooks.py) lost when the replica crashes. Checked besides every invariant of the
monitor: no hook id ever runs twice; a cluster in a post-upgrade hook (out of service) is bounded
by the hook's timeout (invariant 4)."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from orchestrator import api
from orchestrator.engine.decide import HookObs, HookState
from orchestrator.pipeline.driver import HookRequest
from tests.sim.hooks import HookWorld, MemoryHooks
from tests.sim.invariants import Violation
from tests.sim.model import at
from tests.sim.world import Config, Replica, World

U = api.UpgradePhase
#: Histories per test run (SIM_HOOK_SEEDS to sweep more) and where they start.
SEEDS = int(os.environ.get("SIM_HOOK_SEEDS", "60"))
START = int(os.environ.get("SIM_HOOK_START", "0"))
HISTORY = 40
_JOB = {
    "template": {
        "spec": {"restartPolicy": "Never", "containers": [{"name": "hook", "image": "busybox"}]}
    }
}


class HookedWorld(World):
    """A World whose specs carry hooks and whose replicas run them in memory."""

    def __init__(self, cfg: Config) -> None:
        self.hook_rng = random.Random(cfg.seed * 7919 + 3)
        #: Drift histories must all succeed (invariant 7): their hooks are Jobs (they survive
        #: crashes) that pass in time.
        self.hooks_pass = cfg.profile in ("drift", "none")
        self.hook_world = HookWorld(now=lambda: at(self.now), outcome=self._outcome)
        super().__init__(cfg)
        for rep in self.replicas:
            self._hook(rep)
        self._watch_monitor()

    def _outcome(self, request: Any) -> tuple[bool, float]:
        rng = self.hook_rng
        if self.hooks_pass:
            return True, rng.choice((0.0, 5.0, 20.0))
        passes, seconds = rng.random() < 0.85, rng.choice((0.0, 5.0, 20.0, 60.0, 400.0))
        if not passes or seconds >= api.parse_duration(request.hook.timeout).total_seconds():
            # A hook saying no (or too late) is the world's doing, like a failing check.
            self.adversary.touch(request.cluster_id, "hook")
        return passes, seconds

    def _draw_hook(self) -> dict[str, Any]:
        rng = self.hook_rng
        timeout = "10m" if self.hooks_pass else rng.choice(("30s", "2m", "5m"))
        if self.hooks_pass or rng.random() < 0.5:
            return {"job": {"template": _JOB}, "timeout": timeout}
        return {"http": {"url": "http://127.0.0.1:9/hook"}, "timeout": timeout}

    def draw_spec(
        self, team: str, members: list[str], only: str | None = None
    ) -> api.ClusterVersionSpec:
        spec = super().draw_spec(team, members, only)
        rng = self.hook_rng
        hooks: dict[str, Any] = {}
        if rng.random() < 0.6:
            hooks["preUpgrade"] = self._draw_hook()
        if rng.random() < 0.6:
            hooks["postUpgrade"] = self._draw_hook()
        if not hooks:
            return spec
        strategy = spec.strategy or api.Strategy()
        return spec.model_copy(
            update={
                "strategy": strategy.model_copy(update={"hooks": api.Hooks.model_validate(hooks)})
            }
        )

    def _executor(self) -> MemoryHooks:
        """One process's executor; an HTTP hook it knows nothing of (started by a replica that
        crashed or lost the Lease) fails the cluster as "outcome unknown": the world's doing."""
        world = self

        class Executor(MemoryHooks):
            def observe(self, request: HookRequest) -> HookObs:
                seen = super().observe(request)
                if seen.state == HookState.UNKNOWN and request.hook.http is not None:
                    world.adversary.touch(request.cluster_id, "hook-lost")
                return seen

        return Executor(self.hook_world)

    def _hook(self, rep: Replica) -> None:
        """The replica's drivers get its executor; a crash loses the executor's memory."""
        state = {"hooks": self._executor()}
        driver, crash = rep.driver, rep.crash

        def hooked_driver(run: Any) -> Any:
            drv = driver(run)
            drv.hooks = state["hooks"]
            return drv

        def hooked_crash() -> None:
            crash()
            state["hooks"] = self._executor()

        rep.driver = hooked_driver  # type: ignore[method-assign]
        rep.crash = hooked_crash  # type: ignore[method-assign]

    def _watch_monitor(self) -> None:
        monitor = self.monitor
        bound, after_step = monitor._bound, monitor.after_step

        def hooked_bound(run: str, st: api.ClusterUpgradeStatus, stage: str) -> int:
            if st.phase in (U.PRE_HOOK, U.POST_HOOK):
                spec = self.api.runs[run].spec
                hooks = spec.strategy.hooks if spec.strategy else None
                hook = None
                if hooks is not None:
                    hook = hooks.pre_upgrade if st.phase == U.PRE_HOOK else hooks.post_upgrade
                return int(api.parse_duration(hook.timeout if hook else "10m").total_seconds())
            return bound(run, st, stage)

        def hooked_after_step(label: str, world_changed: bool = False) -> None:
            after_step(label, world_changed)
            twice = self.hook_world.twice()
            if twice:
                raise Violation(
                    "6 no duplicate mutation", f"after {label}: hook {twice[0]} ran twice"
                )

        monitor._bound = hooked_bound  # type: ignore[method-assign]
        monitor.after_step = hooked_after_step  # type: ignore[method-assign]


def _one(seed: int) -> tuple[int, str, list[str]] | None:
    world = HookedWorld(Config.draw(seed, large=False))
    try:
        world.run()
    except Violation as err:
        return seed, str(err), world.history[-HISTORY:]
    return None


@pytest.mark.parametrize("chunk", range(2))
def test_invariants_hold_with_hooks(chunk: int) -> None:
    per = -(-SEEDS // 2)
    first = START + chunk * per
    failures = [f for s in range(first, min(START + SEEDS, first + per)) if (f := _one(s))]
    if failures:
        seed, message, history = failures[0]
        lines = [f"{len(failures)} seed(s) broke an invariant with hooks; the first:", *history]
        lines += [message, *(f"  seed {s}: {m}" for s, m, _ in failures[1:])]
        lines.append(f"replay: SIM_HOOK_SEEDS=1 SIM_HOOK_START={seed} pytest {__file__}")
        pytest.fail("\n".join(lines))


def test_hooks_do_run_in_the_simulation() -> None:
    """The sweep above is not vacuous: hooks of both kinds run, pass and fail."""
    kinds: set[tuple[str, str, bool]] = set()
    for seed in range(START, START + 20):
        world = HookedWorld(Config.draw(seed, large=False))
        try:
            world.run()
        except Violation:
            continue  # reported by the sweep
        kinds |= {(r.kind, r.type, r.passes) for r in world.hook_world.runs}
    assert {(k, t) for k, t, _ in kinds} >= {
        ("preUpgrade", "http"),
        ("preUpgrade", "job"),
        ("postUpgrade", "http"),
        ("postUpgrade", "job"),
    }
    assert {p for _, _, p in kinds} == {True, False}
