"""A what-if rollout: the real planner driven against an in-memory fleet on a simulated clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from orchestrator import api
from orchestrator.fleet import ClusterObs, OpKind, OpObs, OpState, Snapshot
from orchestrator.plan import Action, Plan, PlanInput, compact_entries, plan

__all__ = ["T0", "ModelFleet", "Rollout", "simulate"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_TERMINAL = frozenset(
    {
        api.RolloutPhase.COMPLETED,
        api.RolloutPhase.HALTED,
        api.RolloutPhase.FAILED,
        api.RolloutPhase.INVALID,
    }
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

    def snapshot(self) -> Snapshot:
        """What ListClusters and the operation watch would show now."""
        return Snapshot(dict(self.clusters), {op.request_id: op for op in self.ops.values()})

    def execute(self, action: Action, now: float) -> OpObs:
        """Start (or, for a known request id, return) the operation of an action."""
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
class Rollout:
    """The outcome of a simulated rollout."""

    last: Plan
    seconds: float
    rounds: int
    settled: bool


def simulate(
    fleet: ModelFleet,
    spec: api.ClusterVersionSpec,
    approved: frozenset[str] = frozenset(),
    max_rounds: int = 100_000,
    uid: str = "sim",
    horizon_seconds: float = 30 * 86400.0,
) -> Rollout:
    """Plan, act and jump to the next completion until the rollout settles or stalls."""
    status: api.ClusterVersionStatus | None = None
    now = 0.0
    last: Plan | None = None
    for rounds in range(max_rounds):
        last = plan(
            PlanInput(
                spec=spec,
                snapshot=fleet.snapshot(),
                now=T0 + timedelta(seconds=now),
                status=status,
                approved_stages=approved,
                uid=uid,
            )
        )
        entries = last.status.entries()
        for action in last.actions:
            op = fleet.execute(action, now)
            entries[action.cluster_id] = entries[action.cluster_id].model_copy(
                update={"operation_id": op.id}
            )
        status = last.status.model_copy(update=compact_entries(entries))
        if last.actions:
            continue  # plan again at the same instant, as the reconciler does
        upcoming = [t for t in (fleet.next_completion(), _wake(now, last)) if t is not None]
        if not upcoming or min(upcoming) > horizon_seconds:
            return Rollout(last, now, rounds, last.status.phase in _TERMINAL)
        now = min(upcoming)
        fleet.advance_to(now)
    assert last is not None
    return Rollout(last, now, max_rounds, False)


def _wake(now: float, last: Plan) -> float | None:
    return None if last.requeue_after is None else now + max(last.requeue_after, 0.001)
