"""One simulated history: the model world, the controllers around the real driver, the clock.

The controllers here stand in for the product's UpdateRun and ClusterVersion controllers: they
pin runs with `orchestrator.engine.initialize`, compute holdings from the store, call
`orchestrator.pipeline.driver.RunDriver.step` (the real observe → decide → persist → call pipeline
with the real `orchestrator.engine.decide`), and write the run's status once, conditionally.
Preconditions the product's controllers must keep, stated here because the simulation relies on
them: runs sharing a provider are reconciled one at a time, and holdings are read from the
apiserver with this replica's own writes visible (read-your-writes). Other runs (their floors,
and the ClusterVersion controller's view of them) are read from each replica's lagging
UpdateRun watch cache (model.RunCache; tests/sim/README.md).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator import api
from orchestrator.engine.conditions import format_time
from orchestrator.engine.decide import ACTIVE, Call, Floor, Preflight, Upgrade, rests
from orchestrator.engine.index import holds_cluster
from orchestrator.engine.initialize import live_fields, pin_upgrades, run_for, superseded
from orchestrator.engine.observations import OpObs, Snapshot
from orchestrator.engine.requester import handover
from orchestrator.engine.validate import Problem
from orchestrator.pipeline import deletion
from orchestrator.pipeline.crossrun import (
    Holding,
    holding,
    neighbours,
    pinned_provider,
    provider_identity,
)
from orchestrator.pipeline.driver import CallError, RunDriver, WriteConflict
from orchestrator.pipeline.multi import Member, MultiProvider, neighbours_across, pin_across, route
from tests.sim.adversary import Adversary
from tests.sim.invariants import Monitor, Violation
from tests.sim.model import (
    Crash,
    CvObj,
    Lease,
    LostWrite,
    MCluster,
    ModelApiServer,
    ModelChecker,
    ModelFence,
    ModelFleet,
    ModelProvider,
    MOp,
    MPool,
    RunCache,
    RunObj,
    StoreClient,
    at,
)
from tests.sim.people import (
    SETS,
    People,
    Person,
    admit,
    run_annotations,
    run_requester,
)
from tests.support.starting import BatchesAtOnce, InlineExecutor, StartsAtOnce

ENDPOINT = "sim-plugin:9000"
#: The addresses one model plugin is reached by (a Service's short and fully qualified names,
#: its ClusterIP): owners draw one each, so runs on one provider spell it differently.
ALIASES = (ENDPOINT, "sim-plugin.fleet-system.svc.cluster.local:9000", "10.96.0.12:9000")
#: The model plugin's GetPluginInfo (name, fleet_id): one provider whatever the address.
PLUGIN = ("sim.fleetupgrade.io", "model-fleet")
#: The FleetProviders of a history over several providers (Config.providers > 1), as
#: (FleetProvider name, plugin name, fleet id): cluster i belongs to member i mod providers,
#: every run names all of them (spec.providerRefs) and goes through the product's
#: orchestrator.pipeline.multi.MultiProvider.over one `MemberView` each (MEMBER_VIEWS).
MEMBERS = (
    ("gke-prod", "gke.fleetupgrade.io", "projects/model"),
    ("eks-prod", "eks.fleetupgrade.io", "111122223333"),
    ("aks-prod", "aks.fleetupgrade.io", "subscriptions/model"),
)
BASE = ("1.28.2", "1.28.7")
OLD = "1.27.9"  # two minors behind 1.29: the provider refuses a skip
TARGETS = ("1.29.3", "1.29.5")
OFFERED = ("1.29.3", "1.29.5", "1.30.1")
RINGS = ("canary", "early", "main")
TEAMS = ("blue", "green", "red")
#: Runs the simulated controllers no longer reconcile unless edited (finished, or found Invalid
#: when pinned, which the model never fixes).
FINISHED = api.FINISHED_PHASES | {api.RunPhase.INVALID}
#: Simulated seconds without a phase change after which a quiet world counts as settled
#: (longer than any wait between two phase changes: health checks time out within 5m, a
#: stage's checks pass or fail within 5m of its last member finishing).
QUIET_SETTLE = 420
CHECKS = {
    "interval": "10s",
    "checks": [{"name": "app", "workloads": {"items": [{"namespace": "default", "name": "app"}]}}],
}


@dataclass
class Owner:
    """Who asks for rollouts: a ClusterVersion, or a person applying UpdateRuns directly."""

    namespace: str
    name: str
    kind: str  # "cv" | "run"
    spec: api.ClusterVersionSpec


@dataclass
class Config:
    """Everything a history is made of, drawn from its seed."""

    seed: int
    clusters: int = 10
    pools_max: int = 2
    old_fraction: float = 0.1
    owners: int = 1
    overlap: bool = False
    preflight: bool = True
    replicas: int = 2
    shared_driver: bool = False
    profile: str = "noisy"  # calm | noisy | hostile | drift | none
    active_seconds: int = 1800
    short_timeouts: bool = True
    health: bool = True
    stages: bool = True
    #: Shortest requeue the controllers honour (a rate limit; large fleets use 10 s); the end
    #: of an operation wakes its run at once (the watch).
    min_requeue: int = 5
    #: Longest quiet phase (simulated seconds); a world not settled by then is checked as is.
    quiet_cap: int = 6 * 3600
    #: FleetProviders the fleet is split over (MEMBERS); 1: one plugin, as before issue 22.
    providers: int = 1
    #: What the controllers tell the driver changed since its last pass (RunDriver.step's
    #: `changed`, as the UpdateRun controller says it from its kept cache, issue 21): "never"
    #: (every object compared) or "exact". A caller whose word misses changes while it hands
    #: fresh objects breaks RunDriver.step's contract; tests/engine/test_index.py covers it
    #: (the floor holds; the full pass repairs the index).
    told: str = "never"
    #: How each replica makes a pass's writes and calls: "sequential" (one at a time, the
    #: driver's parallelism 1), or as the product does (the UpdateRun controller: several at
    #: once, no stop at the first conflict), in one deterministic order
    #: (tests.support.starting.InlineExecutor), with requests the driver "started" from its
    #: thread (driver.StartsRequests) or "batched" too (driver.StartsBatches, as the gRPC
    #: adapter does).
    passes: str = "sequential"

    @staticmethod
    def draw(seed: int, large: bool = True) -> Config:
        """The history of a seed; large=False keeps fleets at 120 clusters or fewer."""
        rng = random.Random(seed * 7919 + 1)
        roll = rng.random()
        if roll < 0.004 and large:
            n = rng.choice((500, 2000))
        elif roll < 0.06:
            n = rng.randint(41, 120)
        elif roll < 0.30:
            n = rng.randint(26, 40)
        else:
            n = rng.randint(5, 25)
        big = n > 120
        profile = rng.choices(("calm", "noisy", "hostile", "drift"), (3, 4, 3, 1))[0]
        # Runs over several providers: a stream of its own (the other draws stay what they
        # were), a fifth of the histories of up to 120 clusters; not drift (its liveness
        # check wants every run to succeed, and an outage may fail a cluster in flight).
        multi = random.Random(seed * 9173 + 68)
        providers = 1
        if not big and profile != "drift" and multi.random() < 0.2:
            providers = multi.choice((2, 3, 3))
        # What the driver is told changed: a stream of its own too.
        told = random.Random(seed * 6271 + 21).choice(("never", "exact"))
        # How a pass makes its writes and calls: a stream of its own too.
        passes = random.Random(seed * 3181 + 13).choice(("sequential", "started", "batched"))
        return Config(
            told=told,
            passes=passes,
            providers=providers,
            seed=seed,
            min_requeue=10 if big else 5,
            quiet_cap=1200 if big else 6 * 3600,
            clusters=n,
            pools_max=1 if big else rng.randint(0, 2),
            old_fraction=0.0 if profile == "drift" else rng.choice((0.0, 0.0, 0.05, 0.15)),
            owners=1 if profile == "drift" or big else rng.choice((1, 1, 2, 2, 3)),
            overlap=rng.random() < 0.7,
            preflight=rng.random() < 0.9,
            replicas=1 if big else rng.choice((1, 2, 2)),
            shared_driver=rng.random() < 0.3,
            profile="calm" if big else profile,
            active_seconds=600 if big else rng.choice((600, 900, 1200)),
            short_timeouts=rng.random() < 0.7,
            health=rng.random() < 0.7,
            stages=rng.random() < 0.7,
        )


#: A parallel history's pass width (Config.passes): below a pass's usual number of writes, so
#: that the driver's windows fill and turn over.
PARALLELISM = 4


class StartingProvider(StartsAtOnce, ModelProvider):
    """The model plugin whose calls and preflights the driver starts (driver.StartsRequests):
    each is made, the adversary's faults included, when started; its answer or error is
    handed over when the driver asks."""


class BatchingProvider(BatchesAtOnce, ModelProvider):
    """The same, started in batches too (driver.StartsBatches, as the gRPC adapter)."""


#: The model plugin of each Config.passes.
PROVIDERS: dict[str, type[ModelProvider]] = {
    "sequential": ModelProvider,
    "started": StartingProvider,
    "batched": BatchingProvider,
}


class SimDriver(RunDriver):
    """The real driver; it tells the model checker when it evaluates a stage's checks, so the
    monitor keeps a stage's evaluations apart from its members' own (both name the stage)."""

    def _evaluate_stages(self, *args: Any, **kwargs: Any) -> list[api.StageStatus]:
        checker = self.checker
        assert isinstance(checker, ModelChecker)
        checker.scope = "stage"
        try:
            return super()._evaluate_stages(*args, **kwargs)
        finally:
            checker.scope = "cluster"


class Replica:
    """One orchestrator process: its drivers (and their preflight caches) and its store client."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.fence = ModelFence(world.lease, name)
        self.provider = PROVIDERS[world.cfg.passes](
            world.fleet, world.adversary, world.monitor, name, world.cfg.preflight
        )
        self.store = StoreClient(world.api, world.adversary)
        #: A history over several providers: each FleetProvider's plugin as this replica
        #: reaches it (its operation tracker is the replica's: `provider`).
        self.members = [
            Member(
                name,
                f"{name}-plugin:9000",
                provider_identity(plugin, fleet, f"{name}-plugin:9000"),
                MEMBER_VIEWS[world.cfg.passes](world, self.provider, name),
            )
            for name, plugin, fleet in MEMBERS[: world.cfg.providers]
        ]
        #: Its UpdateRun watch cache: other runs' floors and phases, and the ClusterVersion
        #: controller's view of the runs, come from here (orchestrator.controllers.updaterun,
        #: .clusterversion).
        self.runs = RunCache()
        self.drivers: dict[str, RunDriver] = {}
        #: By run, the driver its upgrades were last handed to and those upgrades (what it is
        #: told changed is what differs from them: World.told).
        self.handed: dict[str, tuple[RunDriver, dict[str, Upgrade]]] = {}
        self.incarnation = 0

    def epoch(self) -> int:
        return self.incarnation

    def crash(self) -> None:
        """The process dies and restarts: memory gone, everything resumes from the store."""
        self.incarnation += 1
        self.world.lease.electors[self.name].restart()
        self.drivers.clear()
        self.handed.clear()
        self.store.rvs.clear()
        self.provider.ended.clear()
        self.provider.following = False
        self.runs.relist(self.world.api)

    def driver(self, run: RunObj) -> RunDriver:
        key = "*" if self.world.cfg.shared_driver else run.key
        drv = self.drivers.get(key)
        if drv is None:
            drv = SimDriver(
                provider=self.provider,
                store=self.store.view(run.namespace),
                checker=self._checker(run.key),
                fence=self.fence,
            )
            if self.world.cfg.passes != "sequential":
                drv.parallelism, drv.executor = PARALLELISM, InlineExecutor()
            self.drivers[key] = drv
        # One driver may serve several runs (shared_driver): point it at this run's namespace
        # and health log (the preflight cache is the driver's own memory).
        drv.store = self.store.view(run.namespace)
        drv.checker = self._checker(run.key)
        return drv

    def _checker(self, run: str) -> ModelChecker:
        w = self.world
        return ModelChecker(w.fleet, w.adversary, w.monitor.record, run, self.name, self.epoch)


class MemberView:
    """`driver.Provider` of one FleetProvider of a history over several: the model plugin,
    answering for that provider's clusters only, unreachable (every call UNAVAILABLE, before
    acting) while the adversary has the provider down (`World.outages`)."""

    def __init__(self, world: World, base: ModelProvider, name: str) -> None:
        self.world = world
        self.base = base
        self.name = name

    def _reach(self, method: str) -> None:
        if self.world.outages.get(self.name, -1) > self.world.now:
            raise CallError("UNAVAILABLE", f"{method}: {self.name} unreachable (injected)", True)

    @property
    def supports_preflight(self) -> bool:
        return self.base.supports_preflight

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        self._reach("ListClusters")
        mine = [c for c in cluster_ids if self.world.member_of.get(c) == self.name]
        snap = self.base.snapshot(mine)
        self.world.monitor.inventory_read(self.name)
        return snap

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        self._reach("PreflightUpgrade")
        return self.base.preflight(cluster_id, version, pools)

    def call(self, call: Call) -> OpObs:
        self._reach(call.kind.value)
        return self.base.call(call)


class StartingMemberView(StartsAtOnce, MemberView):
    """A member whose calls and preflights the driver starts (driver.StartsRequests, as the
    gRPC adapter each FleetProvider is reached by): MultiProvider.over then makes the run's
    view the product's StartingMultiProvider. A member down hands its UNAVAILABLE over when
    its answer is asked for."""


class BatchingMemberView(BatchesAtOnce, MemberView):
    """The same, started in batches of its own clusters too (driver.StartsBatches)."""


#: Each member's view of each Config.passes: the way its runs' passes reach it.
MEMBER_VIEWS: dict[str, type[MemberView]] = {
    "sequential": MemberView,
    "started": StartingMemberView,
    "batched": BatchingMemberView,
}


def _selects(stage: dict[str, object], labels: Mapping[str, str]) -> bool:
    """The product's selector matching (api.LabelSelector), on a drawn stage."""
    return api.LabelSelector.model_validate(stage["selector"]).matches(labels)


class World:
    """A seeded history: build, run the active phase with the adversary, then a quiet phase."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        #: Draws of the operating features (issue 12): budgets, policy, notBefore, windows. A
        #: stream of its own, so the histories of the other draws stay what they were.
        self.ops_rng = random.Random(cfg.seed * 7727 + 11)
        #: Which owners of a history over several providers use one of them alone.
        self.multi_rng = random.Random(cfg.seed * 5153 + 7)
        #: Which address of the plugin each owner uses: a stream of its own too.
        self.alias_rng = random.Random(cfg.seed * 6007 + 3)
        #: How late each UpdateRun watch event reaches each replica: a stream of its own too.
        self.lag_rng = random.Random(cfg.seed * 4801 + 5)
        #: Who writes the objects (the cast, a stream of its own) and what each wrote.
        self.people = People(cfg.seed)
        #: Who is writing now: a replica's name (its controllers' writes reach its own cache at
        #: once), or None (a person, the world: every cache learns by the watch).
        self.actor: str | None = None
        self.now = 0
        self.history: list[str] = []
        #: Cluster id → its FleetProvider (MEMBERS) in a history over several providers.
        self.member_of: dict[str, str] = {}
        #: FleetProvider name → until when the adversary keeps its plugin unreachable.
        self.outages: dict[str, int] = {}
        self.fleet = ModelFleet(self._clusters(), OFFERED)
        self.api = ModelApiServer()
        self.lease = Lease(cfg.seed, [f"r{i}" for i in range(cfg.replicas)])
        self.monitor = Monitor(self)
        self.adversary = Adversary(self, cfg.profile)
        self.fleet.fate = self.adversary.fate
        self.fleet.on_effect = self.monitor.on_effect
        self.fleet.on_end = self._watch_event
        self.api.on_write = self.monitor.on_write
        self.api.on_run_write = self.monitor.on_run_write
        self.api.on_run_event = self._run_event
        self.lease.on_flip = lambda holder: self.log(f"lease → {holder}")
        self.replicas = [Replica(self, f"r{i}") for i in range(cfg.replicas)]
        self.lease.on_lost = self._lost_lease
        self.log(f"clocks: {self.lease.describe()}")
        self.due: dict[str, int] = {}
        #: When the world last changed by the adversary's hand (or its going quiet), and when
        #: each run last had a pass that completed: the world is not settled before every live
        #: run has looked at the world as it is now (seed 4197). Both are positions in one
        #: sequence of happenings, not seconds: a pass earlier in the same second as the change
        #: (the adversary going quiet after that second's passes) did not see it.
        self._happenings = 0
        self.world_changed_at = 0
        self.last_pass: dict[str, int] = {}
        self.owners: list[Owner] = []
        self.timeouts = (
            api.StepTimeouts(
                service_out="2m", control_plane="15m", node_pool="15m", service_in="2m", ready="5m"
            )
            if cfg.short_timeouts
            else None
        )
        self.run_counter = 0
        self.hooks: list[tuple[int, Callable[[World], None], str]] = []
        self._wanted: dict[tuple[str, int], tuple[str, api.UpdateRunSpec]] = {}
        for i in range(cfg.owners):
            self.add_owner(i)

    # -- building ------------------------------------------------------------------------

    def _clusters(self) -> list[MCluster]:
        out = []
        for i in range(self.cfg.clusters):
            old = self.rng.random() < self.cfg.old_fraction
            version = OLD if old else self.rng.choice(BASE)
            pools = {
                f"pool-{p}": MPool(f"pool-{p}", version)
                for p in range(self.rng.randint(0, self.cfg.pools_max))
            }
            labels = {"ring": self.rng.choice(RINGS), "team": self.rng.choice(TEAMS)}
            out.append(MCluster(f"c{i:04d}", version, pools, labels))
            if self.cfg.providers > 1:
                self.member_of[f"c{i:04d}"] = MEMBERS[i % self.cfg.providers][0]
        return out

    def draw_spec(
        self, team: str, members: list[str], only: str | None = None
    ) -> api.ClusterVersionSpec:
        """A ClusterVersion-shaped spec over members (listed) or a team's selector stages.
        only: a history over several providers, a run on that one FleetProvider alone
        (spec.providerRef: the selectors then see its clusters only)."""
        rng = self.rng
        target = rng.choice(TARGETS)
        body: dict[str, object] = {
            "opsEndpoint": {"endpoint": self.alias_rng.choice(ALIASES), "insecure": True},
        }
        if only is not None:
            body = {"providerRef": {"name": only}}
        elif self.cfg.providers > 1:
            body = {"providerRefs": [{"name": n} for n, *_ in MEMBERS[: self.cfg.providers]]}
        stages: list[dict[str, object]] = []
        if self.cfg.stages and rng.random() < 0.8:
            rings = list(RINGS)
            if rng.random() < 0.5:
                body["version"] = target
                for ring in rings:
                    stage: dict[str, object] = {
                        "name": ring,
                        "selector": {"matchLabels": {"ring": ring, "team": team}},
                    }
                    stages.append(stage)
                size = sum(
                    1
                    for c in self.fleet.clusters.values()
                    if c.labels.get("team") == team
                    and not c.deleted
                    and (only is None or self.member_of.get(c.id) == only)
                )
            else:
                body["clusters"] = [{"id": cid, "version": target} for cid in members]
                by_ring: dict[str, list[str]] = {}
                for cid in members:
                    by_ring.setdefault(self.fleet.clusters[cid].labels["ring"], []).append(cid)
                for ring in rings:
                    if by_ring.get(ring):
                        stages.append({"name": ring, "clusters": by_ring[ring]})
                size = len(members)
            for stage in stages:
                if rng.random() < 0.5:
                    stage["maxConcurrency"] = rng.choice((1, 2, 3, 5, 30, "25%", "50%"))
                if self.cfg.health and rng.random() < 0.5:
                    stage["healthChecks"] = self._checks()
        else:
            body["clusters"] = [{"id": cid, "version": target} for cid in members]
            size = len(members)
        strategy: dict[str, object] = {}
        if stages:
            strategy["stages"] = stages
        if rng.random() < 0.7:
            strategy["maxConcurrency"] = rng.choice((1, 2, 3, 5, 10, 30, "10%", "25%", "50%"))
        strategy["onFailure"] = rng.choice(("Halt", "Continue"))
        body["strategy"] = strategy
        if self.cfg.health and rng.random() < 0.6:
            body["healthChecks"] = self._checks()
        top = max(1, size - 1)
        body["requiredAvailableCount"] = rng.randint(max(1, size // 2), top)
        self._operate(strategy, stages)
        if "version" in body:
            # As a user writes them: a stage per ring the team has clusters in. A stage that
            # selects nothing makes the run Invalid (issue 19); dropped here, after every draw,
            # so the rest of the history is what it was. (One can still empty before the run
            # pins, when the adversary deletes clusters: that run is Invalid, pinning nothing.)
            live = [
                c.labels
                for c in self.fleet.clusters.values()
                if not c.deleted and (only is None or self.member_of.get(c.id) == only)
            ]
            kept = [s for s in stages if any(_selects(s, labels) for labels in live)]
            if kept:
                strategy["stages"] = kept
            else:
                strategy.pop("stages", None)
        return api.ClusterVersionSpec.model_validate(body)

    def _operate(self, strategy: dict[str, object], stages: list[dict[str, object]]) -> None:
        """Failure budgets (run, stage; count, percent), failedClusterPolicy, notBefore and
        maintenance windows (run, stage) on the simulated clock. Not in drift histories (their
        liveness check wants every run to succeed) nor on large fleets."""
        if self.cfg.profile in ("drift", "none") or self.cfg.clusters > 120:
            return
        rng = self.ops_rng
        if rng.random() < 0.4:
            strategy["maxFailures"] = rng.choice((0, 1, 2, 3, "0%", "10%", "25%"))
        for stage in stages:
            if rng.random() < 0.25:
                stage["maxFailures"] = rng.choice((0, 1, 2, "50%"))
            if rng.random() < 0.08:
                stage["maintenance"] = self._maintenance()
        if rng.random() < 0.4:
            strategy["failedClusterPolicy"] = "ServiceInIfHealthy"
        if rng.random() < 0.12:
            strategy["notBefore"] = format_time(at(self.now + rng.randint(30, 900)))
        if rng.random() < 0.12:
            strategy["maintenance"] = self._maintenance()

    def _maintenance(self) -> dict[str, object]:
        """A daily window opening within the first 20 minutes of the simulated day (or one
        already open), a few to 40 minutes long; sometimes overrun allowed, sometimes an
        exclusion inside it."""
        rng = self.ops_rng
        opens = rng.choice((0, 0, 5, 10, 20))
        length = rng.choice((3, 10, 20, 40))
        body: dict[str, object] = {
            "windows": [{"start": f"00:{opens:02d}", "duration": f"{length}m"}],
            "expectedDuration": rng.choice(("1m", "2m", "5m")),
            "allowOverrun": rng.random() < 0.3,
        }
        if rng.random() < 0.3:
            a = (opens + rng.randint(0, length)) * 60
            body["exclusions"] = [
                {"start": format_time(at(a)), "end": format_time(at(a + rng.randint(60, 600)))}
            ]
        return body

    def _checks(self) -> dict[str, object]:
        rng = self.rng
        return {
            **CHECKS,
            "interval": rng.choice(("5s", "10s", "30s")),
            "successThreshold": rng.randint(1, 3),
            "failureThreshold": rng.randint(2, 4),
            "timeout": rng.choice(("2m", "5m")),
        }

    def add_owner(self, i: int, kind: str | None = None) -> Owner:
        """A ClusterVersion or a direct UpdateRun over a (maybe overlapping) set of clusters."""
        rng = self.rng
        ids = sorted(c.id for c in self.fleet.clusters.values() if not c.deleted)
        team = TEAMS[i % len(TEAMS)] if not self.cfg.overlap else rng.choice(TEAMS[:2])
        if self.cfg.overlap or (len(self.owners) == 0 and self.cfg.owners == 1):
            k = max(2, int(len(ids) * rng.uniform(0.5, 1.0)))
            members = sorted(rng.sample(ids, min(k, len(ids))))
        else:
            members = ids[i :: max(1, self.cfg.owners)]
        members = members or ids[:2]
        only = None
        if self.cfg.providers > 1 and self.multi_rng.random() < 0.3:
            # Beside the runs over every provider, one on a single FleetProvider (providerRef):
            # runs of both kinds meet on (provider identity, cluster id).
            only = self.multi_rng.choice([n for n, *_ in MEMBERS[: self.cfg.providers]])
            members = [c for c in members if self.member_of.get(c) == only] or [
                c for c in ids if self.member_of.get(c) == only
            ][:2]
        spec = self.draw_spec(team, members, only)
        kind = kind or ("cv" if rng.random() < 0.6 else "run")
        owner = Owner(f"ns-{i}", f"{kind}-{i}", kind, spec)
        self.owners.append(owner)
        if kind == "cv":
            self.add_cluster_version(owner.namespace, owner.name, spec, listed=False)
        else:
            self.create_direct_run(owner)
        return owner

    def add_cluster_version(
        self, namespace: str, name: str, spec: api.ClusterVersionSpec, listed: bool = True
    ) -> None:
        """A ClusterVersion a person applies (its runs follow the ClusterVersion rule)."""
        key = f"{namespace}/{name}"
        if listed:
            self.owners.append(Owner(namespace, name, "cv", spec))
        person = self.people.pick()
        cv = CvObj(key, namespace, name, spec)
        cv.annotations = admit(
            api.KIND, None, (person.annotations(), spec.dump()), self.people.user(person)
        )
        self.api.cvs[key] = cv
        self.people.record(key, person)
        self.log(f"{person.name} creates ClusterVersion {key}")

    def write_cv(self, key: str, person: Person, spec: api.ClusterVersionSpec) -> None:
        """A person edits a ClusterVersion's spec (with kubectl: through admission)."""
        cv = self.api.cvs[key]
        before = (cv.annotations, cv.spec.dump())
        after = ({**cv.annotations, **person.annotations()}, spec.dump())
        cv.annotations = admit(api.KIND, before, after, self.people.user(person))
        cv.spec = spec
        cv.generation += 1
        if after != before:  # a write that changes nothing asks nothing
            self.people.record(key, person)

    def write_run(self, key: str, person: Person | None, **changes: Any) -> None:
        """A write to an UpdateRun's spec or metadata through admission: by a person, or (None)
        by the orchestrator's service account (a hand-over, a consumed annotation, a stop)."""
        obj = self.api.runs[key]
        after = copy.copy(obj)
        for name, value in changes.items():
            setattr(after, name, value)
        if person is not None:
            after.annotations = {**after.annotations, **person.annotations()}
        before = (run_annotations(obj), obj.spec.dump())
        said = (run_annotations(after), after.spec.dump())
        stored = admit(api.UPDATE_RUN_KIND, before, said, self.people.user(person))
        changes["annotations"] = {k: v for k, v in stored.items() if k not in SETS}
        self.api.update_run(key, **changes)
        if person is not None and said != before:  # a write that changes nothing asks nothing
            self.people.record(key, person)

    def create_direct_run(self, owner: Owner) -> str:
        self.run_counter += 1
        name = f"{owner.name}-r{self.run_counter}"
        s = owner.spec
        spec = api.UpdateRunSpec(
            required_available_count=s.required_available_count,
            ops_endpoint=s.ops_endpoint,
            provider_ref=s.provider_ref,
            provider_refs=s.provider_refs,
            version=s.version,
            clusters=s.clusters,
            strategy=s.strategy,
            health_checks=s.health_checks,
            timeouts=self.timeouts,
            skip=s.skip,
            retry=s.retry,
        )
        return self._create_run(owner.namespace, name, spec, "", None, self.people.pick())

    def _create_run(
        self,
        ns: str,
        name: str,
        spec: api.UpdateRunSpec,
        cv: str,
        source: api.ClusterVersionSpec | None,
        person: Person | None = None,
    ) -> str:
        """A run created by a person (a direct run) or by its ClusterVersion's controller, which
        hands the ClusterVersion's requests over (person None)."""
        key = f"{ns}/{name}"
        owner = self.api.cvs.get(cv) if cv else None
        if person is not None:
            typed = person.annotations()
        elif owner is not None:
            # What the ClusterVersion controller creates it with (_create): its requests and
            # who asked, as engine.requester.handover hands them to a run that has none.
            said = handover(owner.annotations, owner.spec.dump(), {}, True)
            typed = {k: v for k, v in said.items() if v is not None}
            self.people.hand(owner.key, key)
        else:
            typed = {}
        obj = RunObj(
            key=key,
            namespace=ns,
            name=name,
            uid=f"uid-{ns}-{name}",
            spec=spec,
            status=api.UpdateRunStatus(phase=api.RunPhase.INITIALIZING),
            rv=0,
            cv=cv,
            source=source,
        )
        obj.annotations = admit(
            api.UPDATE_RUN_KIND, None, (typed, spec.dump()), self.people.user(person)
        )
        self.api.create_run(obj)
        if person is not None:
            self.people.record(key, person)
        self.due[key] = self.now
        self.log(f"create UpdateRun {key}" + (f" ({person.name})" if person else ""))
        return key

    # -- logging -------------------------------------------------------------------------

    def log(self, text: str) -> None:
        self.history.append(f"t={self.now:>6} {text}")

    # -- controllers ---------------------------------------------------------------------

    def reconcile_cvs(self) -> None:
        """The ClusterVersion → UpdateRun rule: a changed spec starts a new run, stops the old.
        It runs in the leader's process and reads runs from that replica's watch cache, as
        orchestrator.controllers.clusterversion does; its writes go through that cache."""
        rep = self._cv_replica()
        self.actor = rep.name
        try:
            self._reconcile_cvs(rep.runs)
        finally:
            self.actor = None

    def _cv_replica(self) -> Replica:
        """The replica the ClusterVersion controller runs in (the leader's, else the first)."""
        return next((r for r in self.replicas if r.name == self.lease.holder), self.replicas[0])

    def _reconcile_cvs(self, view: RunCache) -> None:
        for cv in list(self.api.cvs.values()):
            if cv.deleting:
                self._delete_cv(cv)
                continue
            wanted = self._wanted.get((cv.key, cv.generation))
            if wanted is None:
                wanted = run_for(cv.name, cv.generation, cv.spec, self.timeouts)
                self._wanted[(cv.key, cv.generation)] = wanted
            name, spec = wanted
            key = f"{cv.namespace}/{name}"
            if view.get(key) is None:
                if key not in self.api.runs:
                    self._create_run(cv.namespace, name, spec, cv.key, cv.spec)
                else:  # the create is refused (AlreadyExists): the controller GETs it
                    view.put(self.api.events, key, copy.copy(self.api.runs[key]))
            current = view.get(key)
            assert current is not None
            # The ClusterVersion controller's own rules (orchestrator.engine.initialize): the fields
            # that follow the ClusterVersion in place, then supersede, judged on the cached
            # run; a patch merges into the stored spec.
            changes = live_fields(current.spec.dump(), cv.spec)
            # Who asked goes with the requests (controllers.clusterversion._apply_live): the
            # people annotations and the stamp's user, judged on the cached run as well.
            # The model's ClusterVersions carry no retry/skip/approve annotations (people write
            # those on runs), so only a live spec change hands requests over here.
            said = handover(cv.annotations, cv.spec.dump(), current.annotations, bool(changes))
            stored = self.api.runs.get(key)
            if (changes or said) and stored is not None:
                body = stored.spec.dump()
                for name_, value in changes.items():
                    if name_ == "strategy":  # a merge patch of strategy.paused
                        body["strategy"] = {**(body.get("strategy") or {}), **value}
                    elif value is None:
                        body.pop(name_, None)
                    else:
                        body[name_] = value
                patched = api.UpdateRunSpec.model_validate(body)
                annotations = {
                    **{k: v for k, v in stored.annotations.items() if k not in said},
                    **{k: v for k, v in said.items() if v is not None},
                }
                # A patch that changes nothing writes nothing.
                if patched != stored.spec or annotations != stored.annotations:
                    floor = stored.spec.required_available_count
                    # The ground truth: a request (a live spec field) is handed over.
                    asks = patched != stored.spec
                    self.write_run(key, None, spec=patched, annotations=annotations)
                    if asks:
                        self.people.hand(cv.key, key)
                    if patched.required_available_count != floor:
                        self.monitor.floor_changed(key)
                    self.due[key] = self.now
            mine = [r for r in view.runs() if r.cv == cv.key]
            stop = set(
                superseded(
                    (
                        (
                            r.key,
                            r.spec.state.value,
                            r.status.phase.value if r.status.phase else None,
                        )
                        for r in mine
                    ),
                    key,
                )
            )
            for other in mine:
                stored = self.api.runs.get(other.key)
                if other.key in stop and stored is not None:  # gone: the patch is NotFound
                    if stored.spec.state == api.RunState.STOP:
                        continue  # stopped already: the patch changes nothing
                    self.write_run(
                        other.key,
                        None,
                        spec=stored.spec.model_copy(update={"state": api.RunState.STOP}),
                    )
                    self.due[other.key] = self.now
                    self.log(f"stop UpdateRun {other.key} (superseded by {key})")

    def _delete_cv(self, cv: CvObj) -> None:
        """A ClusterVersion being deleted deletes the runs it owns and goes once they have
        (orchestrator.controllers.clusterversion)."""
        mine = [r for r in self.api.runs.values() if r.cv == cv.key]
        for run in mine:
            if not run.deleting:
                run.deleting = True
                self.api.changed(run.key)
                self.due[run.key] = self.now
                self.log(f"delete UpdateRun {run.key} (its ClusterVersion is being deleted)")
        if not mine:
            del self.api.cvs[cv.key]
            self.log(f"ClusterVersion {cv.key} is gone")

    def _collect_if_released(self, key: str) -> None:
        """A run being deleted goes, its ClusterUpgrades with it (garbage collector), once
        nothing of it holds its finalizer (orchestrator.pipeline.deletion.holds, as the controller
        asks)."""
        policy = (self.api.runs[key].spec.strategy or api.Strategy()).failed_cluster_policy
        held = deletion.holds(
            ((o.upgrade.cluster_id, o.upgrade.status) for o in self.api.upgrades_of(key)), policy
        )
        if held.waiting:
            return
        self.monitor.run_deleted(key, held.kept_out)
        self.api.collect(key)
        self.due.pop(key, None)
        self.log(
            f"UpdateRun {key} is gone" + (f" (kept out: {held.kept_out})" if held.kept_out else "")
        )

    def told(
        self, rep: Replica, key: str, drv: RunDriver, upgrades: dict[str, Upgrade]
    ) -> frozenset[str] | None:
        """What the replica's controller tells drv changed since it last handed it this run's
        upgrades, as the UpdateRun controller does from its kept cache (None: not said, every
        object is compared: cfg.told "never", a new driver, or its first pass of the run)."""
        before = rep.handed.get(key)
        rep.handed[key] = (drv, dict(upgrades))
        if self.cfg.told == "never" or before is None or before[0] is not drv:
            return None
        last = before[1]
        return frozenset(
            n for n in upgrades.keys() | last.keys() if upgrades.get(n) is not last.get(n)
        )

    def reconcile_run(self, rep: Replica, key: str) -> None:
        if rep.runs.get(key) is None:
            # The product reconciles a run once its watch delivered it (existence first).
            self.due[key] = self.now + 1
            return
        self.monitor.acting = (rep.name, rep.incarnation)
        run = rep.store.read_run(key)
        now = at(self.now)
        rep.provider.run = key
        if run.deleting and not run.initialized:
            self._collect_if_released(key)  # nothing pinned: it goes at once
            return
        if not run.initialized:
            self._initialize(rep, run)
            return
        upgrades = rep.store.read_upgrades(key)
        drv = rep.driver(run)
        multi = None
        if run.spec.provider_refs:
            held_by, floors, multi = self._across(rep, key, upgrades)
            drv.provider = multi
        else:
            held_by, floors = neighbours(
                self.holdings(),
                lambda other: self.floor_of(rep, other),
                self.identity(run.spec),
                key,
                {u.cluster_id for u in upgrades.values()},
            )
            drv.provider = self.member(rep, run.spec).provider
        approved = frozenset(run.stage_names)
        changed = self.told(rep, key, drv, upgrades)
        result = drv.step(
            key=key,
            uid=run.uid,
            # Being deleted: driven as a stopped run, as the UpdateRun controller does.
            spec=deletion.stopping(run.spec) if run.deleting else run.spec,
            upgrades=upgrades,
            stages=run.status.stages or [],
            held_by=held_by,
            now=now,
            approved=approved,
            retry=run.retry,
            skip=run.skip,
            floors=floors,
            skip_stages=run.skip_stages,
            # Who asked, as the UpdateRun controller records it: from the stamp the admission
            # webhook left on the run (tests/sim/people.py).
            requested_by=run_requester(run),
            reason=run.annotations.get(api.ANNOTATION_REASON) or "",
            changed=changed,
        )
        d = result.decision
        if multi is not None and multi.down:
            # The product's run is Degraded, naming them (multi.degraded_message).
            self.log(f"{rep.name} {key}: degraded: {', '.join(sorted(multi.down))} unavailable")
        if result.unreachable is not None:
            # The product's run is Degraded (PluginUnavailable); its clusters were unknown.
            self.log(f"{rep.name} {key}: degraded: {result.unreachable}")
        if d.calls or d.changed:
            self.log(
                f"{rep.name} {key}: {len(d.changed)} written, "
                + ", ".join(f"{c.kind.value} {c.cluster_id}" for c in d.calls[:6])
                + (" …" if len(d.calls) > 6 else "")
                + (" (fenced)" if result.fenced else "")
                + (f" ({result.conflicts} conflicts)" if result.conflicts else "")
            )
        if not result.conflicts and (d.retried or d.skipped):
            self.write_run(key, None, retry=run.retry - d.retried, skip=run.skip - d.skipped)
            run = rep.store.read_run(key)
        old = run.status
        status = result.run_status(old, now)  # built where the UpdateRun controller builds it
        if status != old:
            self.adversary.run_write_fault(key)
            rep.store.write_run_status(key, status)
            if not api.run_is_live(old.phase) and api.run_is_live(status.phase):
                # Resumed (a stopped run set to Run, or a finished one given a retry round):
                # its floor bound no one while it was not live.
                self.monitor.run_resumed(key)
            if status.phase != old.phase:
                self.log(f"{key}: {old.phase} → {status.phase}: {d.message}")
        self.api.runs[key].edited = False  # looked at (observedGeneration caught up)
        if not result.conflicts:  # a pass cut short by a conflict is looked at again
            self.last_pass[key] = self._happened()
        if run.deleting:
            self._collect_if_released(key)
            if key not in self.api.runs:
                return
        wait = 30.0 if result.requeue_after is None else result.requeue_after
        self.due[key] = self.now + int(min(30.0, max(float(self.cfg.min_requeue), wait)))

    def _across(
        self, rep: Replica, key: str, upgrades: Mapping[str, Upgrade]
    ) -> tuple[dict[str, str], list[Floor], MultiProvider]:
        """A run over several providers, as the UpdateRun controller reaches it: holdings and
        floors on (identity, cluster id), each cluster routed to the member it was pinned on
        (orchestrator.pipeline.multi), the product's MultiProvider over the replica's members."""
        own = {u.cluster_id: u.spec.provider_id or "" for u in upgrades.values()}
        held_by, floors, extra = neighbours_across(
            self.holdings(), lambda other: self.floor_of(rep, other), own, key
        )
        routes = route(
            [
                (u.cluster_id, u.spec.provider_id or "", u.spec.provider_name)
                for u in upgrades.values()
            ],
            rep.members,
        )
        assert not isinstance(routes, Problem), routes  # no FleetProvider is repointed here
        by_identity = {m.identity: m.name for m in rep.members}
        routes.update({cid: by_identity[i] for cid, i in extra.items() if i in by_identity})
        return held_by, floors, MultiProvider.over(rep.members, routes, lambda: at(self.now))

    def identity(self, spec: api.UpdateRunSpec) -> str:
        """What the plugin behind a run's address says it is (its GetPluginInfo)."""
        if spec.provider_ref is not None:  # one FleetProvider of a history over several
            return next(
                m.identity for m in self.replicas[0].members if m.name == spec.provider_ref.name
            )
        endpoint = spec.ops_endpoint.endpoint if spec.ops_endpoint else ""
        return provider_identity(*PLUGIN, endpoint)

    def member(self, rep: Replica, spec: api.UpdateRunSpec) -> Member:
        """The plugin a one-provider run reaches: its FleetProvider's (a history over several),
        else the model plugin."""
        if spec.provider_ref is not None:
            return next(m for m in rep.members if m.name == spec.provider_ref.name)
        return Member(
            "",
            spec.ops_endpoint.endpoint if spec.ops_endpoint else "",
            self.identity(spec),
            rep.provider,
        )

    def holdings(self) -> list[Holding]:
        """Every ClusterUpgrade as the runs that meet see it (orchestrator.pipeline.crossrun), read
        from the store as the UpdateRun controller reads its cache."""
        return [
            holding(
                o.run,
                pinned_provider(o.upgrade.spec.provider_id, o.upgrade.spec.provider, {}),
                o.upgrade.cluster_id,
                o.upgrade.status.phase,
                o.upgrade.status.step,
            )
            for o in self.api.upgrades.values()
        ]

    def floor_of(self, rep: Replica, run: str) -> int | None:
        """The floor of another run while it is live (None: finished, or unknown), as the
        replica's UpdateRun watch cache has it (runs.UpdateRunController._neighbours)."""
        obj = rep.runs.get(run)
        if obj is None:
            # Its ClusterUpgrades without its UpdateRun in this cache (not seen yet): the
            # controller asks the apiserver (runs._neighbours), which has it or says it is gone.
            obj = self.api.runs.get(run)
            if obj is None:
                return None
        if not api.run_is_live(obj.status.phase):
            return None
        return obj.spec.required_available_count

    def _initialize(self, rep: Replica, run: RunObj) -> None:
        """Pin once: every ClusterUpgrade created at start, from the inventory of that moment."""
        self.adversary.rpc("ListClusters", "")
        if run.spec.provider_refs:
            down = sorted(n for n, until in self.outages.items() if until > self.now)
            if down:  # the product's run is Degraded and pins nothing until they answer
                self.log(f"{run.key}: not pinned: {', '.join(down)} unavailable")
                self.due[run.key] = self.now + self.cfg.min_requeue
                return
            inventory = self.fleet.inventory()
            pinned = pin_across(
                run.name,
                run.spec,
                rep.members,
                {
                    name: {c: o for c, o in inventory.items() if self.member_of.get(c) == name}
                    for name, *_ in MEMBERS[: self.cfg.providers]
                },
                source=run.source,
            )
        else:
            one = self.member(rep, run.spec)
            if one.name and self.outages.get(one.name, -1) > self.now:
                self.log(f"{run.key}: not pinned: {one.name} unavailable")
                self.due[run.key] = self.now + self.cfg.min_requeue
                return
            pinned = pin_upgrades(
                run.name,
                run.spec,
                {
                    c: o
                    for c, o in self.fleet.inventory().items()
                    if not one.name or self.member_of.get(c) == one.name
                },
                source=run.source,
                provider_id=one.identity,
                provider_name=one.name or None,
            )
        if isinstance(pinned, list):
            self.api.update_run(run.key, initialized=True)
            self.api.runs[run.key].status = api.UpdateRunStatus(
                phase=api.RunPhase.INVALID, message="; ".join(str(p) for p in pinned)[:300]
            )
            self.api.changed(run.key)
            self.log(f"{run.key}: Invalid: {pinned[0]}")
            return
        self.api.create_upgrades(run, pinned.upgrades)
        self.api.update_run(run.key, initialized=True, stage_names=list(pinned.stage_names))
        self.api.runs[run.key].status = api.UpdateRunStatus(
            phase=api.RunPhase.PROGRESSING,
            cluster_set_digest=pinned.digest,
            start_time=format_time(at(self.now)),
        )
        self.api.changed(run.key)
        self.monitor.run_pinned(run.key)
        self.log(f"{run.key}: pinned {len(pinned.upgrades)} clusters")
        self.due[run.key] = self.now

    # -- the clock -----------------------------------------------------------------------

    def at(self, t: int, action: Callable[[World], None], what: str) -> None:
        """Something a scenario makes happen at simulated second t."""
        self.hooks.append((t, action, what))
        self.hooks.sort(key=lambda h: h[0])

    def _next_time(self, horizon: int) -> int:
        times = [horizon]
        if self.hooks:
            times.append(self.hooks[0][0])
        if self.due:
            times.append(min(self.due.values()))
        ev = self.fleet.next_event()
        if ev is not None:
            times.append(ev)
        nxt = self.adversary.next_action()
        if nxt is not None:
            times.append(nxt)
        return max(self.now + 1, min(times))

    def _due_runs(self) -> Iterator[str]:
        for key in sorted(k for k, t in self.due.items() if t <= self.now):
            run = self.api.runs[key]
            if (
                (
                    run.status.phase == api.RunPhase.INVALID
                    or rests(run.status.phase, self._holding(key))
                )
                and run.initialized
                and not run.edited
                and not run.deleting
            ):
                del self.due[key]
                continue
            yield key

    def _holding(self, key: str) -> int:
        """How many clusters the run's ClusterUpgrades hold (`index.holds_cluster`)."""
        return sum(
            holds_cluster(o.upgrade.status.phase, o.upgrade.status.step)
            for o in self.api.upgrades_of(key)
        )

    def iterate(self, active: bool, horizon: int) -> None:
        self.now = self._next_time(horizon)
        self.lease.advance(self.now)
        for replica in self.replicas:
            replica.runs.deliver(self.now)
        if self.fleet.tick(self.now):
            self.monitor.after_step("operations advanced", world_changed=True)
        while self.hooks and self.hooks[0][0] <= self.now:
            _, action, what = self.hooks.pop(0)
            action(self)
            self.log(f"scenario: {what}")
            self.monitor.after_step(f"scenario: {what}", world_changed=True)
        if active and self.adversary.act():
            self.world_changed_at = self._happened()
            self.monitor.after_step("adversary acted", world_changed=True)
        self.reconcile_cvs()
        for key in list(self._due_runs()):
            rep = self.adversary.pick_replica() if active else self._leader()
            self.actor = rep.name
            try:
                self.reconcile_run(rep, key)
            except Crash as err:
                self.log(f"{rep.name} crashed: {err}")
                rep.crash()
                self.due[key] = self.now + 1
            except (LostWrite, WriteConflict, CallError) as err:
                self.log(f"{rep.name} {key}: pass aborted: {type(err).__name__}: {err}")
                self.due[key] = self.now + 2
            finally:
                self.actor = None
            self.monitor.after_step(f"{rep.name} reconciled {key}")

    def _run_event(self, seq: int, key: str, obj: RunObj | None) -> None:
        """An UpdateRun write reaches the writer's cache at once (write-through; a deletion
        only by the watch) and every other replica's after a lag drawn from the seed."""
        for rep in self.replicas:
            if rep.name == self.actor and obj is not None:
                rep.runs.put(seq, key, obj)
            else:
                rep.runs.send(self.now + self._lag(), seq, key, obj)

    def _lag(self) -> int:
        """Seconds a watch event takes: mostly at once, sometimes seconds, rarely longer than
        a Lease (a slow apiserver, a watch re-established)."""
        roll = self.lag_rng.random()
        if roll < 0.7:
            return self.lag_rng.randint(0, 1)
        if roll < 0.95:
            return self.lag_rng.randint(2, 8)
        return self.lag_rng.randint(9, 40)

    def _watch_event(self, op: object) -> None:
        """WatchOperations: the end of an operation wakes the run that started it, and reaches
        the operation tracker of every replica that follows the plugin."""
        obs = op.obs() if isinstance(op, MOp) else None
        for rep in self.replicas:
            if obs is not None and rep.provider.following and obs.state.terminal:
                rep.provider.ended[obs.request_id] = obs
        owner = getattr(op, "owner", "")
        if owner in self.due:
            self.due[owner] = min(self.due[owner], self.now)

    def _leader(self) -> Replica:
        return next(r for r in self.replicas if r.name == self.lease.holder)

    def _lost_lease(self, name: str) -> None:
        """The product's on_lost: the deposed process exits, and is restarted."""
        self.log(f"{name} lost the lease: restarted")
        next(r for r in self.replicas if r.name == name).crash()

    def run(self) -> None:
        """The whole history; raises Violation at the first broken invariant."""
        self.reconcile_cvs()
        while self.now < self.cfg.active_seconds:
            self.iterate(True, self.cfg.active_seconds)
        self.adversary.quiet()
        self.world_changed_at = self._happened()
        self.log("adversary quiet")
        self.monitor.after_step("adversary quiet")
        limit = self.now + self.cfg.quiet_cap
        while self.now < limit and not self._settled():
            self.iterate(False, limit)
        self.monitor.final(self._settled())

    def _happened(self) -> int:
        """The next position in the sequence of world changes and passes."""
        self._happenings += 1
        return self._happenings

    def _settled(self) -> bool:
        """Nothing in flight, no run due for a pass, and no cluster changed phase for a while
        (the runs are finished or wait for something only a person or the world can change:
        they say what).

        A run is due when something it must answer happened and the controllers have not yet
        reconciled it (it was created or pinned, a person edited it, an operation of its
        ended): the product's watch reconciles it at once, so the world is not settled before
        the run had that pass. Seeds 62021 and 63809: a run pinned at the last second of the
        active phase (a stage rename superseding a run; a direct run applied) was judged by
        the state pinning left, before the engine had decided anything for it. Likewise a run
        pinned whose first pass was aborted (a failed call, a conflict): it is requeued, not
        due yet, and says nothing until a pass of it completes (found with watch-cache lag,
        which delays pinning: a run created late was pinned at the active phase's last second).
        """
        if any(due <= self.now for due in self.due.values()):
            return False
        for run in self.api.runs.values():
            if not run.initialized or run.deleting:
                return False
            if run.status.phase in FINISHED:
                continue
            if run.status.message is None:  # pinned, never decided on
                return False
            if self.last_pass.get(run.key, -1) < self.world_changed_at:
                # The world changed (a cluster came back, an outage ended) since this run last
                # looked: its status may be stale (seed 4197: judged waiting for budget while
                # the cluster it counted as down had just returned).
                return False
            if any(o.upgrade.status.phase in ACTIVE for o in self.api.upgrades_of(run.key)):
                return False
        return self.now - self.monitor.last_change >= QUIET_SETTLE


def simulate(seed: int, cfg: Config | None = None) -> World:
    """Run one seeded history; raises Violation (with the history attached)."""
    world = World(cfg or Config.draw(seed))
    try:
        world.run()
    except Violation as err:
        err.world = world
        raise
    return world
