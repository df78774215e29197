"""The adversary: every fault and every edit the world can throw at a run, drawn from the seed.

RPC errors (UNAVAILABLE, ABORTED, FAILED_PRECONDITION retryable or not, DEADLINE_EXCEEDED after
the plugin acted), operations that fail, hang or are forgotten, clusters going down and coming
back, out-of-band upgrades and operations, deletions, relabels, spec edits through the
ClusterVersion → UpdateRun rule, more runs over the same clusters, crashes between intent,
call and status write, lost and conflicting writes, leader changes (also in the middle of a
pass), people retrying failed clusters, and health checks that fail. It also keeps the record
of what it touched, so the invariants can tell its doing from the orchestrator's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator import api
from orchestrator.engine.decide import Call
from orchestrator.engine.observations import OpKind, OpState
from orchestrator.pipeline.driver import CallError
from plugins.sdk import versions
from tests.sim.model import ADVERSARY, Crash, MOp

if TYPE_CHECKING:
    from tests.sim.people import Person
    from tests.sim.world import Replica, World

#: Kinds of touch that are drift (invariant 7, docs/architecture.md): the run goes on around them.
DRIFT = frozenset({"oob-bump", "deleted", "relabel"})


@dataclass
class Rates:
    """Per-profile probabilities."""

    rpc: float = 0.0  # an RPC fails (before acting)
    lost_answer: float = 0.0  # a mutation acts, then its answer is lost
    crash_call: float = 0.0  # the process dies just before / after a mutation
    write: float = 0.0  # a ClusterUpgrade write conflicts, is lost, or the process dies
    op_fail: float = 0.0
    op_hang: float = 0.0
    action_every: tuple[int, int] = (60, 240)  # seconds between world actions
    deposed_pass: float = 0.0  # a reconcile runs on a replica that is not the leader
    actions: dict[str, int] = field(default_factory=dict)


DRIFT_ACTIONS = {"oob_bump": 3, "delete": 2, "relabel": 2, "restore": 1}
#: The drift profile also has a release channel that upgrades a control plane only (issue 19);
#: not in WORLD_ACTIONS, so the noisy and hostile seeds pinned in test_simulation's FOUND_GAPS
#: keep their histories.
DRIFT_PROFILE_ACTIONS = {**DRIFT_ACTIONS, "oob_cp": 2}
WORLD_ACTIONS = {
    "down": 3,
    "up": 3,
    "oob_op": 2,
    "oob_out": 1,
    "oob_in": 1,
    "forget": 2,
    "plugin_restart": 1,
    "delete_rollout": 1,
    "crash": 2,
    "lease": 2,
    "lease_mid": 2,
    "conflict": 2,
    "spec_version": 1,
    "spec_stage": 1,
    "spec_remove": 1,
    "spec_floor": 1,
    "run_stop": 1,
    "new_run": 1,
    "retry": 2,
    "health": 2,
    "skip": 1,
    "skip_stage": 1,
    "retry_round": 2,
    "run_resume": 1,
    **DRIFT_ACTIONS,
}
PROFILES = {
    "none": Rates(action_every=(10**9, 10**9)),
    "drift": Rates(actions=DRIFT_PROFILE_ACTIONS, action_every=(60, 300)),
    "calm": Rates(
        rpc=0.01,
        lost_answer=0.01,
        write=0.005,
        op_fail=0.01,
        op_hang=0.003,
        action_every=(120, 500),
        deposed_pass=0.02,
        actions=WORLD_ACTIONS,
    ),
    "noisy": Rates(
        rpc=0.05,
        lost_answer=0.03,
        crash_call=0.01,
        write=0.03,
        op_fail=0.03,
        op_hang=0.01,
        action_every=(30, 200),
        deposed_pass=0.05,
        actions=WORLD_ACTIONS,
    ),
    "hostile": Rates(
        rpc=0.15,
        lost_answer=0.08,
        crash_call=0.03,
        write=0.08,
        op_fail=0.06,
        op_hang=0.02,
        action_every=(10, 90),
        deposed_pass=0.1,
        actions=WORLD_ACTIONS,
    ),
}
#: A history over several providers (world.MEMBERS): one provider's plugin goes away for a
#: while (every RPC to it UNAVAILABLE), its clusters unknown to every run.
MULTI_ACTIONS = {"provider_down": 3}
RETRYABLE = (("UNAVAILABLE", True), ("ABORTED", True), ("FAILED_PRECONDITION", True))
FATAL = (("FAILED_PRECONDITION", False),)


class Adversary:
    """Seeded faults and edits; `quiet()` ends them (the world settles afterwards)."""

    def __init__(self, world: World, profile: str) -> None:
        self.world = world
        self.rng = random.Random(world.cfg.seed * 31 + 7)
        self.profile = profile
        self.rates = PROFILES[profile]
        #: The world actions drawn from; a history over several providers adds outages of a
        #: whole provider (its plugin unreachable for a while: MULTI_ACTIONS).
        self.actions = dict(self.rates.actions)
        if world.cfg.providers > 1 and self.actions:
            self.actions.update(MULTI_ACTIONS)
        self.active = True
        self.next_at: int | None = self._gap()
        #: cluster id → kinds of touch (drift or not) the adversary made.
        self.touched: dict[str, set[str]] = {}
        #: cluster id → (until, passes) health the adversary forces for a while.
        self.sick: dict[str, int] = {}
        self.never_stages: set[str] = set()
        self.never_clusters: set[str] = set()
        self.flaky: set[str] = set()
        self.forced_crash: str | None = None
        for c in world.fleet.clusters.values():
            if versions.parse(c.cp).minor < 28:
                self.touch(c.id, "refused")  # its target is refused: the provider's doing
        self._pick_health()

    # -- bookkeeping ---------------------------------------------------------------------

    def touch(self, cid: str, kind: str) -> None:
        self.touched.setdefault(cid, set()).add(kind)

    def _gap(self) -> int | None:
        lo, hi = self.rates.action_every
        if lo >= 10**9:
            return None
        return self.rng.randint(lo, hi)

    def next_action(self) -> int | None:
        return self.next_at if self.active else None

    def _pick_health(self) -> None:
        cfg = self.world.cfg
        if not cfg.health or self.profile in ("none", "drift"):
            return
        ids = sorted(self.world.fleet.clusters)
        rng = self.rng
        for cid in ids:
            r = rng.random()
            if r < 0.03:
                self.never_clusters.add(cid)
                self.touch(cid, "health")
            elif r < 0.15:
                self.flaky.add(cid)
                self.touch(cid, "health")
        if rng.random() < 0.08:
            self.never_stages.add(rng.choice(("canary", "early", "main")))

    # -- hooks called by the model -------------------------------------------------------

    def rpc(self, method: str, cid: str) -> None:
        """A read or preflight RPC: may fail before doing anything."""
        if self.active and self.rng.random() < self.rates.rpc:
            code, retryable = self.rng.choice(RETRYABLE + FATAL)
            if cid:
                self.touch(cid, "rpc")
            raise CallError(code, f"{method}: injected {code}", retryable)

    def before_call(self, call: Call) -> None:
        if not self.active:
            return
        r = self.rng.random()
        if r < self.rates.crash_call / 2:
            raise Crash(f"crash before {call.kind.value} {call.cluster_id}")
        if r < self.rates.crash_call / 2 + self.rates.rpc:
            code, retryable = self.rng.choice(RETRYABLE + FATAL)
            self.touch(call.cluster_id, "rpc")
            raise CallError(code, f"injected {code} before acting", retryable)

    def after_call(self, call: Call, op: MOp) -> None:
        if not self.active:
            return
        r = self.rng.random()
        if r < self.rates.crash_call / 2:
            raise Crash(f"crash after {call.kind.value} {call.cluster_id} (plugin acted)")
        if r < self.rates.crash_call / 2 + self.rates.lost_answer:
            self.touch(call.cluster_id, "rpc")
            raise CallError("UNAVAILABLE", "the answer was lost (the plugin acted)", True)

    def write_fault(self, key: str) -> str | None:
        if not self.active or self.rng.random() >= self.rates.write:
            return None
        return self.rng.choice(
            ("conflict", "conflict", "lost-before", "lost-after", "crash-before", "crash-after")
        )

    def run_write_fault(self, key: str) -> None:
        """A run status write that conflicts (another writer bumped the run)."""
        if self.active and self.rng.random() < self.rates.write:
            self.world.api.update_run(key)

    def fate(self, op: MOp) -> tuple[int | None, tuple[str, str] | None]:
        rng = self.rng
        lo, hi = {
            OpKind.SERVICE_OUT: (2, 15),
            OpKind.SERVICE_IN: (2, 15),
            OpKind.CONTROL_PLANE: (30, 240),
            OpKind.NODE_POOL: (20, 180),
        }[op.kind]
        duration = rng.randint(lo, hi)
        if not self.active or op.owner == ADVERSARY:
            return duration, None
        r = rng.random()
        if r < self.rates.op_hang:
            self.touch(op.cluster_id, "hang")
            return None, None
        if r < self.rates.op_hang + self.rates.op_fail:
            self.touch(op.cluster_id, "op-fail")
            return duration, ("INTERNAL", f"{op.kind.value} failed (injected)")
        return duration, None

    def check_passes(self, run: str, stage: str, ids: tuple[str, ...], check: str) -> bool:
        ok = self._passes(stage, ids)
        if not ok:
            for cid in ids:
                self.touch(cid, "health")
        return ok

    def _passes(self, stage: str, ids: tuple[str, ...]) -> bool:
        if stage in self.never_stages:
            return False
        for cid in ids:
            if cid in self.never_clusters:
                return False
            if self.sick.get(cid, -1) >= self.world.now:
                return False
            if cid in self.flaky and self.active and self.rng.random() < 0.3:
                return False
        return True

    def pick_replica(self) -> Replica:
        reps = self.world.replicas
        leader = next((r for r in reps if r.name == self.world.lease.holder), reps[0])
        if len(reps) > 1 and self.rng.random() < self.rates.deposed_pass:
            return self.rng.choice([r for r in reps if r is not leader])
        return leader

    # -- world actions -------------------------------------------------------------------

    def quiet(self) -> None:
        """No new faults; outages end; the Lease settles. Hung operations stay hung."""
        self.active = False
        w = self.world
        for c in w.fleet.clusters.values():
            if c.adv_down:
                c.adv_down = False
                c.down_reason = ""
        self.sick.clear()
        w.outages.clear()
        w.lease.quiet()

    def act(self) -> bool:
        """Whatever actions are due now; True if any was taken."""
        w = self.world
        acted = False
        while self.next_at is not None and self.next_at <= w.now:
            acted = True
            gap = self._gap()
            self.next_at = None if gap is None else w.now + gap
            actions = self.actions
            if not actions:
                return acted
            names = sorted(actions)
            name = self.rng.choices(names, [actions[n] for n in names])[0]
            getattr(self, f"_do_{name}")()
        return acted

    def _cluster(self, pred: object = None) -> str | None:
        ids = [
            c.id
            for c in self.world.fleet.clusters.values()
            if not c.deleted and (pred is None or pred(c))  # type: ignore[operator]
        ]
        return self.rng.choice(sorted(ids)) if ids else None

    def _do_down(self) -> None:
        cid = self._cluster(lambda c: not c.adv_down)
        if cid:
            c = self.world.fleet.clusters[cid]
            c.adv_down, c.down_reason = True, "node not ready (injected)"
            self.touch(cid, "down")
            self.world.log(f"adversary: {cid} unavailable")

    def _do_provider_down(self) -> None:
        """A whole provider unreachable for 20 s to 10 min (its plugin, its cloud's API)."""
        w = self.world
        up = sorted(n for n in set(w.member_of.values()) if w.outages.get(n, -1) <= w.now)
        if not up:
            return
        name = self.rng.choice(up)
        w.outages[name] = w.now + self.rng.randint(20, 600)
        for cid, member in w.member_of.items():
            if member == name:
                self.touch(cid, "provider-down")
        w.log(f"adversary: provider {name} unreachable until t={w.outages[name]}")

    def _do_up(self) -> None:
        cid = self._cluster(lambda c: c.adv_down)
        if cid:
            self.world.fleet.clusters[cid].adv_down = False
            self.world.log(f"adversary: {cid} available again")

    def _do_oob_bump(self) -> None:
        """Someone upgrades a cluster past any target (a release channel) with no operation."""
        cid = self._cluster(lambda c: c.op is None)
        if cid:
            c = self.world.fleet.clusters[cid]
            c.cp = "1.30.1"
            for p in c.pools.values():
                p.version = "1.30.1"
            c.touch()
            self.touch(cid, "oob-bump")
            self.world.log(f"adversary: {cid} upgraded out of band to 1.30.1")

    def _do_oob_cp(self) -> None:
        """A release channel upgrades a cluster's control plane past any target, no operation;
        its node pools stay behind (only they are left for a run to upgrade)."""
        cid = self._cluster(lambda c: c.op is None and versions.is_newer("1.30.1", c.cp))
        if cid:
            c = self.world.fleet.clusters[cid]
            c.cp = "1.30.1"
            c.touch()
            self.touch(cid, "oob-bump")
            self.world.log(f"adversary: {cid} control plane upgraded out of band to 1.30.1")

    def _do_oob_op(self) -> None:
        """Someone else's operation in flight (an auto-upgrade, a person draining)."""
        w = self.world
        cid = self._cluster(lambda c: c.op is None)
        if not cid:
            return
        c = w.fleet.clusters[cid]
        if self.rng.random() < 0.5:
            w.fleet.foreign_op(cid, OpKind.CONTROL_PLANE, "1.30.1", "", self.rng.randint(20, 200))
            self.touch(cid, "oob-bump")
            self.touch(cid, "foreign-op")
            what = "control-plane upgrade to 1.30.1"
        else:
            kind = OpKind.SERVICE_OUT if c.in_service else OpKind.SERVICE_IN
            w.fleet.foreign_op(cid, kind, "", "", self.rng.randint(5, 60))
            self.touch(cid, "foreign-op")
            what = kind.value
        w.log(f"adversary: foreign {what} on {cid}")

    def _do_oob_out(self) -> None:
        cid = self._cluster(lambda c: c.in_service and c.op is None)
        if cid:
            c = self.world.fleet.clusters[cid]
            c.in_service, c.out_by = False, ADVERSARY
            self.world.fleet.out_set.add(cid)
            self.touch(cid, "oob-out")
            self.world.log(f"adversary: {cid} taken out of service by a person")

    def _do_oob_in(self) -> None:
        cid = self._cluster(lambda c: not c.in_service and c.op is None)
        if cid:
            c = self.world.fleet.clusters[cid]
            c.in_service, c.out_by, c.adv_in_at = True, None, self.world.now
            self.world.fleet.out_set.discard(cid)
            self.touch(cid, "oob-in")
            self.world.log(f"adversary: {cid} put back in service by a person")

    def _do_delete(self) -> None:
        cid = self._cluster()
        if cid:
            self.world.fleet.clusters[cid].deleted = True
            self.touch(cid, "deleted")
            self.world.log(f"adversary: {cid} deleted from the inventory")

    def _do_restore(self) -> None:
        gone = sorted(c.id for c in self.world.fleet.clusters.values() if c.deleted)
        if gone:
            cid = self.rng.choice(gone)
            self.world.fleet.clusters[cid].deleted = False
            self.world.log(f"adversary: {cid} back in the inventory")

    def _do_relabel(self) -> None:
        cid = self._cluster()
        if cid:
            c = self.world.fleet.clusters[cid]
            c.labels = {**c.labels, "ring": self.rng.choice(("canary", "early", "main"))}
            self.touch(cid, "relabel")
            self.world.log(f"adversary: {cid} relabelled ring={c.labels['ring']}")

    def _do_forget(self) -> None:
        fleet = self.world.fleet
        ours = sorted(
            (op.id for op in fleet.ops.values() if op.owner != ADVERSARY and not op.forgotten),
            key=lambda i: int(i.split("-")[1]),
        )
        if ours:
            op = fleet.ops[self.rng.choice(ours[-20:])]
            fleet.forget(op.id)
            self.touch(op.cluster_id, "forgotten")
            self.world.log(f"adversary: plugin forgot {op.id} ({op.kind.value} {op.cluster_id})")

    def _do_plugin_restart(self) -> None:
        """The plugin restarts without durable state: it forgets every operation at once (work
        in flight dies with it), and every replica's WatchOperations stream breaks."""
        fleet = self.world.fleet
        lost = sorted(
            (op for op in fleet.ops.values() if op.owner != ADVERSARY and not op.forgotten),
            key=lambda o: int(o.id.split("-")[1]),
        )
        for op in lost:
            fleet.forget(op.id)
            self.touch(op.cluster_id, "forgotten")
        for rep in self.world.replicas:
            rep.provider.following = False
        self.world.log(f"adversary: plugin restarted, forgetting {len(lost)} operations")

    def _do_delete_rollout(self) -> None:
        """A person deletes a rollout mid-flight: a ClusterVersion (its runs follow) or a
        directly applied UpdateRun. Its finalizers hold it until its clusters are back."""
        w = self.world
        cvs = sorted(k for k, cv in w.api.cvs.items() if not cv.deleting)
        direct = sorted(
            k for k, r in w.api.runs.items() if not r.cv and r.initialized and not r.deleting
        )
        choices = [("cv", k) for k in cvs] + [("run", k) for k in direct]
        if not choices:
            return
        kind, key = self.rng.choice(choices)
        if kind == "cv":
            w.api.cvs[key].deleting = True
            w.log(f"adversary: kubectl delete clusterversion {key}")
        else:
            w.api.runs[key].deleting = True
            w.api.changed(key)
            w.due[key] = w.now
            w.log(f"adversary: kubectl delete updaterun {key}")

    def _do_crash(self) -> None:
        rep = self.rng.choice(self.world.replicas)
        rep.crash()
        self.world.log(f"adversary: {rep.name} restarted")

    def _lease_victim(self) -> str:
        """Mostly the holder (its silence moves the Lease), sometimes a standby."""
        lease = self.world.lease
        if self.rng.random() < 0.75 and lease.holder:
            return lease.holder
        return self.rng.choice([r.name for r in self.world.replicas])

    def _do_lease(self) -> None:
        """A replica's Lease requests fail for a while (a partition): it stops renewing, and
        the Lease moves once another replica has seen it unchanged for its whole duration."""
        name, seconds = self._lease_victim(), self.rng.randint(3, 45)
        self.world.lease.cut_off(name, seconds)
        self.world.log(f"adversary: {name} cut off from the Lease for {seconds} s")

    def _do_lease_mid(self) -> None:
        """A replica's process stalls in the middle of its next pass (a long GC pause, a slow
        call): the other replicas go on, and may take the Lease, meanwhile."""
        name, checks, seconds = (
            self._lease_victim(),
            self.rng.randint(0, 6),
            self.rng.randint(2, 30),
        )
        self.world.lease.arm_stall(name, checks, seconds)
        self.world.log(f"adversary: {name} stalls for {seconds} s after {checks} fence checks")

    def _do_conflict(self) -> None:
        w = self.world
        if w.api.upgrades:
            keys = sorted(w.api.upgrades)
            for key in self.rng.sample(keys, min(3, len(keys))):
                w.api.upgrades[key].rv = w.api.bump()

    def _cv(self) -> tuple[str, object] | None:
        cvs = sorted(k for k, cv in self.world.api.cvs.items() if not cv.deleting)
        if not cvs:
            return None
        key = self.rng.choice(cvs)
        return key, self.world.api.cvs[key]

    def _edit_cv(self, key: str, what: str, spec: api.ClusterVersionSpec) -> None:
        """A person writes `spec`, made from ClusterVersion `key`'s own, back to `key`. (It
        wrote it to a ClusterVersion drawn again, so with two or more one's spec, skip and
        requestedBy included, landed on another: seed 72370. The draw is still made, so that
        the histories of worlds with one ClusterVersion stay what they were.)"""
        self._cv()
        person = self.world.people.pick()
        self.world.write_cv(key, person, spec)
        self.world.log(f"adversary: {person.name} edits {key}: {what}")

    def _do_spec_version(self) -> None:
        found = self._cv()
        if found is None:
            return
        key, cv = found
        spec: api.ClusterVersionSpec = cv.spec  # type: ignore[attr-defined]
        new = self.rng.choice(("1.29.3", "1.29.5", "1.30.1"))
        clusters = [c.model_copy(update={"version": new}) for c in spec.clusters or []]
        body: dict[str, object] = {"clusters": clusters or None}
        if spec.version:
            body["version"] = new
        for c in self.world.fleet.clusters.values():
            if self.world.fleet.refusal(c.id, new, {}) is not None:
                self.touch(c.id, "refused")  # the new target is refused there: not drift
        self._edit_cv(key, f"version → {new}", spec.model_copy(update=body))

    def _do_spec_stage(self) -> None:
        found = self._cv()
        if found is None:
            return
        key, cv = found
        spec: api.ClusterVersionSpec = cv.spec  # type: ignore[attr-defined]
        stages = list((spec.strategy.stages if spec.strategy else None) or [])
        if not stages or spec.strategy is None:
            return
        i = self.rng.randrange(len(stages))
        if self.rng.random() < 0.5 or len(stages) == 1:
            stages[i] = stages[i].model_copy(update={"name": f"{stages[i].name}-x"})
            what = f"rename stage {i}"
        else:
            removed = stages.pop(i)
            what = f"remove stage {removed.name}"
            clusters = spec.clusters
            if clusters and removed.clusters:
                gone = set(removed.clusters)
                clusters = [c for c in clusters if c.id not in gone] or None
                spec = spec.model_copy(update={"clusters": clusters})
        strategy = spec.strategy.model_copy(update={"stages": stages})  # type: ignore[union-attr]
        self._edit_cv(key, what, spec.model_copy(update={"strategy": strategy}))

    def _do_spec_remove(self) -> None:
        found = self._cv()
        if found is None:
            return
        key, cv = found
        spec: api.ClusterVersionSpec = cv.spec  # type: ignore[attr-defined]
        if not spec.clusters or len(spec.clusters) < 3:
            return
        gone = self.rng.choice(spec.clusters).id
        clusters = [c for c in spec.clusters if c.id != gone]
        strategy = spec.strategy
        if strategy and strategy.stages:
            stages = [
                s.model_copy(update={"clusters": [c for c in s.clusters if c != gone] or None})
                if s.clusters
                else s
                for s in strategy.stages
            ]
            stages = [s for s in stages if s.clusters or s.selector]
            strategy = strategy.model_copy(update={"stages": stages or None})
        required = min(spec.required_available_count, max(1, len(clusters) - 1))
        self._edit_cv(
            key,
            f"remove cluster {gone}",
            spec.model_copy(
                update={
                    "clusters": clusters,
                    "strategy": strategy,
                    "required_available_count": required,
                }
            ),
        )

    def _do_spec_floor(self) -> None:
        found = self._cv()
        if found is None:
            run = self._direct_run()
            if run is None:
                return
            spec = self.world.api.runs[run].spec
            n = len(self.world.api.by_run.get(run, ())) or 2
            floor = self.rng.randint(1, max(1, n - 1))
            self.world.write_run(
                run,
                self.world.people.pick(),
                spec=spec.model_copy(update={"required_available_count": floor}),
            )
            self.world.monitor.floor_changed(run)
            self.world.log(f"adversary: floor of {run} → {floor}")
            return
        key, cv = found
        spec = cv.spec  # type: ignore[attr-defined]
        n = len(spec.clusters or []) or 4
        floor = self.rng.randint(1, max(1, n - 1))
        self._edit_cv(
            key, f"floor → {floor}", spec.model_copy(update={"required_available_count": floor})
        )

    def _direct_run(self) -> str | None:
        runs = sorted(
            k
            for k, r in self.world.api.runs.items()
            if not r.cv and r.spec.state == api.RunState.RUN
        )
        return self.rng.choice(runs) if runs else None

    def _do_run_stop(self) -> None:
        key = self._direct_run()
        if key:
            run = self.world.api.runs[key]
            self.world.write_run(
                key,
                self.world.people.pick(),
                spec=run.spec.model_copy(update={"state": api.RunState.STOP}),
            )
            self.world.due[key] = self.world.now
            self.world.log(f"adversary: a person stops {key}")

    def _do_new_run(self) -> None:
        w = self.world
        if len(w.owners) < 4:
            w.add_owner(len(w.owners), kind="run")

    def _do_retry(self) -> None:
        w = self.world
        failed = sorted(
            (o.run, o.upgrade.cluster_id)
            for o in w.api.upgrades.values()
            if o.upgrade.status.phase in (api.UpgradePhase.FAILED, api.UpgradePhase.BLOCKED)
        )
        if failed:
            run, cid = self.rng.choice(failed)
            obj = w.api.runs[run]
            w.write_run(run, w.people.pick(), retry=obj.retry | {cid})
            w.due[run] = w.now
            w.log(f"adversary: a person retries {cid} in {run}")

    def _do_health(self) -> None:
        cid = self._cluster()
        if cid:
            self.sick[cid] = self.world.now + self.rng.randint(30, 400)
            self.touch(cid, "health")
            self.world.log(f"adversary: {cid} unhealthy until t={self.sick[cid]}")

    # -- people operating a rollout (issue 12) -------------------------------------------

    def _live_runs(self) -> list[str]:
        return sorted(k for k, r in self.world.api.runs.items() if r.initialized)

    def _people_spec(
        self,
        run: str,
        skip: api.SkipSpec | None,
        retry: api.RetrySpec | None,
        what: str,
        person: Person,
    ) -> None:
        """spec.skip / spec.retry through the run's ClusterVersion (a live field: the same
        run gets it in place) or, for a direct run, on the run itself."""
        w = self.world
        obj = w.api.runs[run]
        cv = w.api.cvs.get(obj.cv) if obj.cv else None
        if cv is not None:
            w.write_cv(cv.key, person, cv.spec.model_copy(update={"skip": skip, "retry": retry}))
            w.log(f"adversary: {person.name} edits {cv.key}: {what}")
        else:
            spec = obj.spec.model_copy(update={"skip": skip, "retry": retry})
            w.write_run(run, person, spec=spec)
            w.log(f"adversary: {person.name} edits {run}: {what}")
        w.due[run] = w.now

    def _spec_of(self, run: str) -> tuple[api.SkipSpec, api.RetrySpec | None]:
        w = self.world
        obj = w.api.runs[run]
        cv = w.api.cvs.get(obj.cv) if obj.cv else None
        spec = cv.spec if cv is not None else obj.spec
        return spec.skip or api.SkipSpec(), spec.retry

    def _do_skip(self) -> None:
        """A person skips a cluster: the annotation (acted on once) or spec.skip.clusters."""
        w = self.world
        runs = self._live_runs()
        if not runs:
            return
        run = self.rng.choice(runs)
        cids = sorted(o.upgrade.cluster_id for o in w.api.upgrades_of(run))
        if not cids:
            return
        cid = self.rng.choice(cids)
        self.touch(cid, "skip")
        person = w.people.pick()
        if self.rng.random() < 0.5:
            w.write_run(run, person, skip=w.api.runs[run].skip | {cid})
            w.due[run] = w.now
            w.log(f"adversary: a person skips {cid} in {run} (annotation)")
            return
        skip, retry = self._spec_of(run)
        clusters = sorted({*(skip.clusters or ()), cid})
        if retry is not None and cid in retry.clusters:  # one or the other (validation)
            rest = [c for c in retry.clusters if c != cid]
            retry = retry.model_copy(update={"clusters": rest}) if rest else None
        skip = skip.model_copy(
            update={"clusters": clusters, "reason": "simulated", "requested_by": person.typed}
        )
        self._people_spec(run, skip, retry, f"skip.clusters += {cid}", person)

    def _do_skip_stage(self) -> None:
        """A person skips a stage: spec.skip.stages or the skip-stages annotation (level)."""
        w = self.world
        runs = [r for r in self._live_runs() if w.api.runs[r].stage_names]
        if not runs:
            return
        run = self.rng.choice(runs)
        name = self.rng.choice(w.api.runs[run].stage_names)
        person = w.people.pick()
        if self.rng.random() < 0.5:
            w.write_run(run, person, skip_stages=w.api.runs[run].skip_stages | {name})
            w.due[run] = w.now
            w.log(f"adversary: a person skips stage {name} of {run} (annotation)")
            return
        skip, retry = self._spec_of(run)
        stages = sorted({*(skip.stages or ()), name})
        self._people_spec(
            run,
            skip.model_copy(update={"stages": stages}),
            retry,
            f"skip.stages += {name}",
            person,
        )

    def _do_retry_round(self) -> None:
        """spec.retry: a new round for some Failed/Blocked/skipped clusters, or the same
        round applied again (a GitOps re-sync must not retry twice)."""
        w = self.world
        up = api.UpgradePhase
        runs = self._live_runs()
        if not runs:
            return
        run = self.rng.choice(runs)
        cands = sorted(
            o.upgrade.cluster_id
            for o in w.api.upgrades_of(run)
            if o.upgrade.status.phase in (up.FAILED, up.BLOCKED, up.SKIPPED)
        )
        skip, retry = self._spec_of(run)
        person = w.people.pick()
        if retry is not None and self.rng.random() < 0.3:
            again = f"retry round {retry.round} again"
            self._people_spec(run, skip, retry.model_copy(), again, person)
            return
        if not cands:
            return
        picked = sorted(self.rng.sample(cands, min(len(cands), self.rng.randint(1, 3))))
        for cid in picked:
            self.touch(cid, "retry")
        rnd = (retry.round if retry is not None else 0) + 1
        left = [c for c in (skip.clusters or ()) if c not in picked]
        skip = skip.model_copy(update={"clusters": left or None})
        new = api.RetrySpec(clusters=picked, round=rnd, requested_by=person.typed)
        self._people_spec(run, skip, new, f"retry round {rnd}: {picked}", person)

    def _do_run_resume(self) -> None:
        """A person resumes a direct run they stopped."""
        w = self.world
        runs = sorted(
            k for k, r in w.api.runs.items() if not r.cv and r.spec.state == api.RunState.STOP
        )
        if runs:
            key = self.rng.choice(runs)
            run = w.api.runs[key]
            spec = run.spec.model_copy(update={"state": api.RunState.RUN})
            w.write_run(key, w.people.pick(), spec=spec)
            w.due[key] = w.now
            w.log(f"adversary: a person resumes {key}")


def op_in_flight(op: MOp) -> bool:
    return op.state in (OpState.PENDING, OpState.RUNNING)
