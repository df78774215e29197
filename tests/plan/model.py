"""A discrete-time model of a fleet that executes planner actions, for planner property tests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from orchestrator import api
from orchestrator.fleet import ClusterObs, OpKind, OpObs, OpState, PoolObs, Snapshot
from orchestrator.plan import Action, Plan, PlanInput, plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class ModelFleet:
    """Clusters plus operations that finish after a number of ticks; counts what it is asked."""

    clusters: dict[str, ClusterObs]
    durations: dict[OpKind, int] = field(default_factory=lambda: dict.fromkeys(OpKind, 2))
    fail: set[tuple[str, OpKind]] = field(default_factory=set)
    ops: dict[str, OpObs] = field(default_factory=dict)
    remaining: dict[str, int] = field(default_factory=dict)
    by_request: dict[str, str] = field(default_factory=dict)
    started_steps: list[tuple[str, str, str, str]] = field(default_factory=list)
    min_available_in_service: int = 10**9

    def snapshot(self) -> Snapshot:
        return Snapshot(dict(self.clusters), dict(self.ops))

    def execute(self, action: Action) -> OpObs:
        if action.request_id in self.by_request:
            return self.ops[self.by_request[action.request_id]]
        cluster = self.clusters[action.cluster_id]
        current = cluster.current_operation
        assert current is None or current.state.terminal, f"second op on {action.cluster_id}"
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
        self.ops[op.id] = op
        self.by_request[action.request_id] = op.id
        self.remaining[op.id] = self.durations[action.kind]
        self.clusters[action.cluster_id] = replace(cluster, current_operation=op)
        return op

    def tick(self) -> None:
        for op_id, left in list(self.remaining.items()):
            if left > 1:
                self.remaining[op_id] = left - 1
                continue
            del self.remaining[op_id]
            op = self.ops[op_id]
            c = self.clusters[op.cluster_id]
            if (op.cluster_id, op.kind) in self.fail:
                self.ops[op_id] = replace(
                    op,
                    state=OpState.FAILED,
                    error_code="UPGRADE_FAILED",
                    error_message="injected failure",
                )
                self.clusters[op.cluster_id] = replace(c, current_operation=None)
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
            self.clusters[op.cluster_id] = replace(c, current_operation=None)
        self.observe()

    def observe(self) -> None:
        count = sum(1 for c in self.clusters.values() if c.available and c.in_service)
        self.min_available_in_service = min(self.min_available_in_service, count)


def make_fleet(
    n: int, version: str = "1.28.5", pools: int = 2, labels_every: int = 0
) -> ModelFleet:
    clusters = {}
    for i in range(n):
        cid = f"c{i:05d}"
        labels = {"stage": ("canary", "early", "main")[i % 3]} if labels_every else {}
        clusters[cid] = ClusterObs(
            id=cid,
            control_plane_version=version,
            labels=labels,
            node_pools=tuple(PoolObs(f"pool-{p}", version) for p in range(pools)),
        )
    fleet = ModelFleet(clusters)
    fleet.observe()
    return fleet


def spec_for(
    fleet: ModelFleet, version: str, required: int, **strategy: object
) -> api.ClusterVersionSpec:
    return api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
            "clusters": [{"id": cid, "version": version} for cid in sorted(fleet.clusters)],
            **({"strategy": strategy} if strategy else {}),
        }
    )


def run(
    fleet: ModelFleet,
    spec: api.ClusterVersionSpec,
    max_ticks: int = 500,
    approved: frozenset[str] = frozenset(),
) -> tuple[Plan, int]:
    """Plan, execute, tick until the plan is quiet and complete or halted; return last plan, ticks."""
    status = None
    now = T0
    last: Plan | None = None
    for tick in range(max_ticks):
        last = plan(
            PlanInput(
                spec=spec,
                snapshot=fleet.snapshot(),
                now=now,
                status=status,
                approved_stages=approved,
            )
        )
        entries = {e.id: e for e in last.status.clusters or []}
        for action in last.actions:
            op = fleet.execute(action)
            entries[action.cluster_id] = entries[action.cluster_id].model_copy(
                update={"operation_id": op.id}
            )
        status = last.status.model_copy(
            update={"clusters": [entries[k] for k in sorted(entries)] or None}
        )
        if (
            not last.actions
            and not fleet.remaining
            and last.requeue_after is None
            and (
                last.status.phase == api.RolloutPhase.PROGRESSING
                and "no availability budget" in last.status.conditions[0].message  # type: ignore[index]
            )
        ):
            return last, tick
        if (
            last.status.phase
            in (
                api.RolloutPhase.COMPLETED,
                api.RolloutPhase.HALTED,
                api.RolloutPhase.FAILED,
                api.RolloutPhase.INVALID,
            )
            and not last.actions
            and not fleet.remaining
        ):
            return last, tick
        fleet.tick()
        now += timedelta(seconds=1)
    assert last is not None
    return last, max_ticks
