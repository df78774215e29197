"""An in-memory `driver.HookRunner` for the simulation and the hook tests, faithful to
orchestrator/adapters/hooks.py where it matters to the invariants:

- HTTP hooks live in the memory of the process that started them (`MemoryHooks`): a crash
  (`crash()`, or a new `MemoryHooks` for a new incarnation) loses them, and `observe` then
  answers UNKNOWN, as the product's executor does after a restart.
- Job hooks live in the shared model apiserver (`HookWorld.jobs`): a start of an existing name
  adopts it (orchestrator/adapters/hooks.py `_start_job`: AlreadyExists), so they survive crashes; a
  Job still running at its activeDeadlineSeconds (Hook.timeout) fails with DeadlineExceeded, as the
  job controller does (kubernetes pkg/controller/job/job_controller.go, the active-deadline
  check: the Job ends Failed with reason DeadlineExceeded).

`HookWorld.runs` is the ground truth of every hook that actually ran (one entry per execution),
so a test or an invariant can check that no id ran twice.

tests/sim/test_hooks.py plugs it into the simulation without touching world.py (a World
subclass): one `HookWorld` per world, one `MemoryHooks` per replica incarnation (a new one when
the replica crashes) set as `RunDriver.hooks`, `strategy.hooks` drawn into the specs, the
monitor's invariant-4 bound of PreUpgradeHook/PostUpgradeHook = Hook.timeout, `twice() == []`
after every step, and a failing, late or lost (UNKNOWN HTTP) hook marks its cluster as touched
by the world (invariant 7).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestrator import api
from orchestrator.engine.decide import HookObs, HookState
from orchestrator.pipeline.driver import HookRequest

__all__ = ["HookRun", "HookWorld", "MemoryHooks"]

#: (passes, seconds it takes) for a request; the default passes after 5 s.
Outcome = Callable[[HookRequest], tuple[bool, float]]


@dataclass(frozen=True)
class HookRun:
    """One execution of a hook (ground truth)."""

    id: str
    kind: str
    cluster_id: str
    type: str
    at: datetime
    passes: bool
    ends: datetime


@dataclass
class HookWorld:
    """What outlives a process: the Jobs (model apiserver) and the log of executions."""

    now: Callable[[], datetime]
    outcome: Outcome = lambda request: (True, 5.0)
    jobs: dict[str, HookRun] = field(default_factory=dict)
    runs: list[HookRun] = field(default_factory=list)
    #: HTTP requests received, by id (the receiver's view: what the Idempotency-Key saw).
    received: dict[str, int] = field(default_factory=dict)

    def execute(self, request: HookRequest, type_: str) -> HookRun:
        """Run the hook once: record it and decide its outcome."""
        passes, seconds = self.outcome(request)
        at = self.now()
        deadline = request.start_time + api.parse_duration(request.hook.timeout)
        run = HookRun(
            request.id,
            request.kind,
            request.cluster_id,
            type_,
            at,
            passes,
            at + timedelta(seconds=seconds),
        )
        if type_ == "job" and run.ends > deadline:
            run = HookRun(run.id, run.kind, run.cluster_id, type_, at, False, deadline)
        self.runs.append(run)
        return run

    def twice(self) -> list[str]:
        """Ids that ran more than once (must stay empty)."""
        seen: dict[str, int] = {}
        for r in self.runs:
            seen[r.id] = seen.get(r.id, 0) + 1
        return sorted(i for i, n in seen.items() if n > 1)

    def next_end(self) -> datetime | None:
        """When the next running hook ends (for a simulated clock's jump)."""
        now = self.now()
        ends = [r.ends for r in self.runs if r.ends > now]
        return min(ends) if ends else None


@dataclass
class MemoryHooks:
    """One process's hook executor (driver.HookRunner)."""

    world: HookWorld
    http: dict[str, HookRun] = field(default_factory=dict)

    def crash(self) -> None:
        """The process dies: every HTTP outcome it knew is gone."""
        self.http.clear()

    def start(self, request: HookRequest) -> None:
        """Start once per id: HTTP in this process's memory, a Job in the apiserver."""
        if request.hook.http is not None:
            if request.id not in self.http:
                self.http[request.id] = self.world.execute(request, "http")
                self.world.received[request.id] = self.world.received.get(request.id, 0) + 1
            return
        if request.id not in self.world.jobs:  # AlreadyExists: adopt
            self.world.jobs[request.id] = self.world.execute(request, "job")

    def observe(self, request: HookRequest) -> HookObs:
        """The outcome once the hook's time has come; UNKNOWN when nothing is known."""
        run = (self.http if request.hook.http is not None else self.world.jobs).get(request.id)
        if run is None:
            return HookObs(HookState.UNKNOWN)
        if self.world.now() < run.ends:
            return HookObs(HookState.RUNNING)
        if run.passes:
            return HookObs(HookState.SUCCEEDED, "ok")
        return HookObs(HookState.FAILED, f"{run.type} hook said no (exit 1)")
