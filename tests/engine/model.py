"""Fleets, specs and a stepping harness for unit tests of the run engine and driver.

The fleet is orchestrator.pipeline.simulate.ModelFleet (the what-if's fleet: operations take a fixed
time, a second operation on a busy cluster is an AssertionError, every started step is recorded).
The harness runs the real `RunDriver` (and so the real `decide`) over it on a simulated clock, the
way `simulate` does, with what `simulate` fixes made settable: the health checker, the people's
annotations per step, the spec between steps and the other runs' holdings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from orchestrator import api
from orchestrator.engine.decide import (
    ACTIVE,
    Decision,
    Floor,
    RunInput,
    Upgrade,
    decide,
    with_status,
)
from orchestrator.engine.initialize import pin_upgrades
from orchestrator.engine.observations import ClusterObs, OpKind, PoolObs
from orchestrator.pipeline.driver import RunDriver, StepResult
from orchestrator.pipeline.simulate import T0, ModelFleet

U = api.UpgradePhase
TERMINAL = frozenset(
    {
        api.RunPhase.SUCCEEDED,
        api.RunPhase.FAILED,
        api.RunPhase.HALTED,
        api.RunPhase.INVALID,
        api.RunPhase.STOPPED,
    }
)
#: The steps of one cluster with two node pools, in lifecycle order.
LIFECYCLE = [
    OpKind.SERVICE_OUT,
    OpKind.CONTROL_PLANE,
    OpKind.NODE_POOL,
    OpKind.NODE_POOL,
    OpKind.SERVICE_IN,
]


def make_fleet(n: int, version: str = "1.28.5", pools: int = 2, staged: bool = False) -> ModelFleet:
    """n clusters c00000...; staged: labels stage=canary/early/main round-robin."""
    clusters = {}
    for i in range(n):
        cid = f"c{i:05d}"
        labels = {"stage": ("canary", "early", "main")[i % 3]} if staged else {}
        clusters[cid] = ClusterObs(
            id=cid,
            control_plane_version=version,
            labels=labels,
            node_pools=tuple(PoolObs(f"pool-{p}", version) for p in range(pools)),
        )
    return ModelFleet(clusters)


def spec_for(
    fleet: ModelFleet, version: str, required: int, **extra: Any
) -> api.ClusterVersionSpec:
    """Every cluster of the fleet to version; extra: strategy fields, or spec fields with a
    leading underscore removed (e.g. _healthChecks=...)."""
    spec = {k[1:]: v for k, v in extra.items() if k.startswith("_")}
    strategy = {k: v for k, v in extra.items() if not k.startswith("_")}
    return api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
            "clusters": [{"id": cid, "version": version} for cid in sorted(fleet.clusters)],
            **({"strategy": strategy} if strategy else {}),
            **spec,
        }
    )


def staged_spec(
    required: int, stages: list[dict[str, Any]], **extra: Any
) -> api.ClusterVersionSpec:
    """Clusters chosen by stage selectors (spec.version as the target)."""
    return api.ClusterVersionSpec.model_validate(
        {
            "requiredAvailableCount": required,
            "version": "1.29.1",
            "opsEndpoint": {"endpoint": "127.0.0.1:9000", "insecure": True},
            "strategy": {"stages": stages, **extra.pop("strategy", {})},
            **extra,
        }
    )


def health_checks(
    interval: str = "10s", success: int = 2, failure: int = 2, timeout: str = "5m"
) -> dict[str, Any]:
    """A healthChecks block with one metric check named "ok"."""
    return {
        "interval": interval,
        "successThreshold": success,
        "failureThreshold": failure,
        "timeout": timeout,
        "checks": [
            {
                "name": "ok",
                "metric": {
                    "provider": {"type": "prometheus", "address": "http://p:9090"},
                    "query": 'up{cluster="{{ cluster }}"}',
                    "thresholdRange": {"min": 1},
                },
            }
        ],
    }


def as_run_spec(spec: api.ClusterVersionSpec) -> api.UpdateRunSpec:
    """The UpdateRun spec of a one-shot run with the ClusterVersion's targets."""
    return api.UpdateRunSpec(
        required_available_count=spec.required_available_count,
        ops_endpoint=spec.ops_endpoint,
        version=spec.version,
        clusters=spec.clusters,
        strategy=spec.strategy,
        health_checks=spec.health_checks,
        timeouts=spec.timeouts,
        skip=spec.skip,
        retry=spec.retry,
    )


def pinned(fleet: ModelFleet, spec: api.ClusterVersionSpec) -> dict[str, Upgrade]:
    """The run's ClusterUpgrades as pinned from the fleet, by cluster id."""
    upgrades = pin_upgrades("run", as_run_spec(spec), fleet.clusters)
    assert not isinstance(upgrades, list), [str(p) for p in upgrades]
    return {u.cluster_id: u for u in upgrades.upgrades}


def decide_once(
    fleet: ModelFleet,
    spec: api.ClusterVersionSpec,
    statuses: Mapping[str, api.ClusterUpgradeStatus] | None = None,
    seconds: float = 0.0,
    **kw: Any,
) -> tuple[Decision, dict[str, Upgrade]]:
    """One decision of run "ns/run" (uid "uid-1") over the fleet, `seconds` after T0;
    statuses: cluster id → a status to start from; kw: RunInput fields (preflight unsupported
    and the fleet's snapshot unless given)."""
    by_id = pinned(fleet, spec)
    for cid, st in (statuses or {}).items():
        by_id[cid] = with_status(by_id[cid], st)
    kw.setdefault("preflight_supported", False)
    kw.setdefault("snapshot", fleet.snapshot())
    inp = RunInput(
        key="ns/run",
        uid="uid-1",
        spec=as_run_spec(spec),
        upgrades={u.name: u for u in by_id.values()},
        now=T0 + timedelta(seconds=seconds),
        **kw,
    )
    return decide(inp), by_id


def status_after(d: Decision, by_id: Mapping[str, Upgrade], cid: str) -> api.ClusterUpgradeStatus:
    """A cluster's ClusterUpgrade status after the decision."""
    u = by_id[cid]
    return d.changed.get(u.name, u.status)


@dataclass(frozen=True)
class Evaluation:
    """One evaluation the checker made: when, of which stage, over which clusters."""

    at: float
    stage: str
    clusters: tuple[str, ...]
    passed: bool


@dataclass
class Checker:
    """The driver's Checker: `passes(cluster ids, stage)` decides; every evaluation recorded."""

    harness: Harness | None = None
    passes: Callable[[tuple[str, ...], str], bool] = lambda ids, stage: True
    evaluations: list[Evaluation] = field(default_factory=list)

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        ids = tuple(c.id for c in clusters)
        ok = self.passes(ids, stage)
        now = self.harness.fleet.now if self.harness is not None else 0.0
        self.evaluations.append(Evaluation(now, stage, ids, ok))
        return [
            api.CheckResult(
                name=c.name,
                passed=ok,
                value=1.0 if ok else 0.0,
                message="value 1 within [1, ∞]" if ok else "value 0 outside [1, ∞]",
            )
            for c in checks.checks
        ]


class _Leader:
    def held(self) -> bool:
        return True


@dataclass
class Harness:
    """One run of the real driver over a ModelFleet, stepped on a simulated clock."""

    fleet: ModelFleet
    spec: api.UpdateRunSpec
    uid: str = "uid-1"
    held_by: dict[str, str] = field(default_factory=dict)
    floors: Sequence[Floor] = ()
    checker: Checker = field(default_factory=Checker)
    upgrades: dict[str, Upgrade] = field(default_factory=dict)
    stages: list[api.StageStatus] = field(default_factory=list)
    last: StepResult | None = None
    #: Every (simulated second, cluster id, new phase, message) transition, in order.
    transitions: list[tuple[float, str, str, str]] = field(default_factory=list)
    #: Every event the decisions asked for: (cluster id, reason, message, warning).
    events: list[tuple[str, str, str, bool]] = field(default_factory=list)
    #: After each step, the clusters held (in an active phase) by the run.
    held: list[frozenset[str]] = field(default_factory=list)
    #: The level-triggered people's annotations: skip-stages, requested-by, reason.
    skip_stages: frozenset[str] = frozenset()
    requested_by: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        pinned = pin_upgrades("run", self.spec, self.fleet.clusters)
        assert not isinstance(pinned, list), [str(p) for p in pinned]
        self.upgrades = {u.name: u for u in pinned.upgrades}
        self.checker.harness = self
        self.driver = RunDriver(self.fleet, self, self.checker, _Leader())

    # -- the driver's UpgradeStore --------------------------------------------------------------

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        """Keep the new status (the model store never conflicts)."""
        self.upgrades[upgrade.name] = with_status(self.upgrades[upgrade.name], status)

    # -- reading ---------------------------------------------------------------------------------

    @property
    def now(self) -> datetime:
        """The simulated wall clock."""
        return T0 + timedelta(seconds=self.fleet.now)

    def by_cluster(self) -> dict[str, api.ClusterUpgradeStatus]:
        """Each pinned cluster's ClusterUpgrade status, by cluster id."""
        return {u.cluster_id: u.status for u in self.upgrades.values()}

    def phases(self) -> dict[str, U]:
        """Each pinned cluster's phase, by cluster id."""
        return {cid: st.phase for cid, st in self.by_cluster().items()}

    def stage(self, name: str) -> api.StageStatus:
        """The run's status of one stage."""
        return next(s for s in self.stages if s.name == name)

    @property
    def phase(self) -> api.RunPhase:
        """The run's phase after the last step."""
        assert self.last is not None
        return self.last.decision.phase

    def max_held(self, among: set[str] | None = None) -> int:
        """The most clusters (of among, or of the run) held at once after any step."""
        return max((len(h if among is None else h & among) for h in self.held), default=0)

    def steps_of(self, cid: str) -> list[OpKind]:
        """The kinds of the steps started on a cluster, in order."""
        return [k for c, k, _, _ in self.fleet.started_steps if c == cid]

    def touched(self) -> set[str]:
        """Clusters on which any step was started."""
        return {c for c, *_ in self.fleet.started_steps}

    # -- stepping --------------------------------------------------------------------------------

    def step(
        self,
        approved: frozenset[str] = frozenset(),
        retry: frozenset[str] = frozenset(),
        skip: frozenset[str] = frozenset(),
    ) -> StepResult:
        """One reconcile at the current simulated time."""
        before = {n: u.status.phase for n, u in self.upgrades.items()}
        self.last = self.driver.step(
            key="ns/run",
            uid=self.uid,
            spec=self.spec,
            upgrades=dict(self.upgrades),
            stages=self.stages,
            held_by=self.held_by,
            now=self.now,
            approved=approved,
            retry=retry,
            skip=skip,
            floors=self.floors,
            skip_stages=self.skip_stages,
            requested_by=self.requested_by,
            reason=self.reason,
        )
        self.stages = list(self.last.decision.stages)
        self.events.extend(self.last.decision.events)
        for name, u in self.upgrades.items():
            if u.status.phase != before[name]:
                self.transitions.append(
                    (self.fleet.now, u.cluster_id, u.status.phase.value, u.status.message or "")
                )
        self.held.append(
            frozenset(u.cluster_id for u in self.upgrades.values() if u.status.phase in ACTIVE)
        )
        return self.last

    def run(
        self,
        approved: frozenset[str] = frozenset(),
        retry: frozenset[str] = frozenset(),
        skip: frozenset[str] = frozenset(),
        until: Callable[[Harness], bool] | None = None,
        max_rounds: int = 20_000,
        horizon: float = 30 * 86400.0,
        quiet: float = 3600.0,
    ) -> bool:
        """Step and jump to the next event until the run settles (True), `until` holds (True)
        or nothing more can happen (False): no event due, or no operation, status change or
        new message for `quiet` simulated seconds while only polling (e.g. for budget).
        Retry and skip are handed over once, as the run controller consumes them; approvals
        stand."""
        last_change, last_message = self.fleet.now, ""
        for _ in range(max_rounds):
            result = self.step(approved, retry, skip)
            retry = skip = frozenset()
            if result.decision.phase in TERMINAL or (until is not None and until(self)):
                return True
            if result.calls_made or result.decision.changed:
                last_change = self.fleet.now
                continue  # decide again at the same instant, as the controller does
            if result.decision.message != last_message or self.fleet.next_completion() is not None:
                last_change, last_message = self.fleet.now, result.decision.message
            elif self.fleet.now - last_change > quiet:
                return False
            wake = (
                None
                if result.requeue_after is None
                else self.fleet.now + max(result.requeue_after, 0.001)
            )
            upcoming = [t for t in (self.fleet.next_completion(), wake) if t is not None]
            if not upcoming or min(upcoming) > horizon:
                return False
            self.fleet.now = min(upcoming)
            self.fleet.advance_to(self.fleet.now)
        raise AssertionError(f"no end after {max_rounds} rounds: {self.phase}")


def harness(spec: api.ClusterVersionSpec, fleet: ModelFleet, **kw: Any) -> Harness:
    """A harness for a ClusterVersion-shaped spec."""
    return Harness(fleet, as_run_spec(spec), **kw)


def per_pool(cluster: ClusterObs) -> Mapping[str, str]:
    """A cluster's node pool versions by pool name."""
    return {p.name: p.version for p in cluster.node_pools}
