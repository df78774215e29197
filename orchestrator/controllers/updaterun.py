"""The UpdateRun controller: initialize (pin ClusterUpgrades) → execute (the run driver) → status.

Shape of KubeFleet's updaterun controller and Cluster API's MachineSet: the run creates its
children once, then counts them; each reconcile re-reads the run and its ClusterUpgrades (from
the cache our own writes keep current), runs one driver step and writes the run's status once,
conditional on its resourceVersion.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from orchestrator import api
from orchestrator.adapters.analysis import Analyzer, PrometheusTarget
from orchestrator.adapters.cache import AccessCatalog, ObjectCache
from orchestrator.adapters.composed import NoProvider, PluginBuilder
from orchestrator.adapters.kube import Conflict, KubeClient, KubeError, NotFound
from orchestrator.adapters.metrics import Metrics
from orchestrator.adapters.notify import Notifier
from orchestrator.adapters.provider import KeptInventory, OperationTracker, PluginPool
from orchestrator.adapters.secrets import SecretError, TLSResolver
from orchestrator.controllers.kept import Children, KeptUpgrades, parse_status
from orchestrator.controllers.reach import Reached, RunPlugins, Unreached
from orchestrator.engine.access import Access
from orchestrator.engine.conditions import (
    PROVIDER_UNAVAILABLE,
    format_time,
    get_condition,
    set_condition,
    with_fix,
)
from orchestrator.engine.decide import Floor, Preflight, Upgrade, rests
from orchestrator.engine.index import RunIndex
from orchestrator.engine.initialize import Pinned, run_name
from orchestrator.engine.observations import ClusterObs, OpObs, OpState
from orchestrator.engine.requester import requester
from orchestrator.engine.transitions import (
    ClusterChange,
    Transition,
    event_name,
    events_of,
    transitions,
)
from orchestrator.engine.validate import Problem, SpecCache, parse_model
from orchestrator.pipeline import deletion
from orchestrator.pipeline.crossrun import UNSEEN, RunNotSeen
from orchestrator.pipeline.driver import (
    CallError,
    Fence,
    HookRunner,
    Provider,
    RunDriver,
    StepResult,
    WriteConflict,
)
from orchestrator.pipeline.multi import degraded_message, named, neighbours_across

__all__ = ["OPERATION_WAKE", "AlwaysLeader", "UpdateRunController", "upgrade_from_obj"]

log = logging.getLogger(__name__)
#: ClusterUpgrade writes and plugin calls made at once by one reconcile (API latency, not CPU).
WRITE_PARALLELISM = 32
#: A pass that wrote ClusterUpgrades but made no call looks again this soon.
AFTER_WRITES = 0.05
#: An operation's end wakes the runs on its provider this much later (issue 21): the ends
#: that come meanwhile are followed by the same pass, whose fixed part (the inventory read,
#: the run's status, the kept state brought up to date) then serves more cluster steps. At
#: 500 clusters passes followed about 4 steps each, as fast as they ended; with this, about
#: 25 (657 passes → 119, 2.54 → 1.45 ms of CPU per cluster step), each step followed
#: later (p50 about 110 ms from 25 to 50; docs/architecture.md, "Scale": what it costs).
OPERATION_WAKE = 0.03
FINISHED = api.FINISHED_PHASES


class AlwaysLeader:
    """The fence of a replica running without leader election."""

    def held(self) -> bool:
        """Always True."""
        return True


def upgrade_from_obj(obj: Mapping[str, Any], spec: api.ClusterUpgradeSpec | None = None) -> Upgrade:
    """The engine's view of a ClusterUpgrade object (spec: its spec as parsed before, when it
    has not changed since: kept.Children.put)."""
    status = obj.get("status") or {}
    try:
        st = parse_status(status)
    except ValidationError:
        log.warning("status of ClusterUpgrade %s does not parse; starting over", obj["metadata"])
        st = api.ClusterUpgradeStatus()
    return Upgrade(
        name=obj["metadata"]["name"],
        spec=spec if spec is not None else api.ClusterUpgradeSpec.model_validate(obj["spec"]),
        status=st,
    )


@dataclass
class _DriverMemory:
    """What a run's driver must remember between reconciles (see RunDriver's fields)."""

    unrecorded_failures: set[str] = field(default_factory=set)
    stage_failures: dict[tuple[str, str], datetime] = field(default_factory=dict)
    index: RunIndex = field(default_factory=RunIndex)
    unknown_since: dict[str, datetime] = field(default_factory=dict)


@dataclass
class _KubeStore:
    """The driver's `UpgradeStore` over the apiserver; every write is conditional."""

    kube: KubeClient
    cache: ObjectCache
    namespace: str
    #: The run's ClusterUpgrades by name, as last written (the Events' subjects).
    objects: dict[str, dict[str, Any]]

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        obj = self.objects[upgrade.name]
        # The watch's echo of this write wakes nobody, even when it comes before the answer.
        with self.cache.writing(self.namespace, upgrade.name):
            try:
                new = self.kube.write_status(
                    api.CLUSTER_UPGRADE_PLURAL,
                    self.namespace,
                    upgrade.name,
                    status.dump(),
                    obj["metadata"]["resourceVersion"],
                )
            except Conflict as err:
                raise WriteConflict(str(err)) from err
            self.cache.put(new, own=True)
        self.objects[upgrade.name] = new


@dataclass
class _CountedChecker:
    """The driver's `Checker`: the Analyzer, with every evaluation counted in the metrics."""

    analyzer: Analyzer
    metrics: Metrics
    namespace: str
    run: str

    def evaluate(
        self, checks: api.HealthChecks, clusters: Sequence[ClusterObs], stage: str
    ) -> list[api.CheckResult]:
        results = self.analyzer.evaluate(checks, clusters, stage)
        for r in results:
            outcome = "passed" if r.passed else "failed"
            m = self.metrics
            m.of_run(m.health_checks, self.namespace, self.run, r.name, outcome).inc()
            if r.value is not None:
                m.of_run(m.health_value, self.namespace, self.run, r.name).set(r.value)
        return results


@dataclass
class UpdateRunController:
    """Reconciles UpdateRuns; one at a time, so holdings read from the cache are consistent."""

    kube: KubeClient
    metrics: Metrics
    pool: PluginPool
    tracker: OperationTracker
    upgrades: ObjectCache
    tls: TLSResolver
    #: FleetProviders, MetricSources and the policy: what this namespace's run may use.
    catalog: AccessCatalog
    fence: Fence = field(default_factory=AlwaysLeader)
    #: UpdateRuns (for the floors of other runs sharing clusters), when the controller has them.
    runs: ObjectCache | None = None
    #: Runs pre/post-upgrade hooks (orchestrator.hooks); None: a run with hooks fails them.
    hooks: HookRunner | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    #: Records a core/v1 Event: (object, reason, message, warning, Event name).
    emit_event: Callable[[dict[str, Any], str, str, bool, str], None] | None = None
    #: Also an Event for each step of a cluster inside an attempt (Transition.detail); by
    #: default a ClusterUpgrade gets Events for its start and its end only.
    step_events: bool = False
    #: Delivers spec.notifications (orchestrator.notify); None: none are sent.
    notifier: Notifier | None = None
    #: Run key → provider identities (so an operation's end wakes the runs on that provider,
    #: whichever address each reaches it by; several for a run over spec.providerRefs).
    providers: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    uids: set[str] = field(default_factory=set)
    _preflight: dict[tuple[str, str], dict[str, Preflight]] = field(default_factory=dict)
    #: The ClusterUpgrade cache as read here (every one's holding, each run's parsed children),
    #: kept per change so that a reconcile costs work for what changed, not for every object.
    _kept: KeptUpgrades = field(init=False)
    #: The runs' parsed specs, per generation.
    _specs: SpecCache = field(default_factory=SpecCache)
    _memory: dict[tuple[str, str], _DriverMemory] = field(default_factory=dict)
    #: Per plugin endpoint, the clusters converted from its inventory (GrpcProvider.converted).
    _inventories: dict[str, KeptInventory] = field(default_factory=dict)
    #: Writes, calls and preflights of a pass run on these (threads live as long as we do:
    #: starting WRITE_PARALLELISM threads per pass was a tenth of a pass at 500 clusters).
    _workers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(WRITE_PARALLELISM, thread_name_prefix="write")
    )

    def __post_init__(self) -> None:
        self._kept = KeptUpgrades(self.upgrades, self.pool.identities, upgrade_from_obj)

    def _children(self, namespace: str, run: str) -> Children:
        """The run's ClusterUpgrades as cached now (what changed since the last look synced)."""
        self._kept.sync()
        return self._kept.children(namespace, run)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """One step of one run; returns seconds to requeue after (None: wait for a change)."""
        try:
            obj = self._read_run(namespace, name)
        except NotFound:
            self._forget(namespace, name)
            return None
        status = _run_status(obj)
        parsed = self._specs.parse(api.UpdateRunSpec, obj)
        if deletion.deleting(obj):
            if self._finalize(obj, _failed_cluster_policy(parsed)):
                return None  # nothing of it out of service: let it go
        else:
            obj = self._hold(obj, status.phase in FINISHED)
        meta = obj["metadata"]
        gen = int(meta.get("generation", 1))
        now = self.clock()
        if isinstance(parsed, list):
            return self._invalid(obj, status, parsed, gen, now)
        # Being deleted: driven as stopped (engine.decide's Stop path) until its clusters are
        # back in service; then _finalize lets it go.
        spec = deletion.stopping(parsed) if deletion.deleting(obj) else parsed
        if (
            rests(status.phase, len(self._children(namespace, name).holding))
            and spec.state == api.RunState.RUN
            and not _people(obj)
            and status.observed_generation == gen
        ):
            # Finished and nothing new: a spec edit (resume after a stop, spec.retry,
            # spec.skip) bumps the generation and is looked at once. (One that holds clusters
            # is looked at until it lets them go: engine.decide.rests.)
            self._export_clusters(namespace, name)
            return None
        # Who may do what: before any plugin is called or URL fetched (orchestrator.access).
        access = self.catalog.check(namespace, spec)
        if isinstance(access, list):
            return self._invalid(obj, status, access, gen, now)
        self.uids.add(meta["uid"])
        plugins = self._providers(access)
        if isinstance(plugins, tuple):
            reason, message, retry = plugins
            return self._degraded(obj, status, reason, message, gen, now, retry)
        self.providers[(namespace, name)] = plugins.identities
        initialized = get_condition(status.conditions, "Initialized")
        if initialized is None or initialized.status != "True":
            return self._initialize(obj, spec, status, plugins, gen, now)
        return self._execute(obj, spec, status, plugins, access, gen, now)

    def _read_run(self, namespace: str, name: str) -> dict[str, Any]:
        """The run as the runs watch has it, else (not there, or no watch) as the apiserver
        does (NotFound: gone). Issue 21: a GET per reconcile was a request of the apiserver's
        and a decode of ours each pass. What this replica writes of a run goes through the
        cache (`_write_run`, `_hold`, `_consume`, the ClusterVersion controller), so a pass
        never reads its own writes stale; what others write reaches the cache within moments
        and wakes the run again, as a GET made a moment earlier would have missed it; and
        every write of the run's status is conditional on the resourceVersion read."""
        cached = self.runs.get(namespace, name) if self.runs is not None else None
        if cached is None:
            return self.kube.get_object(api.UPDATE_RUN_PLURAL, namespace, name)
        # The reconcile's own copy: `_write_run` replaces its status and metadata.
        return {**cached, "metadata": dict(cached["metadata"])}

    def _put_run(self, written: dict[str, Any] | None) -> None:
        """A write's answer of the run, into the runs cache (write-through: `_read_run`)."""
        if written is not None and self.runs is not None:
            self.runs.put(written)

    def _providers(self, access: Access) -> RunPlugins | tuple[str, str, float]:
        """The run's plugins, reached: the one of spec.providerRef / opsEndpoint, or one per
        FleetProvider of spec.providerRefs (orchestrator.pipeline.multi); else why not, as a
        Degraded condition's (reason, message, seconds to look again after). A member of
        several that does not answer is Unreached (its clusters unknown, the others go on)."""
        builder = PluginBuilder(
            self.pool, self.tls, self.tracker, self.clock, self.count_operation, self._inventories
        )
        if not access.members:
            # One FleetProvider (plain or composed, orchestrator.adapters.composed) or
            # spec.opsEndpoint.
            built = builder.provider(access)
            via = access.provider.via
            name = access.composition.name if access.composition is not None else ""
            if not name and via.startswith("FleetProvider "):
                name = via.removeprefix("FleetProvider ")
            if isinstance(built, NoProvider):
                if built.error is None:
                    return built.reason, built.message, built.retry
                # It did not answer: a run in flight goes on with its clusters unknown, so
                # that its steps meet their bounds (invariant 4); one not started yet waits.
                down = Unreached(name, access.provider.endpoint, built.error)
                return RunPlugins([down], False, self.clock)
            one = Reached(name, built.endpoint, built.identity, built.provider)
            return RunPlugins([one], False, self.clock)
        plugins: list[Reached | Unreached] = []
        for fp, target in access.members:
            reached = builder.plugin(target)
            if isinstance(reached, NoProvider):
                if reached.error is None:
                    return reached.reason, reached.message, reached.retry
                plugins.append(Unreached(fp, target.endpoint, named(fp, reached.error)))
                continue
            plugins.append(Reached(fp, target.endpoint, reached[1], reached[0]))
        return RunPlugins(plugins, True, self.clock)

    def _forget(self, namespace: str, name: str) -> None:
        """A run that is gone (its finalizer released, or removed by a person): nothing can act
        for its ClusterUpgrades any more; those being deleted (garbage collector) may go."""
        self._release(namespace, name, only_deleting=True)
        self.metrics.forget_run(namespace, name)
        self.providers.pop((namespace, name), None)
        self._preflight.pop((namespace, name), None)
        self._memory.pop((namespace, name), None)
        self._kept.forget(namespace, name)

    # -- initialize -------------------------------------------------------------------------

    def _initialize(
        self,
        obj: dict[str, Any],
        spec: api.UpdateRunSpec,
        status: api.UpdateRunStatus,
        plugins: RunPlugins,
        gen: int,
        now: datetime,
    ) -> float | None:
        """Pin the run once: its ClusterUpgrades created from the inventory of now (and the
        ClusterVersion it was made for, which must not have changed since), then its status."""
        meta = obj["metadata"]
        if spec.state == api.RunState.STOP:
            message = "stopped before it started"
            return self._not_started(obj, spec, status, "Stopped", message, message, gen, now)
        source = None
        if spec.cluster_version_ref is not None:
            cv = self._cluster_version(meta["namespace"], spec.cluster_version_ref.name)
            if isinstance(cv, Problem):
                return self._invalid(obj, status, [cv], gen, now)
            if cv is None or run_name(spec.cluster_version_ref.name, cv) != meta["name"]:
                return self._not_started(
                    obj,
                    spec,
                    status,
                    "Superseded",
                    "the ClusterVersion changed before this run started",
                    "superseded before it started",
                    gen,
                    now,
                )
            source = cv
        try:
            pinned = plugins.pin(meta["name"], spec, source)
        except CallError as err:
            return self._degraded(obj, status, "PluginUnavailable", str(err), gen, now, 5.0)
        if isinstance(pinned, list):
            return self._invalid(obj, status, pinned, gen, now)
        self._create_upgrades(obj, pinned.upgrades)
        self._write_run(obj, _pinned_status(status, pinned, gen, now), spec=spec)
        return 0.0

    def _cluster_version(
        self, namespace: str, name: str
    ) -> api.ClusterVersionSpec | Problem | None:
        """The spec of the ClusterVersion a run was made for; a Problem when it does not exist;
        None when its spec no longer parses (it changed since)."""
        try:
            cv = self.kube.get_object(api.PLURAL, namespace, name)
        except NotFound:
            return Problem("spec.clusterVersionRef.name", f"ClusterVersion {name} does not exist")
        cv_spec = parse_model(api.ClusterVersionSpec, cv.get("spec"))
        return None if isinstance(cv_spec, list) else cv_spec

    def _not_started(
        self,
        obj: dict[str, Any],
        spec: api.UpdateRunSpec,
        status: api.UpdateRunStatus,
        reason: str,
        why: str,
        message: str,
        gen: int,
        now: datetime,
    ) -> float | None:
        """A run that stops before it pinned anything: Stopped, never Initialized (reason and
        why on that condition; message on the run)."""
        conds = set_condition(
            list(status.conditions or []), "Initialized", False, reason, why, gen, now
        )
        stopped = status.model_copy(
            update={
                "phase": api.RunPhase.STOPPED,
                "message": message,
                "conditions": conds,
                "end_time": format_time(now),
                "observed_generation": gen,
            }
        )
        return self._write_run(obj, stopped, spec=spec)

    def _create_upgrades(self, obj: Mapping[str, Any], upgrades: Sequence[Upgrade]) -> None:
        """Create the run's ClusterUpgrades, owned by it (idempotent by name)."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        owner = {
            "apiVersion": api.API_VERSION,
            "kind": api.UPDATE_RUN_KIND,
            "name": name,
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

        def create(u: Upgrade) -> None:
            body = {
                "apiVersion": api.API_VERSION,
                "kind": api.CLUSTER_UPGRADE_KIND,
                "metadata": {
                    "name": u.name,
                    "namespace": ns,
                    "labels": {api.LABEL_RUN: name},
                    "ownerReferences": [owner],
                    "finalizers": [api.FINALIZER],
                },
                "spec": u.spec.dump(),
            }
            with contextlib.suppress(Conflict):  # created before a crash: idempotent by name
                self.upgrades.put(self.kube.create_object(api.CLUSTER_UPGRADE_PLURAL, ns, body))

        with ThreadPoolExecutor(max_workers=8) as workers:
            list(workers.map(create, upgrades))

    # -- execute -----------------------------------------------------------------------------

    def _execute(
        self,
        obj: dict[str, Any],
        spec: api.UpdateRunSpec,
        status: api.UpdateRunStatus,
        plugins: RunPlugins,
        access: Access,
        gen: int,
        now: datetime,
    ) -> float | None:
        """One driver step over the run's ClusterUpgrades (as cached), then what it did
        recorded once (`_record`): observe, decide, act in the driver; record here."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        kept = self._children(ns, name)
        total = status.counts.total if status.counts else 0
        if len(kept.objects) < total and status.phase not in FINISHED:
            # The cache has not caught up with our own creations yet. (A run that ended may
            # have fewer: a ClusterUpgrade deleted alone goes when its run ends; resumed, the
            # run counts what is left.)
            return 1.0
        if plugins.several:
            routes = plugins.routes(kept.upgrades.values())
            moved = routes if isinstance(routes, Problem) else None
        elif isinstance(plugins.one, Reached):
            routes = {}
            moved = self._moved(spec, access, plugins.one.identity, f"{ns}/{name}")
        else:
            routes, moved = {}, None  # what it is cannot be asked: its clusters are unknown
        if moved is not None:
            return self._invalid(obj, status, [moved], gen, now)
        assert not isinstance(routes, Problem)
        try:
            # kept.own: cluster id → its pinned providerId (a run over several: how its
            # clusters meet others'; one provider: only the ids are read).
            held_by, floors, extra = self._neighbours(plugins, f"{ns}/{name}", kept.own)
        except RunNotSeen as err:
            log.info("UpdateRun %s/%s waits for the cache: %s", ns, name, err)
            return 1.0
        by_identity = {p.identity: p.name for p in plugins.reached()}
        routes.update({cid: by_identity[i] for cid, i in extra.items() if i in by_identity})
        plugins.learn(list(kept.steps.values()), routes)
        store = _KubeStore(self.kube, self.upgrades, ns, dict(kept.objects))
        driver = self._driver(obj, plugins.provider(routes), access, store)
        annotations = meta.get("annotations") or {}
        # The run's upgrades as kept now, and the names the cache says changed since the last
        # step, taken together (a later sync counts toward the next step). Issue 21: a pass
        # looks at those; what it might miss, the driver's full pass finds, and no floor lets a
        # cluster go on it unchecked.
        upgrades, changed = dict(kept.upgrades), kept.take_changed()
        try:
            result = driver.step(
                key=f"{ns}/{name}",
                uid=meta["uid"],
                spec=spec,
                upgrades=upgrades,
                stages=status.stages or [],
                held_by=held_by,
                now=now,
                approved=_csv(annotations.get(api.ANNOTATION_APPROVE_STAGES)),
                retry=_csv(annotations.get(api.ANNOTATION_RETRY_CLUSTERS)),
                # A ClusterUpgrade deleted alone: its cluster is skipped (or finishes its
                # step); the object goes when its run ends (_hold).
                skip=_csv(annotations.get(api.ANNOTATION_SKIP_CLUSTERS))
                | frozenset(kept.deleting.values()),
                floors=floors,
                skip_stages=_csv(annotations.get(api.ANNOTATION_SKIP_STAGES)),
                requested_by=requester(annotations, obj.get("spec")),
                reason=annotations.get(api.ANNOTATION_REASON) or "",
                changed=changed,
            )
        except CallError as err:
            return self._degraded(obj, status, "PluginUnavailable", str(err), gen, now, 5.0)
        except SecretError as err:
            return self._degraded(obj, status, "SecretError", str(err), gen, now, 30.0)
        down = plugins.down
        degraded: tuple[str, str] | None = None
        if result.unreachable is not None and not plugins.several:
            # The run's one plugin did not answer: its clusters were unknown this pass
            # (driver.step), and the pass went on so that steps in flight meet their bound.
            reason = "PluginUnavailable"
            degraded = reason, with_fix(reason, str(result.unreachable))
        elif down:
            degraded = PROVIDER_UNAVAILABLE, degraded_message(down)
        return self._record(obj, spec, status, result, store.objects, gen, now, degraded)

    def _moved(
        self, spec: api.UpdateRunSpec, access: Access, identity: str, run: str
    ) -> Problem | None:
        """The run's clusters belong to the provider it was allowed to use when it started
        (another address of the same plugin is the same provider): a Problem when the spec
        now points elsewhere. run: "namespace/name" (its holdings, crossrun.holding_of)."""
        moved = sorted(self._kept.holdings.providers_of(run) - {identity})
        if not moved:
            return None
        where = "spec.providerRef" if spec.provider_ref else "spec.opsEndpoint"
        return Problem(
            where,
            f"this run's clusters were pinned on provider {moved[0]} but "
            f"{access.provider.via} now points at {access.provider.endpoint} (provider "
            f"{identity}); point it back, or stop this run and start a new one",
        )

    def _driver(
        self, obj: Mapping[str, Any], provider: Provider, access: Access, store: _KubeStore
    ) -> RunDriver:
        """The run's driver over the apiserver and its plugin, with the health checks' clients
        (only those access allows) and the memory it keeps between reconciles."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]

        def client_for(ep: str | None, insecure: bool | None, tls: api.TLSConfig | None) -> Any:
            target = access.plugin(ep, insecure, tls)  # allowed by check_access above
            return self.pool.get(
                target.endpoint,
                self.tls.client_tls(target.secret_namespace, target.ops_endpoint(), target.field),
            )

        def prometheus_for(mp: api.MetricProvider) -> PrometheusTarget:
            source = access.prometheus[mp]  # allowed by check_access above
            where, ns_ = source.via, source.secret_namespace
            token = ca = None
            if source.bearer_token_secret_ref is not None:
                token = self.tls.secret_key(ns_, source.bearer_token_secret_ref, where)
            if source.ca_secret_ref is not None:
                ca = self.tls.secret_key(ns_, source.ca_secret_ref, where)
            return PrometheusTarget(
                source.address, token, ca, source.insecure_skip_verify, source.shown
            )

        analyzer = Analyzer(
            client_for,
            lambda ref: self.tls.secret_key(ns, ref, "spec.healthChecks"),
            prometheus_for,
        )
        driver = RunDriver(
            provider,
            store,
            _CountedChecker(analyzer, self.metrics, ns, name),
            self.fence,
            self._preflight.setdefault((ns, name), {}),
            parallelism=WRITE_PARALLELISM,
            executor=self._workers,
            hooks=self.hooks,
        )
        # The driver's memory of failed health evaluations whose write was lost (invariant 3)
        # lives as long as the controller, not one reconcile.
        memory = self._memory.setdefault((ns, name), _DriverMemory())
        driver.unrecorded_failures = memory.unrecorded_failures
        driver.stage_failures = memory.stage_failures
        driver.index = memory.index  # a pass looks at what changed since the last one
        driver.unknown_since = memory.unknown_since
        return driver

    def _record(
        self,
        obj: dict[str, Any],
        spec: api.UpdateRunSpec,
        status: api.UpdateRunStatus,
        result: StepResult,
        upgrades: Mapping[str, dict[str, Any]],
        gen: int,
        now: datetime,
        degraded: tuple[str, str] | None = None,
    ) -> float | None:
        """What the pass did, recorded once: the run's status (`_status_after`) with the Events
        and notifications of what took effect, the people-annotations it acted on consumed,
        the metrics; then when to look again. upgrades: the ClusterUpgrades as written."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        self.metrics.api_writes.inc(result.writes)
        new = self._status_after(obj, status, result, gen, now, degraded)
        self._write_run(obj, new, spec=spec, changes=result.changes, upgrades=upgrades)
        self._consume(obj, api.ANNOTATION_RETRY_CLUSTERS)
        self._consume(obj, api.ANNOTATION_SKIP_CLUSTERS)
        self._export_clusters(ns, name)
        if deletion.deleting(obj) and self._finalize(obj, _failed_cluster_policy(spec)):
            return None
        if rests(result.decision.phase, result.decision.keeping):
            return None
        if degraded is not None:
            # A plugin did not answer: look again soon (its clusters wait).
            return min(5.0, result.requeue_after if result.requeue_after is not None else 5.0)
        if result.writes and not result.calls_made:
            # What the echo of these writes used to do (the cache keeps it quiet now): a pass
            # that only moved state (a cluster done, a stage complete) looks again at once.
            wait = result.requeue_after
            return AFTER_WRITES if wait is None else min(wait, AFTER_WRITES)
        return result.requeue_after

    def _status_after(
        self,
        obj: Mapping[str, Any],
        status: api.UpdateRunStatus,
        result: StepResult,
        gen: int,
        now: datetime,
        degraded: tuple[str, str] | None = None,
    ) -> api.UpdateRunStatus:
        """The run's status after a pass, the one place it is built: the decision's
        (StepResult.run_status, as the simulation writes it), with the conditions and
        observedGeneration; a run being deleted says what it still brings back."""
        d = result.decision
        finished = d.phase in FINISHED
        conds = list(status.conditions or [])
        progressing = not finished and d.phase != api.RunPhase.HALTED
        conds = set_condition(conds, "Progressing", progressing, d.phase.value, d.message, gen, now)
        succeeded = d.phase == api.RunPhase.SUCCEEDED
        conds = set_condition(conds, "Succeeded", succeeded, d.phase.value, d.message, gen, now)
        if degraded is None:
            conds = set_condition(
                conds, "Degraded", False, "AsExpected", "plugin reachable", gen, now
            )
        else:  # the run's plugin, or FleetProviders of several, did not answer (_execute)
            conds = set_condition(conds, "Degraded", True, *degraded, gen, now)
        message = d.message
        if deletion.deleting(obj):
            message = self._deleting_message(obj)
            conds = set_condition(
                conds, "Deleting", True, "BringingClustersBack", message, gen, now
            )
        return result.run_status(status, now).model_copy(
            update={"message": message, "conditions": conds, "observed_generation": gen}
        )

    def _export_clusters(self, namespace: str, run: str) -> None:
        """The run's `multicluster_controller_clusters` series: its ClusterUpgrades per phase
        (as cached, the pass's writes included), every phase present (0 when none), so that
        the phases sum to the run's clusters."""
        by_phase = self._children(namespace, run).phases
        self.metrics.clusters.put(
            namespace, run, {p.value: by_phase.get(p.value, 0) for p in api.UpgradePhase}
        )

    def _neighbours(
        self, plugins: RunPlugins, run: str, own: Mapping[str, str]
    ) -> tuple[dict[str, str], list[Floor], dict[str, str]]:
        """Across namespaces, on (provider identity, cluster id): the clusters other runs hold
        and the floors of the other live runs that share clusters with this one
        (orchestrator.crossrun, orchestrator.pipeline.multi for a run over several providers,
        which the simulation calls too), and the other runs' clusters to observe beyond own
        (cluster id → identity; only for several). own: cluster id → identity (only its
        keys are read for a run on one provider)."""

        def floor_of(key: str) -> int | None:
            rns, _, rname = key.partition("/")
            if self.runs is None:
                return None
            obj = self.runs.get(rns, rname)
            if obj is None:
                # Its ClusterUpgrades are here but the run is not (the two watches have no
                # order between them): ask the apiserver, which knows whether it is gone.
                try:
                    obj = self.kube.get_object(api.UPDATE_RUN_PLURAL, rns, rname)
                except NotFound:
                    return None  # gone: what is left of it waits for the garbage collector
                except KubeError:
                    return UNSEEN  # unknown: nothing is decided on this run; look again
                self.runs.put(obj)
            if not api.run_is_live((obj.get("status") or {}).get("phase")):
                return None
            return int((obj.get("spec") or {}).get("requiredAvailableCount", 1))

        holdings = self._kept.holdings  # kept per change (orchestrator.controllers.kept)
        if plugins.several:
            return neighbours_across(holdings.holdings(), floor_of, own, run)
        identity = plugins.identity_of_one(own.values())
        held, floors = holdings.neighbours(floor_of, identity, run, own.keys())
        return held, floors, {}

    # -- deletion (orchestrator.deletion; docs/operations.md "What deleting a rollout does") --

    def _hold(self, obj: dict[str, Any], finished: bool) -> dict[str, Any]:
        """The finalizer on the run and its ClusterUpgrades (added at creation; here for objects
        created before finalizers, idempotent); a ClusterUpgrade deleted alone goes once its
        run has finished. Returns the run as written."""
        meta = obj["metadata"]
        if not deletion.has_finalizer(obj):
            try:
                obj = self.kube.add_finalizer(api.UPDATE_RUN_PLURAL, obj)
                self._put_run(obj)
            except KubeError as err:  # deleted meanwhile: the next reconcile sees it
                log.info("no finalizer on UpdateRun %s: %s", meta["name"], err)
        kept = self._children(meta["namespace"], meta["name"])
        for child in [kept.objects[n] for n in kept.unfinalized]:
            try:
                self.upgrades.put(self.kube.add_finalizer(api.CLUSTER_UPGRADE_PLURAL, child))
            except KubeError as err:  # deleted meanwhile: no finalizer may be added then
                log.info("no finalizer on ClusterUpgrade %s: %s", child["metadata"]["name"], err)
        if finished:
            self._release(meta["namespace"], meta["name"], only_deleting=True)
        return obj

    def _held(self, obj: Mapping[str, Any]) -> deletion.Holds:
        """What of the run's clusters (its ClusterUpgrades as cached) holds its deletion, under
        its failedClusterPolicy."""
        meta = obj["metadata"]
        upgrades = self._children(meta["namespace"], meta["name"]).upgrades.values()
        policy = _failed_cluster_policy(self._specs.parse(api.UpdateRunSpec, obj))
        return deletion.holds(((u.cluster_id, u.status) for u in upgrades), policy)

    def _deleting_message(self, obj: Mapping[str, Any]) -> str:
        waiting = self._held(obj).waiting
        shown = ", ".join(waiting[:10]) + (" ..." if len(waiting) > 10 else "")
        return (
            f"being deleted: bringing {len(waiting)} cluster(s) back into service before it "
            f"goes ({shown or 'none left'})"
        )

    def _finalize(self, obj: dict[str, Any], policy: api.FailedClusterPolicy) -> bool:
        """A run being deleted: True when it has let go (finalizers removed from its
        ClusterUpgrades, then from itself); False while a cluster it took out is not back.
        policy: the run's failedClusterPolicy (what it says of clusters it keeps out)."""
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        held = self._held(obj)
        if held.waiting:
            return False
        if held.kept_out:
            reason = "DeletedWithClustersKeptOut"
            more = " ..." if len(held.kept_out) > 10 else ""
            message = (
                f"deleted with {len(held.kept_out)} failed cluster(s) possibly out of service, "
                f"kept out by failedClusterPolicy {policy.value}: "
                f"{', '.join(held.kept_out[:10])}{more}; service them back in by hand once "
                "repaired"
            )
            log.warning("UpdateRun %s/%s: %s: %s", ns, name, reason, message)
            if self.emit_event is not None:
                event = event_name(name, f"{meta['uid']}/{reason}")
                self.emit_event(obj, reason, message, True, event)
        self._release(ns, name, only_deleting=False)
        released = self.kube.remove_finalizer(api.UPDATE_RUN_PLURAL, obj)
        if released is not None:
            if self.runs is not None:
                self.runs.put(released, deleted=deletion.released(released))
            log.info("UpdateRun %s/%s: nothing left to bring back; finalizer removed", ns, name)
        return True

    def _release(self, ns: str, name: str, *, only_deleting: bool) -> None:
        """Remove the finalizer from the run's ClusterUpgrades (only_deleting: from those being
        deleted; called once the run has ended or is gone)."""
        for child in self.upgrades.by_label(ns, name):
            if not deletion.has_finalizer(child):
                continue
            if only_deleting and not deletion.deleting(child):
                continue
            try:
                written = self.kube.remove_finalizer(api.CLUSTER_UPGRADE_PLURAL, child)
            except KubeError as err:
                log.info("finalizer of ClusterUpgrade %s: %s", child["metadata"]["name"], err)
                continue
            if written is not None:
                self.upgrades.put(written, deleted=deletion.released(written))

    def _consume(self, obj: dict[str, Any], key: str) -> None:
        """Remove the ids a people-annotation named: each is acted on once, then consumed."""
        asked = _csv((obj["metadata"].get("annotations") or {}).get(key))
        if not asked:
            return
        meta = obj["metadata"]
        try:
            # Into the cache at once: the next pass must not act on what was consumed.
            self._put_run(
                self.kube.merge_patch(
                    api.UPDATE_RUN_PLURAL,
                    meta["namespace"],
                    meta["name"],
                    {"metadata": {"annotations": {key: None}}},
                )
            )
        except KubeError as err:
            log.info("could not consume %s on %s: %s", key, meta["name"], err)

    # -- status ----------------------------------------------------------------------------

    def _write_run(
        self,
        obj: dict[str, Any],
        status: api.UpdateRunStatus,
        *,
        spec: api.UpdateRunSpec | None = None,
        changes: Sequence[ClusterChange] = (),
        upgrades: Mapping[str, dict[str, Any]] | None = None,
    ) -> float | None:
        """Write the run's status (if changed), then announce what the pass's writes that took
        effect changed (the run's, and its ClusterUpgrades': changes): Events and notifications.

        spec: the run's (whose notifications are sent; None: its spec is not valid, none are);
        upgrades: the ClusterUpgrades as written, by name (the subjects of their Events).
        """
        before = obj.get("status") or {}
        body = status.dump()
        written: api.UpdateRunStatus | None = None
        requeue: float | None = None
        if body != before:
            meta = obj["metadata"]
            try:
                updated = self.kube.write_status(
                    api.UPDATE_RUN_PLURAL,
                    meta["namespace"],
                    meta["name"],
                    body,
                    meta["resourceVersion"],
                )
            except Conflict:
                requeue = 0.0
            else:
                obj["status"] = updated.get("status", body)
                obj["metadata"] = updated["metadata"]
                written = status
                # Write-through, as for ClusterUpgrades: the next run reconciled here reads
                # this run's phase (is its floor live?) as written, not as the watch last
                # brought it (a run resumed a moment ago binds its floor at once); the next
                # pass of this run reads it there (`_read_run`).
                self._put_run(updated)
        if written is not None or changes:
            self._announce(obj, before, written, spec, changes, upgrades or {})
        return requeue

    def _announce(
        self,
        obj: dict[str, Any],
        before: Mapping[str, Any],
        written: api.UpdateRunStatus | None,
        spec: api.UpdateRunSpec | None,
        changes: Sequence[ClusterChange],
        upgrades: Mapping[str, dict[str, Any]],
    ) -> None:
        """One Event per transition per object, and the notifications the spec asks for; both
        from orchestrator.transitions, computed only from writes that took effect."""
        meta = obj["metadata"]
        prev = _run_status({"status": before})
        new = written if written is not None else prev
        found = transitions(meta["uid"], prev, new, changes)
        if not found:
            return
        if self.emit_event is not None:
            self._events(obj, found, upgrades)
        if (
            self.notifier is None
            or spec is None
            or not spec.notifications
            or all(t.event is None for t in found)
        ):
            return
        ns = meta["namespace"]
        if not self.catalog.policy.allows_inline(ns):
            # A notification URL is an address written by the namespace's users (in a Secret):
            # like an inline endpoint, only where the orchestrator's configuration allows.
            reason = "NotificationsNotAllowed"
            message = (
                f"spec.notifications: notification URLs are not used in namespace {ns}; "
                "ask the platform admin to allow it (--allow-inline-endpoints-in), or remove "
                "spec.notifications"
            )
            log.warning("UpdateRun %s/%s: %s", ns, meta["name"], message)
            if self.emit_event is not None:
                name = event_name(meta["name"], f"{meta['uid']}/{reason}")
                self.emit_event(obj, reason, message, True, name)
            return
        self.notifier.notify(ns, meta["name"], spec.notifications, found, new, self.clock())

    def _events(
        self,
        obj: dict[str, Any],
        found: Sequence[Transition],
        upgrades: Mapping[str, dict[str, Any]],
    ) -> None:
        """One Event per transition, where people look. A run a ClusterVersion owns records
        its run and stage transitions on that ClusterVersion (the object people applied and
        `kubectl describe`), instead of on the UpdateRun: moved, not copied, so the Event
        load does not grow. A cluster's transitions stay on its ClusterUpgrade; a cluster that
        failed, and a person's retry or skip of one, are also told on the ClusterVersion: one
        more Event for each, the only copies. Which Events a pass makes (one per cluster at most,
        many clusters' alike as one on the run) is engine.transitions.events_of's."""
        assert self.emit_event is not None
        owner = cluster_version_of(obj)
        run = obj["metadata"]["name"]
        for t in events_of(found, self.step_events):
            if t.upgrade:
                target = upgrades.get(t.upgrade, obj)
                name = event_name(target["metadata"]["name"], t.id)
                self.emit_event(target, t.reason, t.message, t.warning, name)
                if owner is None or (t.event is None and not t.person):
                    continue
            target = owner if owner is not None else obj
            about = f"cluster {t.cluster}: " if t.upgrade and t.cluster else ""
            message = f"UpdateRun {run}: {about}{t.message}" if owner is not None else t.message
            name = event_name(target["metadata"]["name"], t.id)
            self.emit_event(target, t.reason, message, t.warning, name)

    def _invalid(
        self,
        obj: dict[str, Any],
        status: api.UpdateRunStatus,
        problems: list[Problem],
        gen: int,
        now: datetime,
    ) -> float | None:
        text = "; ".join(str(p) for p in problems[:5])
        if len(problems) > 5:
            text += f"; and {len(problems) - 5} more"
        in_flight = status.counts.in_flight if status.counts else 0
        if in_flight:
            # E.g. access revoked mid-run: nothing is called without access, so clusters taken
            # out stay where they are; say so, and that fixing the problem resumes them.
            text += (
                f"; {in_flight} cluster(s) in flight wait where they are (possibly out of "
                f"service) until this is fixed: kubectl get cu -l {api.LABEL_RUN}="
                f"{obj['metadata']['name']}"
            )
        conds = set_condition(
            list(status.conditions or []), "Ready", False, "InvalidSpec", text, gen, now
        )
        return self._write_run(
            obj,
            status.model_copy(
                update={
                    "phase": api.RunPhase.INVALID,
                    "message": text,
                    "conditions": conds,
                    "observed_generation": gen,
                }
            ),
        )

    def _degraded(
        self,
        obj: dict[str, Any],
        status: api.UpdateRunStatus,
        reason: str,
        message: str,
        gen: int,
        now: datetime,
        retry: float,
    ) -> float:
        """Degraded: the cause first (a failed call's code said once: str(CallError)), then the
        fix where one is known."""
        conds = set_condition(
            list(status.conditions or []),
            "Degraded",
            True,
            reason,
            with_fix(reason, message),
            gen,
            now,
        )
        self._write_run(obj, status.model_copy(update={"conditions": conds}))
        return retry

    def count_operation(self, plugin: str, op: OpObs) -> None:
        """Count a terminal operation of ours once (request ids start with a run's uid)."""
        if op.request_id.split(":", 1)[0] not in self.uids:
            return
        counter = (
            self.metrics.success_operation
            if op.state == OpState.SUCCEEDED
            else self.metrics.failed_operation
        )
        counter.labels(op.kind.value, plugin).inc()


def _run_status(obj: Mapping[str, Any]) -> api.UpdateRunStatus:
    try:
        return api.UpdateRunStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        return api.UpdateRunStatus()


def _failed_cluster_policy(
    spec: api.UpdateRunSpec | list[Problem],
) -> api.FailedClusterPolicy:
    """The run's failedClusterPolicy (the default where its spec is not valid)."""
    strategy = None if isinstance(spec, list) else spec.strategy
    return (strategy or api.Strategy()).failed_cluster_policy


def _pinned_status(
    status: api.UpdateRunStatus, pinned: Pinned, gen: int, now: datetime
) -> api.UpdateRunStatus:
    """The status of a run once its ClusterUpgrades are pinned: Initialized, every stage
    Pending, the cluster set's digest."""
    conds = set_condition(
        list(status.conditions or []),
        "Initialized",
        True,
        "Pinned",
        f"{len(pinned.upgrades)} ClusterUpgrades pinned",
        gen,
        now,
    )
    return status.model_copy(
        update={
            "phase": api.RunPhase.PROGRESSING,
            "message": f"{len(pinned.upgrades)} clusters pinned",
            "cluster_set_digest": pinned.digest,
            "counts": api.RunCounts(total=len(pinned.upgrades), pending=len(pinned.upgrades)),
            "stages": [
                api.StageStatus(
                    name=s,
                    phase=api.StagePhase.PENDING,
                    total=sum(1 for u in pinned.upgrades if u.spec.stage == s),
                    upgraded=0,
                )
                for s in pinned.stage_names
            ],
            "start_time": format_time(now),
            "conditions": conds,
            "observed_generation": gen,
        }
    )


def _people(obj: Mapping[str, Any]) -> bool:
    annotations = obj["metadata"].get("annotations") or {}
    return bool(
        annotations.get(api.ANNOTATION_RETRY_CLUSTERS)
        or annotations.get(api.ANNOTATION_SKIP_CLUSTERS)
    )


def _csv(value: str | None) -> frozenset[str]:
    return frozenset(v.strip() for v in (value or "").split(",") if v.strip())


def cluster_version_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ClusterVersion that owns a run (its controller ownerReference), as the subject of
    an Event; None for a run applied directly."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == api.KIND and ref.get("controller"):
            return {
                "apiVersion": ref.get("apiVersion", api.API_VERSION),
                "kind": api.KIND,
                "metadata": {
                    "name": ref["name"],
                    "namespace": meta.get("namespace"),
                    "uid": ref.get("uid"),
                },
            }
    return None
