"""A what-if rollout: the real run driver and engine against an in-memory fleet on a simulated
clock (`fleet-orchestrator plan`). Health checks are assumed to pass when evaluated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from orchestrator import api
from orchestrator.engine.decide import (
    Call,
    HookObs,
    HookState,
    Preflight,
    Upgrade,
    Verdict,
    with_status,
)
from orchestrator.engine.initialize import pin_upgrades
from orchestrator.engine.observations import ClusterObs, OpKind, OpObs, OpState, Snapshot
from orchestrator.pipeline.driver import HookRequest, RunDriver, StepResult

__all__ = ["T0", "ModelFleet", "Rollout", "simulate"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_TERMINAL = frozenset(
    {api.RunPhase.SUCCEEDED, api.RunPhase.FAILED, api.RunPhase.HALTED, api.RunPhase.INVALID}
)


@dataclass
class ModelFleet:
    """Clusters plus operations that take a fixed time per step; records every step started."""

    clusters: dict[str, ClusterObs]
    durations: Mapping[OpKind, float] = field(default_factory=lambda: dict.fromkeys(OpKind, 2.0))
    fail: set[tuple[str, OpKind]] = field(default_factory=set)
    ops: dict[str, OpObs] = field(default_factory=dict)
    ends_at: dict[str, float] = field(default_factory=dict)
    by_request: dict[str, str] = field(default_factory=dict)
    started_steps: list[tuple[str, OpKind, str, str]] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    min_available_in_service: int = 10**9

    def __post_init__(self) -> None:
        self.observe()

    def snapshot(self, cluster_ids: Sequence[str] = ()) -> Snapshot:
        """What ListClusters and the operation watch would show now."""
        return Snapshot(dict(self.clusters), {op.request_id: op for op in self.ops.values()})

    now: float = 0.0

    # -- the driver's Provider ------------------------------------------------------------

    @property
    def supports_preflight(self) -> bool:
        """The model accepts every upgrade (what-if assumes the provider agrees)."""
        return True

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        """Always accepted."""
        return Preflight(Verdict.ACCEPTED, T0 + timedelta(seconds=self.now))

    def call(self, call: Call) -> OpObs:
        """One mutating call at the current simulated time."""
        return self.execute(call, self.now)

    def execute(self, action: Call, now: float) -> OpObs:
        """Start (or, for a known request id, return) the operation of a call."""
        if action.request_id in self.by_request:
            return self.ops[self.by_request[action.request_id]]
        cluster = self.clusters[action.cluster_id]
        current = cluster.current_operation
        if current is not None and not current.state.terminal:
            raise AssertionError(f"second operation on {action.cluster_id} while one runs")
        op = OpObs(
            id=f"op-{len(self.ops) + 1}",
            kind=action.kind,
            cluster_id=action.cluster_id,
            state=OpState.RUNNING,
            request_id=action.request_id,
            node_pool=action.node_pool,
            target_version=action.version,
        )
        self.started_steps.append(
            (action.cluster_id, action.kind, action.node_pool, action.version)
        )
        self.started_at.append(now)
        self.ops[op.id] = op
        self.by_request[action.request_id] = op.id
        self.ends_at[op.id] = now + self.durations[action.kind]
        self.clusters[action.cluster_id] = replace(cluster, current_operation=op)
        return op

    def next_completion(self) -> float | None:
        """When the next running operation ends."""
        return min(self.ends_at.values(), default=None)

    def advance_to(self, now: float) -> None:
        """Finish every operation due by now."""
        for op_id, end in sorted(self.ends_at.items(), key=lambda kv: kv[1]):
            if end > now:
                continue
            del self.ends_at[op_id]
            op = self.ops[op_id]
            c = replace(self.clusters[op.cluster_id], current_operation=None)
            if (op.cluster_id, op.kind) in self.fail:
                self.ops[op_id] = replace(
                    op,
                    state=OpState.FAILED,
                    error_code="UPGRADE_FAILED",
                    error_message="injected failure",
                )
                self.clusters[op.cluster_id] = c
                continue
            self.ops[op_id] = replace(op, state=OpState.SUCCEEDED)
            if op.kind is OpKind.SERVICE_OUT:
                c = replace(c, in_service=False)
            elif op.kind is OpKind.SERVICE_IN:
                c = replace(c, in_service=True)
            elif op.kind is OpKind.CONTROL_PLANE:  # an upgrade heals an unavailable cluster
                c = replace(c, control_plane_version=op.target_version, available=True)
            else:
                c = replace(
                    c,
                    node_pools=tuple(
                        replace(p, version=op.target_version) if p.name == op.node_pool else p
                        for p in c.node_pools
                    ),
                )
            self.clusters[op.cluster_id] = c
        self.observe()

    def observe(self) -> None:
        """Track the lowest count of clusters available and in service."""
        count = sum(1 for c in self.clusters.values() if c.available and c.in_service)
        self.min_available_in_service = min(self.min_available_in_service, count)


@dataclass
class _Store:
    """In-memory ClusterUpgrades (the what-if has no apiserver)."""

    upgrades: dict[str, Upgrade]

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        self.upgrades[upgrade.name] = with_status(self.upgrades[upgrade.name], status)


class _Passing:
    """Every check passes (the what-if's assumption)."""

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        return [api.CheckResult(name=c.name, passed=True) for c in checks.checks]


class _Leader:
    def held(self) -> bool:
        return True


class _PassingHooks:
    """Every hook passes at once (the what-if's assumption, like the checks)."""

    def start(self, request: HookRequest) -> None:
        return None

    def observe(self, request: HookRequest) -> HookObs:
        return HookObs(HookState.SUCCEEDED, "assumed to pass")


@dataclass
class Rollout:
    """The outcome of a simulated rollout."""

    last: StepResult | None
    seconds: float
    rounds: int
    settled: bool
    upgrades: Mapping[str, Upgrade] = field(default_factory=dict)
    stages: Sequence[api.StageStatus] = ()
    problems: Sequence[str] = ()


def simulate(
    fleet: ModelFleet,
    spec: api.ClusterVersionSpec,
    approved: frozenset[str] = frozenset(),
    max_rounds: int = 100_000,
    uid: str = "sim",
    horizon_seconds: float = 30 * 86400.0,
) -> Rollout:
    """Decide, act and jump to the next event until the rollout settles or stalls."""
    run_spec = api.UpdateRunSpec(
        required_available_count=spec.required_available_count,
        ops_endpoint=spec.ops_endpoint,
        provider_ref=spec.provider_ref,
        version=spec.version,
        clusters=spec.clusters,
        strategy=spec.strategy,
        health_checks=spec.health_checks,
        timeouts=spec.timeouts,
    )
    pinned = pin_upgrades("plan", run_spec, fleet.clusters)
    if isinstance(pinned, list):
        return Rollout(None, 0.0, 0, False, problems=[str(p) for p in pinned])
    store = _Store({u.name: u for u in pinned.upgrades})
    driver = RunDriver(fleet, store, _Passing(), _Leader(), hooks=_PassingHooks())
    stages: list[api.StageStatus] = []
    last: StepResult | None = None
    for rounds in range(max_rounds):
        last = driver.step(
            key="plan",
            uid=uid,
            spec=run_spec,
            upgrades=dict(store.upgrades),
            stages=stages,
            held_by={},
            now=T0 + timedelta(seconds=fleet.now),
            approved=approved,
        )
        stages = last.decision.stages
        if last.decision.phase in _TERMINAL:
            return Rollout(last, fleet.now, rounds, True, store.upgrades, stages)
        if last.calls_made or last.decision.changed:
            continue  # decide again at the same instant, as the controller does
        wake = None if last.requeue_after is None else fleet.now + max(last.requeue_after, 0.001)
        upcoming = [t for t in (fleet.next_completion(), wake) if t is not None]
        if not upcoming or min(upcoming) > horizon_seconds:
            return Rollout(last, fleet.now, rounds, False, store.upgrades, stages)
        fleet.now = min(upcoming)
        fleet.advance_to(fleet.now)
    return Rollout(last, fleet.now, max_rounds, False, store.upgrades, stages)
