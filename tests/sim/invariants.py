"""The eight safety invariants (docs/architecture.md), checked against the model's ground truth.

`Monitor` is called by the model at every plugin call, at every operation's effect and after
every step of the history (an operation advancing, an adversary action, one reconcile); the
first broken invariant raises `Violation` naming it. Where the world makes an invariant
unreachable, the precondition is written next to the check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator import api
from orchestrator.engine import windows
from orchestrator.engine.decide import (
    ACTIVE,
    PROVIDER_UNAVAILABLE,
    RECOVER_GAVE_UP,
    RECOVER_STEP,
    SKIPPED_BY_PEOPLE,
    Call,
    attempt_of,
    checks_for,
    retry_words,
    short_of_target,
    step_of,
    target_of,
)
from orchestrator.engine.observations import OpKind, OpState
from orchestrator.engine.transitions import PEOPLES_WORDS
from plugins.sdk import versions
from tests.sim.model import ADVERSARY, Evaluation, MCluster, MOp, UpObj, at, seconds

if TYPE_CHECKING:
    from tests.sim.world import World

U = api.UpgradePhase
#: Slack on every bound: the longest requeue (30 s) twice, plus an operation's tick.
SLACK = 90
_STEP_KIND = {
    U.SERVICING_OUT: "service_out",
    U.UPGRADING_CONTROL_PLANE: "control_plane",
    U.UPGRADING_NODE_POOLS: "node_pool",
    U.SERVICING_IN: "service_in",
}


#: How long a provider must have answered no inventory read before a step in flight may fail
#: for it, as docs/operations.md promises (the engine's UNREACHABLE_GRACE; the harness keeps
#: its own number, so that a smaller grace in the engine is caught).
PROVIDER_SILENCE = 10


class Violation(AssertionError):
    """An invariant broke; `world` carries the history (set by tests.sim.world.simulate)."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"[{invariant}] {message}")
        self.invariant = invariant
        self.world: World | None = None


class Monitor:
    """Ground-truth bookkeeping and the checks."""

    def __init__(self, world: World) -> None:
        self.w = world
        self.members: dict[str, list[str]] = {}
        self.up_key: dict[tuple[str, str], str] = {}
        #: (run, cluster id) a deleted run let go, kept out by an explicit policy (run_deleted).
        self.let_go: set[tuple[str, str]] = set()
        self.runs_of: dict[str, list[str]] = {}
        self.evals: dict[tuple[str, str], list[Evaluation]] = {}
        self.stage_evals: dict[tuple[str, str], list[Evaluation]] = {}
        self.step_ops: dict[tuple[str, str, str, str, str, int], list[str]] = {}
        self.seen_ops: set[str] = set()
        self.floors: dict[str, int] = {}
        self.grace: dict[str, set[str]] = {}
        #: Lowest available-and-in-service count seen over each run's clusters.
        self.min_up: dict[str, int] = {}
        self.last_change = 0
        self.calls = 0
        self.service_ins: dict[str, int] = {}
        self._replica = ""
        #: (run, upgrade key, replica, incarnation) of each service-out decided in this step.
        self._decided_outs: list[tuple[str, str, str, int]] = []
        #: The replica whose reconcile is running (its writes are its decisions).
        self.acting: tuple[str, int] = ("", 0)
        self._bounds: dict[tuple[str, api.UpgradePhase, str], int] = {}
        #: (run, cluster) → simulated seconds of evaluations some write recorded.
        self.recorded: dict[tuple[str, str], set[int]] = {}
        #: (run, stage index) whose gate a service-out of a later stage already proved; a member
        #: going active again (a retry) reopens it. Later status-only changes (a person
        #: skipping a member that had failed) do no work, so they do not move its end.
        self._stage_proven: set[tuple[str, int]] = set()
        #: (run, stage) → simulated seconds of stage evaluations some run-status write recorded.
        self.stage_recorded: dict[tuple[str, str], set[int]] = {}
        #: Provider ("" for a history's one plugin, else the FleetProvider) → the simulated
        #: seconds at which some replica's inventory read was answered.
        self.answered: dict[str, list[int]] = {}

    # -- bookkeeping ---------------------------------------------------------------------

    def inventory_read(self, provider: str) -> None:
        """Some replica's inventory read of provider was answered now."""
        self.answered.setdefault(provider, []).append(self.w.now)

    def _provider_silent(self, cid: str, st: api.ClusterUpgradeStatus) -> bool:
        """A step failed ProviderUnavailable as documented (docs/operations.md, "One provider
        down"): no inventory read of the cluster's provider was answered in the PROVIDER_SILENCE
        seconds before the failure. That is the provider's fault, not drift's (seed 113925: a
        deleted cluster's provider failed every read from its step's bound on); one unanswered
        read as the bound passes is not (seed 99711)."""
        if st.reason != PROVIDER_UNAVAILABLE or not st.end_time:
            return False
        end = seconds(st.end_time)
        since = end - PROVIDER_SILENCE
        provider = self.w.member_of.get(cid, "") if self.w.cfg.providers > 1 else ""
        return not any(since <= t <= end for t in self.answered.get(provider, ()))

    def run_pinned(self, run: str) -> None:
        ids = []
        for obj in self.w.api.upgrades_of(run):
            cid = obj.upgrade.cluster_id
            ids.append(cid)
            self.up_key[(run, cid)] = obj.key
            self.runs_of.setdefault(cid, []).append(run)
        self.members[run] = ids
        self.floors[run] = self.w.api.runs[run].spec.required_available_count
        self._grant_grace(run)
        self._floor(run, f"run {run} pinned")

    def _grant_grace(self, run: str) -> None:
        """Precondition of the floor: what was out (or on its way out) because of us when a run
        was pinned or its floor raised was decided before that floor bound anyone, a cluster
        away from the inventory then included; it counts against the floor once it is back and
        free."""
        active, clusters = self.w.api.active, self.w.fleet.clusters
        grace = {
            c
            for c in self.members[run]
            if self._cause(c) == "ours"
            or active.get(c)
            # Out of service because of a run, though away from the inventory now: taken
            # out before this floor bound anyone, it counts once back and free (seed 87178).
            or (not clusters[c].in_service and clusters[c].out_by not in (None, ADVERSARY))
        }
        if grace:
            self.grace[run] = grace

    def run_resumed(self, run: str) -> None:
        """A person resumed a stopped run: its floor binds again (like a run pinned now).

        Precondition: what other runs took out while it was stopped (its floor bound no one)
        counts against it once back."""
        if run in self.members:
            self._grant_grace(run)

    def floor_changed(self, run: str) -> None:
        """A person raised or lowered the floor of a run in flight.

        Precondition: clusters already out because of us when the floor went up were taken out
        under the old floor; they count against the new one only once they are back.
        """
        new = self.w.api.runs[run].spec.required_available_count
        if run in self.members and new > self.floors.get(run, new):
            self._grant_grace(run)
        self.floors[run] = new

    def record(self, e: Evaluation) -> None:
        if e.scope == "stage":
            self.stage_evals.setdefault((e.run, e.stage), []).append(e)
        else:
            [cid] = e.clusters
            self.evals.setdefault((e.run, cid), []).append(e)

    def on_write(self, obj: UpObj, old: api.ClusterUpgradeStatus) -> None:
        new = obj.upgrade.status
        if retry_words(new.message or "") != retry_words(old.message or ""):
            # A retry that waited keeps the words it was asked with, checked when they were
            # first written (the request on record then): saying what it waits for, or
            # applying, is not a new request (seeds 84303, 84469).
            self._who_asked(obj.run, obj.upgrade.cluster_id, new.message or "")
        if new.phase != old.phase:
            self.last_change = self.w.now
            if new.phase in ACTIVE and old.phase not in ACTIVE:
                self._stage_proven.discard((obj.run, obj.upgrade.spec.stage_index))
            c = self.w.fleet.clusters.get(obj.upgrade.cluster_id)
            ours_out = c is not None and not c.in_service and c.out_by == obj.run
            if new.phase == U.SERVICING_OUT and old.phase not in ACTIVE and not ours_out:
                # A service-out decided now: the stage gate is checked once this pass's
                # writes are all in (the members of the stage before may be written later).
                self._decided_outs.append((obj.run, obj.key, *self.acting))
                self._admission(
                    obj.run,
                    obj.upgrade,
                    f"service-out of {obj.upgrade.cluster_id} decided by {obj.run}",
                )
        if new.health is not None and new.health.last_check_time:
            t = seconds(new.health.last_check_time)
            self.recorded.setdefault((obj.run, obj.upgrade.cluster_id), set()).add(t)

    def _who_asked(self, run: str, cid: str, message: str) -> None:
        """Who asked is recorded as the shipped code records it (issue 24): a retry or skip
        names the user the admission webhook authenticated for the run's requests, never one
        typed by hand, and "unauthenticated" when the webhook saw none (tests/sim/people.py)."""
        said = next((w for w in PEOPLES_WORDS if message.startswith(w)), None)
        if said is None:
            return
        who = message.removeprefix(said).rsplit(": ", 1)[0]
        wrong = self.w.people.check(run, who)
        if wrong is not None:
            raise Violation("who asked", f"{cid} of {run}: {message!r}: {wrong}")

    def on_run_write(self, run: str, status: api.UpdateRunStatus) -> None:
        """A run-status write took effect: the stage evaluations it carries are on record."""
        for stage in status.stages or ():
            if stage.health is not None and stage.health.last_check_time:
                t = seconds(stage.health.last_check_time)
                self.stage_recorded.setdefault((run, stage.name), set()).add(t)

    def spec_version(self, run: str, upgrade: str) -> str:
        ns = self.w.api.runs[run].namespace
        return self.w.api.upgrades[f"{ns}/{upgrade}"].upgrade.spec.version

    def _live(self, run: str) -> bool:
        obj = self.w.api.runs.get(run)  # None: deleted and gone
        return obj is not None and obj.initialized and api.run_is_live(obj.status.phase)

    def run_deleted(self, run: str, kept_out: Sequence[str]) -> None:
        """4. A run being deleted went (its finalizers released): every cluster it took out is
        back in service, except those its record keeps out by an explicit policy (kept_out:
        failedClusterPolicy KeepOut, a recovery that gave up), which the controller names in a
        Warning Event. Those are let go; any other cluster still out because of it is stranded."""
        w = self.w
        obj = w.api.runs[run]
        policy = (obj.spec.strategy or api.Strategy()).failed_cluster_policy
        for cid in kept_out:
            c = w.fleet.clusters.get(cid)
            key = self.up_key.get((run, cid))
            up = w.api.upgrades.get(key) if key is not None else None
            out = c is not None and not c.in_service and not c.deleted and c.out_by == run
            if (
                out
                and up is not None
                and policy == api.FailedClusterPolicy.SERVICE_IN_IF_HEALTHY
                and up.upgrade.status.phase == U.FAILED
                and up.upgrade.status.step != RECOVER_GAVE_UP
            ):
                # The policy brings a Failed cluster back once it can (unless its recovery
                # gave up): nothing explicit keeps this one out, so letting it go strands it.
                raise Violation(
                    "4 never stranded",
                    f"{cid} is out of service because of {run}, which was deleted and let it "
                    f"go as kept out ({up.upgrade.status.reason}, step "
                    f"{up.upgrade.status.step}), though failedClusterPolicy "
                    "ServiceInIfHealthy brings it back",
                )
            self.let_go.add((run, cid))
        for cid in sorted(w.fleet.out_set):
            c = w.fleet.clusters[cid]
            if c.in_service or c.deleted or c.out_by != run or (run, cid) in self.let_go:
                continue
            raise Violation(
                "4 never stranded",
                f"{cid} is out of service because of {run}, which was deleted and went "
                "without bringing it back",
            )

    def _cause(self, cid: str) -> str:
        """up | ours | adversary: why a cluster is not available-and-in-service."""
        fleet = self.w.fleet
        c = fleet.clusters[cid]
        if fleet.up(c):
            return "up"
        if c.deleted or c.adv_down:
            return "adversary"
        if not c.in_service and c.out_by == ADVERSARY:
            return "adversary"
        op = fleet.ops.get(c.op) if c.op else None
        if fleet.cp_running(c) and op is not None and op.owner == ADVERSARY:
            return "adversary"
        return "ours"

    # -- operating a rollout (issue 12) ---------------------------------------------------

    def _admission(self, run: str, up: object, what: str) -> None:
        """At the moment a new service-out is decided (its intent written, every earlier write
        of the pass in): no cluster a person skipped, no member of a skipped stage, nothing
        once a failure budget is exceeded, nothing before notBefore or while the cluster's
        maintenance gate is closed."""
        w = self.w
        obj = w.api.runs[run]
        spec = up.spec  # type: ignore[attr-defined]
        strategy = obj.spec.strategy or api.Strategy()
        skip = obj.spec.skip or api.SkipSpec()
        skipped_stages = set(skip.stages or ()) | obj.skip_stages
        if spec.cluster_id in (skip.clusters or ()):
            raise Violation("people", f"{what}: the cluster is in spec.skip.clusters")
        if spec.stage in skipped_stages:
            raise Violation("people", f"{what}: its stage {spec.stage} was skipped")
        # Failure budgets: Failed clusters, and Blocked/Refused ones once their stage has
        # nothing else left to do (a refusal takes nothing out).
        by_stage: dict[int, list[api.ClusterUpgradeStatus]] = {}
        names: dict[int, str] = {}
        ids: dict[int, str] = {}  # id(status) → cluster id, to name the failures counted
        for o in w.api.upgrades_of(run):
            by_stage.setdefault(o.upgrade.spec.stage_index, []).append(o.upgrade.status)
            ids[id(o.upgrade.status)] = o.upgrade.spec.cluster_id
            names[o.upgrade.spec.stage_index] = o.upgrade.spec.stage
        stage_specs = {s.name: s for s in strategy.stages or []}
        total = 0
        counted: list[str] = []
        for index, sts in sorted(by_stage.items()):
            failed = sum(1 for st in sts if st.phase == U.FAILED)
            refused = sum(1 for st in sts if st.phase == U.BLOCKED and st.reason == "Refused")
            settled = failed + refused + sum(
                1 for st in sts if st.phase in (U.UPGRADED, U.SKIPPED)
            ) == len(sts)
            count = failed + (refused if settled else 0)
            total += count
            counted += [
                f"{ids[id(st)]} {st.phase.value}/{st.reason}"
                for st in sts
                if st.phase == U.FAILED
                or (settled and st.phase == U.BLOCKED and st.reason == "Refused")
            ]
            stage = stage_specs.get(names[index])
            if (
                stage is not None
                and stage.max_failures is not None
                and names[index] not in skipped_stages
                and count > api.parse_max_failures(stage.max_failures, len(sts))
            ):
                raise Violation(
                    "budget",
                    f"{what}: stage {names[index]} has {count} failure(s), past its "
                    f"maxFailures {stage.max_failures}",
                )
        members = sum(len(v) for v in by_stage.values())
        if strategy.max_failures is not None:
            budget: int | None = api.parse_max_failures(strategy.max_failures, members)
        else:
            budget = 0 if strategy.on_failure == api.OnFailure.HALT else None
        if budget is not None and total > budget:
            raise Violation(
                "budget",
                f"{what}: {total} failure(s) in the run, past its budget {budget} "
                f"({', '.join(sorted(counted))})",
            )
        now = at(w.now)
        if strategy.not_before and now < windows.parse_time(strategy.not_before):
            raise Violation("time", f"{what}: before notBefore {strategy.not_before}")
        stage = stage_specs.get(spec.stage)
        maintenance = (
            stage.maintenance
            if stage is not None and stage.maintenance is not None
            else strategy.maintenance
        )
        if maintenance is not None:
            c = w.fleet.clusters[spec.cluster_id]
            minor = versions.parse(c.cp)[:2] != versions.parse(spec.version)[:2]
            gate = windows.gate(maintenance, (), now, minor=minor)
            if not gate.may_start:
                raise Violation("time", f"{what}: its maintenance gate is closed: {gate.reason}")

    # -- 1. floor ------------------------------------------------------------------------

    def _floor(self, run: str, when: str) -> None:
        members = self.members.get(run)
        if not members:
            return
        required = self.w.api.runs[run].spec.required_available_count
        causes = [self._cause(c) for c in members]
        up = causes.count("up")
        self.min_up[run] = min(self.min_up.get(run, up), up)
        ours = {c for c, why in zip(members, causes, strict=True) if why == "ours"}
        grace = self.grace.get(run)
        if grace is not None:
            active = self.w.api.active
            grace -= {
                c
                for c, why in zip(members, causes, strict=True)
                if why == "up" and not active.get(c)
            }
            if not grace:
                del self.grace[run]
        allowed = max(0, len(members) - required) + len(ours & (grace or set()))
        if len(ours) > allowed:
            adversary = causes.count("adversary")
            raise Violation(
                "1 floor",
                f"{when}: run {run}: {len(ours)} of its {len(members)} clusters are out of "
                f"service or unavailable because of the orchestrator ({sorted(ours)[:8]}), "
                f"{adversary} because of the world; requiredAvailableCount {required} allows "
                f"{allowed}; available and in service: {up}",
            )

    def on_effect(self, op: MOp, c: MCluster) -> None:
        """Right after an operation took effect: a service-out of ours checks every run."""
        if op.kind is OpKind.SERVICE_OUT and op.owner != ADVERSARY:
            for run in self.runs_of.get(c.id, ()):
                if self._live(run):
                    self._floor(run, f"service-out of {c.id} by {op.owner} took effect")
        elif op.kind is OpKind.SERVICE_IN:
            self.service_ins[c.id] = self.service_ins.get(c.id, 0) + 1

    # -- at every plugin call ------------------------------------------------------------

    def on_preflight(self, replica: str, run: str, cid: str) -> None:
        if self.w.lease.holder != replica:
            raise Violation(
                "8 fenced", f"{replica} asked PreflightUpgrade({cid}) for {run} without the Lease"
            )

    def on_call(self, replica: str, run: str, call: Call) -> int:
        self._replica = replica
        return self._on_call(replica, run, call)

    def _on_call(self, replica: str, run: str, call: Call) -> int:
        """Checks a mutating call as it is issued; returns the attempt on record."""
        w = self.w
        self.calls += 1
        what = f"{call.kind.value} of {call.cluster_id} by {run} ({replica})"
        if w.lease.holder != replica:
            raise Violation("8 fenced", f"{what} issued while {w.lease.holder} holds the Lease")
        obj = w.api.runs[run]
        up = w.api.upgrades[f"{obj.namespace}/{call.upgrade}"].upgrade
        st = up.status
        # failedClusterPolicy ServiceInIfHealthy: a Failed cluster's service-in back, its
        # intent persisted on the Failed upgrade (not held: Failed is not an active phase).
        recovering = (
            call.kind is OpKind.SERVICE_IN
            and st.phase == U.FAILED
            and st.step == RECOVER_STEP
            and st.request_id == call.request_id
        )
        policy = (obj.spec.strategy or api.Strategy()).failed_cluster_policy
        if recovering and policy != api.FailedClusterPolicy.SERVICE_IN_IF_HEALTHY:
            raise Violation("3 gate", f"{what}: a Failed cluster serviced in under {policy}")
        chained = st.next_request_ids or []
        if (
            not recovering
            and call.kind is OpKind.NODE_POOL
            and st.phase == U.UPGRADING_NODE_POOLS
            and call.request_id in chained
        ):
            self._chained_turn(call, [st.request_id or "", *chained], what)
        elif not recovering and (st.request_id != call.request_id or st.phase not in ACTIVE):
            raise Violation(
                "6 no duplicate mutation",
                f"{what}: request id {call.request_id} is not the persisted intent "
                f"(on record: {st.phase} {st.request_id})",
            )
        holders = w.api.active.get(call.cluster_id, set())
        if holders != (set() if recovering else {run}):
            raise Violation(
                "2 one owner",
                f"{what}: the cluster is held by {sorted(holders)} at the moment of the call",
            )
        c = w.fleet.clusters[call.cluster_id]
        if call.kind is OpKind.SERVICE_OUT:
            self._refused_before_drained(run, up, what)
        elif call.kind in (OpKind.CONTROL_PLANE, OpKind.NODE_POOL):
            # Precondition: unless someone else put it back in service since our service-out.
            if c.in_service and not c.deleted and c.adv_in_at < c.last_so_call:
                raise Violation(
                    "1 floor",
                    f"{what}: upgrading a cluster that is in service (never drained): "
                    "it drops out of the available count unannounced",
                )
        elif call.kind is OpKind.SERVICE_IN:
            self._gate(run, up, what)
        return st.attempt

    def _chained_turn(self, call: Call, rids: list[str], what: str) -> None:
        """6: a node pool persisted in a chain (status.nextRequestIds) starts only once every
        pool before it in the chain is done: its operation succeeded, or, where the plugin
        has none for it, the pool is at its target. One pool at a time, none skipped."""
        fleet = self.w.fleet
        c = fleet.clusters[call.cluster_id]
        for rid in rids[: rids.index(call.request_id)]:
            known = fleet.by_rid.get(rid)
            if known is not None:
                if fleet.ops[known].state is OpState.SUCCEEDED:
                    continue
                raise Violation(
                    "6 no duplicate mutation",
                    f"{what}: chained request {call.request_id} started while {rid} before "
                    f"it is {fleet.ops[known].state.value}",
                )
            pool = step_of(rid).partition("/")[2]
            target = target_of(rid)
            if pool in c.pools and not versions.meets(c.pools[pool].version, target):
                raise Violation(
                    "6 no duplicate mutation",
                    f"{what}: chained request {call.request_id} started while pool {pool} "
                    f"before it is short of {target} with no operation",
                )

    def on_op(self, run: str, up_name: str, call: Call, op: MOp, attempt: int) -> None:
        """6: a step (run, cluster, kind, pool, target, attempt) starts at most one operation."""
        if op.id in self.seen_ops or not op.effective:
            return
        self.seen_ops.add(op.id)
        target = op.target
        # The step is the one its request id names: a retry of a Failed cluster whose
        # service-in back was asked adopts that request, made for an earlier attempt; the
        # adopting attempt's own recovery, should that service-in fail, is another step
        # (simulation seed 93724: the two were keyed alike).
        kind = "recover" if step_of(call.request_id) == RECOVER_STEP else call.kind.value
        made_for = attempt_of(call.request_id)
        key = (
            run,
            call.cluster_id,
            kind,
            call.node_pool,
            target,
            attempt if made_for is None else made_for,
        )
        ops = self.step_ops.setdefault(key, [])
        ops.append(op.id)
        fleet = self.w.fleet
        live = [i for i in ops if not fleet.ops[i].abandoned]
        if len(live) > 1:
            raise Violation(
                "6 no duplicate mutation",
                f"step {key} started {len(live)} operations that did work: {live}",
            )

    def _refused_before_drained(self, run: str, up: object, what: str) -> None:
        """5. Precondition: the provider declares PREFLIGHT_UPGRADE (else nothing can be asked)."""
        if not self.w.cfg.preflight:
            return
        u = up  # an engine Upgrade
        spec = u.spec  # type: ignore[attr-defined]
        obs = self.w.fleet.obs(spec.cluster_id)
        if obs is None:
            return  # deleted
        # What the run will upgrade: only what is still short of target (invariant 7).
        control_plane, pools = short_of_target(obs, spec)
        refused = self.w.fleet.refusal(spec.cluster_id, control_plane, pools)
        if refused is not None:
            raise Violation(
                "5 refused before drained",
                f"{what}: the provider refuses what is short of target here (control plane "
                f"{control_plane or 'done'}, node pools {pools}) ({refused[0]}: {refused[1]}) "
                "and it is being taken out of service anyway",
            )

    def _stage_order(
        self, run: str, up: object, what: str, decider: tuple[str, int] = ("", 0)
    ) -> None:
        """3. No cluster of stage N+1 goes out before stage N completed and passed its checks.

        Checked when the service-out is decided (its intent written): a re-issue of that
        intent later, e.g. after a crash, follows the decision made then. `decider` is the
        replica (and incarnation) that wrote the decision."""
        spec = up.spec  # type: ignore[attr-defined]
        if spec.stage_index == 0:
            return
        obj = self.w.api.runs[run]
        on_failure = (obj.spec.strategy or api.Strategy()).on_failure
        by_stage: dict[int, list[UpObj]] = {}
        for o in self.w.api.upgrades_of(run):
            by_stage.setdefault(o.upgrade.spec.stage_index, []).append(o)
        for j in range(spec.stage_index):
            members = by_stage.get(j, [])
            ends = []
            name = obj.stage_names[j] if j < len(obj.stage_names) else ""
            skip = obj.spec.skip or api.SkipSpec()
            if name in set(skip.stages or ()) | obj.skip_stages:
                continue  # skipped by a person: not completed, not checked; the run moves on
            if (run, j) in self._stage_proven:
                continue
            budgeted = (
                on_failure == api.OnFailure.CONTINUE
                or (obj.spec.strategy is not None and obj.spec.strategy.max_failures is not None)
                or any(
                    s.max_failures is not None
                    for s in (obj.spec.strategy.stages if obj.spec.strategy else None) or []
                    if s.name == name
                )
            )
            for o in members:
                st = o.upgrade.status
                done = st.phase in (U.UPGRADED, U.SKIPPED)
                # Failures within the budgets (checked at every admission) are tolerated.
                tolerated = budgeted and (
                    st.phase == U.FAILED or (st.phase == U.BLOCKED and st.reason == "Refused")
                )
                if not (done or tolerated):
                    raise Violation(
                        "3 gate",
                        f"{what}: stage {j} is not complete: {o.upgrade.cluster_id} is "
                        f"{st.phase} ({st.reason})",
                    )
                if st.end_time:
                    ends.append(seconds(st.end_time))
            name = obj.stage_names[j] if j < len(obj.stage_names) else ""
            checks = checks_for(obj.spec, name)
            if checks is None or not members:
                continue
            since = max(ends, default=0)
            # Precondition (as for a cluster's gate): an evaluation no run-status write recorded
            # counts if the deciding replica made it in this incarnation; one lost with a crashed
            # or another replica's memory (deposed, or its write lost) was never acted on.
            recorded = self.stage_recorded.get((run, name), set())
            evals = [
                e
                for e in self.stage_evals.get((run, name), [])
                if e.t >= since and (e.t in recorded or (e.replica, e.epoch) == decider)
            ]
            need = checks.success_threshold
            if len(evals) < need or not all(e.passed for e in evals[-need:]):
                raise Violation(
                    "3 gate",
                    f"{what}: stage {name} completed at t={since} but its checks did not pass "
                    f"{need} time(s) in a row since (evaluations: "
                    f"{[(e.t, e.passed) for e in evals[-5:]]})",
                )
            self._stage_proven.add((run, j))

    def _gate(self, run: str, up: object, what: str) -> None:
        """3. Service-in only after successThreshold passing evaluations since the upgrade."""
        obj = self.w.api.runs[run]
        spec = up.spec  # type: ignore[attr-defined]
        st = up.status  # type: ignore[attr-defined]
        cid = spec.cluster_id
        fleet = self.w.fleet
        since = 0
        for op_id in fleet.by_cluster.get(cid, ()):
            op = fleet.ops[op_id]
            if op.owner != run or op.attempt != st.attempt or op.abandoned:
                continue
            if op.kind in (OpKind.CONTROL_PLANE, OpKind.NODE_POOL, OpKind.SERVICE_OUT):
                if op.ended_at is None:
                    raise Violation(
                        "3 gate", f"{what}: its {op.kind.value} operation {op.id} is in flight"
                    )
                since = max(since, op.ended_at)
        checks = checks_for(obj.spec, spec.stage)
        if checks is None:
            return
        # Precondition: an evaluation no write ever recorded counts if the replica now servicing
        # in made it in this incarnation; one lost with a crashed or another replica's memory
        # (it died or was deposed before recording it) cannot be known, short of a write ahead
        # of every evaluation.
        me = self._replica
        epoch = next(r.incarnation for r in self.w.replicas if r.name == me)
        recorded = self.recorded.get((run, cid), set())
        evals = [
            e
            for e in self.evals.get((run, cid), [])
            if e.t >= since and (e.t in recorded or (e.replica == me and e.epoch == epoch))
        ]
        need = checks.success_threshold
        if len(evals) < need or not all(e.passed for e in evals[-need:]):
            raise Violation(
                "3 gate",
                f"{what}: service-in without {need} passing evaluation(s) in a row since its "
                f"upgrade ended at t={since} (evaluations since: "
                f"{[(e.t, e.passed) for e in evals[-5:]]})",
            )

    # -- after every step ----------------------------------------------------------------

    def after_step(self, label: str, world_changed: bool = False) -> None:
        """Invariants 1, 2 and 4 after one step. A reconcile changes no cluster (its calls
        take effect as operations advance), so the floor is re-counted after world steps,
        at every service-out's effect, and when a run is pinned."""
        w = self.w
        while self._decided_outs:
            run, key, replica, epoch = self._decided_outs.pop(0)
            up = w.api.upgrades[key].upgrade
            self._stage_order(
                run, up, f"service-out of {up.cluster_id} decided by {run}", (replica, epoch)
            )
        for run in self.members if world_changed else ():
            if self._live(run):
                self._floor(run, label)
        for cid, holders in w.api.active.items():
            if len(holders) > 1:
                raise Violation(
                    "2 one owner", f"after {label}: {cid} is held by {sorted(holders)} at once"
                )
        self._stranded(label, final=False)

    def bound(self, run: str, st: api.ClusterUpgradeStatus, stage: str) -> int:
        # A chain of node pools persisted in one intent (status.nextRequestIds) is bounded by
        # the step timeout once for each pool of it (docs/operations.md, step timeouts).
        steps = 1 + len(st.next_request_ids or ())
        key = (run, st.phase, stage)
        found = self._bounds.get(key)
        if found is None:
            found = self._bounds[key] = self._bound(run, st, stage)
        return found * steps if st.phase == U.UPGRADING_NODE_POOLS else found

    def _bound(self, run: str, st: api.ClusterUpgradeStatus, stage: str) -> int:
        obj = self.w.api.runs[run]
        t = obj.spec.timeouts or api.StepTimeouts()
        if st.phase == U.VERIFYING:
            checks = checks_for(obj.spec, stage)
            extra = 0
            if checks is not None:
                extra = int(
                    (
                        api.parse_duration(checks.timeout) + api.parse_duration(checks.interval)
                    ).total_seconds()
                )
            return int(api.parse_duration(t.ready).total_seconds()) + extra
        field = _STEP_KIND[st.phase]
        return int(api.parse_duration(getattr(t, field)).total_seconds())

    def _stranded(self, label: str, final: bool) -> None:
        """4. A cluster we took out is in a bounded active step, or Failed/Blocked with why."""
        w = self.w
        for cid in sorted(w.fleet.out_set):
            c = w.fleet.clusters[cid]
            if c.in_service or c.deleted or c.out_by in (None, ADVERSARY):
                continue
            run = c.out_by
            if (run, cid) in self.let_go:
                continue  # a deleted run let it go, named as kept out (run_deleted)
            key = self.up_key.get((run, cid))
            if key is None:
                raise Violation("4 never stranded", f"{cid} is out of service by {run}, unknown")
            if key not in w.api.upgrades:
                raise Violation(
                    "4 never stranded",
                    f"after {label}: {cid} is out of service by {run}, deleted without it back",
                )
            st = w.api.upgrades[key].upgrade.status
            ok_states = (U.FAILED,) if final else (U.FAILED, U.BLOCKED)
            if st.phase in ok_states and st.reason:
                continue
            if st.phase == U.SKIPPED and st.reason in SKIPPED_BY_PEOPLE:
                # Precondition: a person skipped a cluster that was out (Failed, or its stage);
                # what happens to it is theirs to decide.
                continue
            if st.phase == U.SKIPPED and st.reason == "ClusterGone":
                # Precondition: the world removed the cluster from the inventory while it was
                # out; its upgrade says so, and what happens if it returns is a person's call.
                continue
            if st.phase in ACTIVE and not final:
                start = seconds(st.step_start_time) if st.step_start_time else None
                if start is None:
                    raise Violation(
                        "4 never stranded",
                        f"after {label}: {cid} is out of service by {run} in {st.phase} "
                        "with no step start time (no bound)",
                    )
                limit = start + self.bound(run, st, w.api.upgrades[key].upgrade.spec.stage)
                if w.now <= limit + SLACK:
                    continue
                raise Violation(
                    "4 never stranded",
                    f"after {label}: {cid} is out of service by {run} in {st.phase} "
                    f"({st.step}) since t={start}; its bound ended at t={limit}",
                )
            raise Violation(
                "4 never stranded",
                f"after {label}: {cid} is out of service because of {run} but its "
                f"ClusterUpgrade is {st.phase} ({st.reason}: {st.message})",
            )

    # -- at the end ----------------------------------------------------------------------

    def final(self, settled: bool) -> None:
        """After the quiet phase: nothing of ours left out unless Failed; runs say why."""
        w = self.w
        self._stranded("the quiet phase", final=settled)
        adversary = w.adversary
        from tests.sim.adversary import DRIFT

        for run, obj in w.api.runs.items():
            says = obj.status.message or obj.status.phase == api.RunPhase.INVALID
            if obj.initialized and not says:
                raise Violation(
                    "4 never stranded", f"run {run} ends {obj.status.phase} saying nothing"
                )
            # Settled with nothing of it in flight, a Progressing run waits for the world or a
            # person: it must say why none starts (status.waitingReason), not only how many.
            idle = not any(o.upgrade.status.phase in ACTIVE for o in w.api.upgrades_of(run))
            progressing = obj.status.phase == api.RunPhase.PROGRESSING
            if settled and progressing and idle and not obj.status.waiting_reason:
                raise Violation(
                    "4 never stranded",
                    f"run {run} ends Progressing with nothing in flight and no waitingReason "
                    f"({obj.status.message})",
                )
            if obj.spec.state != api.RunState.RUN:
                continue
            for o in w.api.upgrades_of(run):
                st = o.upgrade.status
                cid = o.upgrade.cluster_id
                touched = adversary.touched.get(cid, set())
                drift = touched and touched <= DRIFT
                if st.phase == U.FAILED and drift and not self._provider_silent(cid, st):
                    raise Violation(
                        "7 drift is local",
                        f"{cid} in {run} ends Failed ({st.reason}: {st.message}) though only "
                        f"drift touched it ({sorted(touched)})",
                    )
            if w.cfg.profile == "drift" and settled:
                self._drift_liveness(run)

    def _drift_liveness(self, run: str) -> None:
        """7. Precondition: the floor leaves room (available - required >= 1) after the drift."""
        w = self.w
        obj = w.api.runs[run]
        members = self.members.get(run, [])
        up = sum(1 for c in members if self._cause(c) == "up")
        if up - obj.spec.required_available_count < 1:
            return
        if obj.status.phase != api.RunPhase.SUCCEEDED:
            raise Violation(
                "7 drift is local",
                f"run {run} ends {obj.status.phase} ({obj.status.message}) with only drift in "
                "the world and room in the floor",
            )


def short(evals: Sequence[Evaluation]) -> str:
    return ", ".join(f"{e.t}:{'ok' if e.passed else 'bad'}" for e in evals)
