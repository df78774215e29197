"""What a run's passes keep between them, so that a pass costs what changed (issue 21).

`RunIndex` holds, for one run, its ClusterUpgrades as last seen, in the engine's order (stage,
then cluster id), grouped by phase, with per-stage phase counts: what `decide` and the driver
used to count by walking every ClusterUpgrade of the run on every pass. `observe` brings it up
to date from the pass's input by looking only at what changed: what its callers say changed
when they say it (a hint of ClusterUpgrade names; a snapshot's `Changes`), else every object
that is not the very object seen last time (`told` says which the index rests on: `decide`
compares every object before any floor lets a cluster go on the callers' word);
`RunIndex.build` makes one from scratch (the full pass). Both must agree: the driver
rebuilds every `FULL_EVERY` passes and compares (`differences`), replacing the index and
logging what differed; tests/engine/test_index.py asserts they agree, and that decisions
taken with either are the same, after every step of simulated histories.

It also keeps two memos of outcomes, each with exactly what it was decided from, which `decide`
uses only while all of that is equal (then the outcome could not differ):
- `waiting`: ClusterUpgrades whose last offer waited for the availability budget (status, the
  cluster's observation, its holder); skipped only while the run's own floor, counted afresh
  in this pass, has no room at all. No floor or budget check is skipped on a count of its own.
- `quiet`: clusters in flight whose last follow only waited for their operation (status,
  observation, operation, the step timeouts, the step's deadline); skipped until the deadline.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import compress
from operator import is_not
from typing import TYPE_CHECKING, NamedTuple

from orchestrator import api
from orchestrator.engine.observations import Changes, ClusterObs, OpObs

if TYPE_CHECKING:
    from orchestrator.engine.decide import Upgrade

__all__ = [
    "ACTIVE",
    "FULL_EVERY",
    "KEEPING",
    "RETRY_WAITS",
    "Phases",
    "Quiet",
    "RunIndex",
    "Waiting",
    "holds_cluster",
    "keeps_cluster",
    "lingers",
    "same",
    "up_by_observation",
]

#: The driver's full pass: every this many passes, the index is rebuilt and compared.
FULL_EVERY = 50
#: ... and, while the index rests on what callers said changed (`RunIndex.told`), at least
#: this often by the run's clock: a change a caller failed to say (a bug: a watch event
#: dropped) then holds a run back for seconds, not for FULL_EVERY passes (which can outlast a
#: step's timeout: simulation seeds with a forgetful watch, cfg.told "forgetful").
FULL_SECONDS = 30.0

_U = api.UpgradePhase
#: Phases in which a cluster is held by its run (out of service or about to be).
ACTIVE = frozenset(
    {
        _U.SERVICING_OUT,
        _U.UPGRADING_CONTROL_PLANE,
        _U.UPGRADING_NODE_POOLS,
        _U.VERIFYING,
        _U.SERVICING_IN,
        _U.PRE_HOOK,
        _U.POST_HOOK,
    }
)
#: Ended or not started, yet possibly keeping its cluster out of service (`keeps_cluster`).
KEEPING = frozenset({_U.FAILED, _U.SKIPPED, _U.BLOCKED})


def keeps_cluster(phase: str | None, step: str | None) -> bool:
    """An attempt that ended (or is Blocked) with its `step` kept: what that step did may
    still keep the cluster out of service (its service-out took it out, or may yet), so it is
    this run's to carry on, bring back or let go (`decide._released` clears the step once the
    cluster is seen in service with no operation of the run on it). Until then the cluster is
    the run's as much as an ACTIVE one is, for every other run (`holds_cluster`)."""
    return bool(step) and phase in KEEPING


#: Between a waiting retry's words and what it waits for, in the message of an ended attempt
#: a person retried while it held a cluster not at rest (decide._retry); its phase and reason
#: stay (no ": ", so who asked still reads as the words' own).
RETRY_WAITS = "; waits until "


def lingers(st: api.ClusterUpgradeStatus) -> bool:
    """An ended (or Blocked) attempt that keeps its cluster (`keeps_cluster`) or whose retry
    waits for it to be at rest: the ones a pass looks at again though nothing of theirs
    changed (decide._released, decide._retry_at_rest), kept apart (`Phases.lingering`) so
    that a pass does not walk every Failed, Skipped and Blocked cluster of the run."""
    return st.phase in KEEPING and (bool(st.step) or RETRY_WAITS in (st.message or ""))


def holds_cluster(phase: str | None, step: str | None, owned: bool = True) -> bool:
    """Invariant 2's one owner, across runs: a ClusterUpgrade holds its cluster while it is
    in an ACTIVE phase or keeps it (`keeps_cluster`). Another run never takes a cluster so
    held out of service, and never adopts it as its own (simulation seed 104873: a retry
    adopted, and serviced back in, a cluster another run's failed attempt kept out, because
    that attempt held nothing once ended). An orphan (owned False: its run deleted with
    --cascade=orphan) holds only while ACTIVE: no run is left to release what it keeps."""
    return phase in ACTIVE or (owned and keeps_cluster(phase, step))


@dataclass
class Phases:
    """ClusterUpgrade names by phase, with per-stage phase counts, the Blocked-Refused ones
    (counted against failure budgets) and the cluster ids the run holds (in an ACTIVE phase);
    `move` is the one place they change, and `journal`, while kept, records every move so that
    a decision's moves can be undone (`undo`) instead of copying every set per pass."""

    by_phase: dict[api.UpgradePhase, set[str]] = field(
        default_factory=lambda: {p: set() for p in api.UpgradePhase}
    )
    per_stage: Counter[tuple[int, api.UpgradePhase]] = field(default_factory=Counter)
    refused: set[str] = field(default_factory=set)
    #: The Pending ones by reason (what they wait for; those with none are not kept apart:
    #: no one asks for them, and at 10,000 clusters they are most of the run).
    pending: dict[str, set[str]] = field(default_factory=dict)
    #: The cluster ids of those in an ACTIVE phase (held by the run: down for every floor),
    #: and their names.
    held: set[str] = field(default_factory=set)
    active: set[str] = field(default_factory=set)
    #: The names of those that linger (`lingers`).
    lingering: set[str] = field(default_factory=set)
    #: At least the names in `active` with no `quiet` memo (`RunIndex.loud`, which narrows it
    #: to exactly those): a name is added when it enters `active` and when its memo is
    #: dropped, so that finding who to follow costs what changed, not what is in flight.
    stirred: set[str] = field(default_factory=set, compare=False, repr=False)
    #: The clusters up by their observation (the index's `RunIndex.up`, shared), and how many
    #: of `held` are among them: kept as either changes, so that the floor's room costs
    #: O(1) a pass (`decide._Run.room`).
    up: set[str] = field(default_factory=set, compare=False, repr=False)
    held_up: int = 0
    #: The moves made since `journal` was set to a list (None: not recorded).
    journal: list[tuple[Upgrade, api.ClusterUpgradeStatus, api.ClusterUpgradeStatus]] | None = (
        field(default=None, compare=False)
    )

    def move(
        self,
        u: Upgrade,
        old: api.ClusterUpgradeStatus | None,
        new: api.ClusterUpgradeStatus | None,
    ) -> None:
        """Account one ClusterUpgrade's status change (None: absent)."""
        if old is not None and new is not None:
            if (
                old.phase == new.phase
                and old.reason == new.reason
                and (old.phase not in KEEPING or lingers(old) == lingers(new))
            ):
                return  # nothing accounted here changes
            if self.journal is not None:
                self.journal.append((u, old, new))
            was, now = old.phase, new.phase
            if was in ACTIVE and now in ACTIVE:
                # A step after a step (most moves of a rollout): the cluster stays held and
                # active; only its phase's set and count change.
                name, stage, per_stage = u.name, u.spec.stage_index, self.per_stage
                self.by_phase[was].discard(name)
                self.by_phase[now].add(name)
                per_stage[(stage, was)] -= 1
                per_stage[(stage, now)] += 1
                return
        name, stage, per_stage = u.name, u.spec.stage_index, self.per_stage
        if old is not None:
            was = old.phase
            self.by_phase[was].discard(name)
            per_stage[(stage, was)] -= 1
            self.refused.discard(name)
            self.lingering.discard(name)
            if was == _U.PENDING and old.reason is not None:
                self.pending.get(old.reason, set()).discard(name)
            elif was in ACTIVE:
                cid = u.cluster_id
                if cid in self.held:
                    self.held.discard(cid)
                    self.held_up -= cid in self.up
                self.active.discard(name)
        if new is not None:
            now = new.phase
            self.by_phase[now].add(name)
            per_stage[(stage, now)] += 1
            if now in KEEPING and lingers(new):
                self.lingering.add(name)
            if now == _U.BLOCKED and new.reason == "Refused":
                self.refused.add(name)
            elif now == _U.PENDING and new.reason is not None:
                self.pending.setdefault(new.reason, set()).add(name)
            elif now in ACTIVE:
                cid = u.cluster_id
                if cid not in self.held:
                    self.held.add(cid)
                    self.held_up += cid in self.up
                self.active.add(name)
                self.stirred.add(name)

    def undo(self) -> None:
        """Undo the moves recorded since `journal` was set, last first, and stop recording:
        the accounts are as they were (a decision's working changes, given back)."""
        journal, self.journal = self.journal or [], None
        for u, old, new in reversed(journal):
            self.move(u, new, old)

    def waiting_for(self, *reasons: str) -> set[str]:
        """The Pending ones waiting with any of these reasons (a new set)."""
        out: set[str] = set()
        for r in reasons:
            out |= self.pending.get(r, set())
        return out

    def names(self, *phases: api.UpgradePhase) -> set[str]:
        """The names in any of these phases (a new set)."""
        out: set[str] = set()
        for p in phases:
            out |= self.by_phase[p]
        return out

    def count(self, *phases: api.UpgradePhase) -> int:
        """How many are in these phases."""
        return sum(len(self.by_phase[p]) for p in phases)

    def comparable(self) -> tuple[object, ...]:
        """What must agree between two accounts of the same statuses."""
        return (
            {p: s for p, s in self.by_phase.items() if s},
            +self.per_stage,
            self.refused,
            {r: s for r, s in self.pending.items() if s},
            self.held,
            self.active,
        )


def up_by_observation(obs: ClusterObs | None, uid: str) -> bool:
    """Invariant 1's rule of what counts as up, as far as the cluster's observation goes: in
    the inventory, available, in service, and no other caller's operation in flight on it (an
    operation of this run, by its request ids: "<uid>:..."). Holdings by a run count apart."""
    if obs is None or not obs.available or not obs.in_service:
        return False
    cur = obs.current_operation
    return cur is None or cur.state.terminal or cur.request_id.startswith(f"{uid}:")


def same(a: object, b: object) -> bool:
    """Equal: the very object (what an unchanged input is), or one equal to it (what a re-read
    of an unchanged object is)."""
    return a is b or a == b


class Waiting(NamedTuple):
    """An admission memo: a ClusterUpgrade waited for the availability budget when offered
    with this status, the cluster's observation and its holder (another run, or None)."""

    status: api.ClusterUpgradeStatus
    obs: ClusterObs
    holder: str | None


class Quiet(NamedTuple):
    """A memo of following a cluster in flight: on this status, observation, operation and
    the run's step timeouts, nothing but its deadline (None: none) could move it."""

    status: api.ClusterUpgradeStatus
    obs: ClusterObs
    op: OpObs
    timeouts: api.StepTimeouts
    deadline: datetime | None
    #: The request id of the step followed: the status's, or a chained node pool's
    #: (decide.chain_of).
    rid: str = ""


@dataclass
class RunIndex:
    """One run's ClusterUpgrades kept between passes (see the module's docstring)."""

    uid: str = ""
    #: The upgrades as last seen, by name.
    seen: dict[str, Upgrade] = field(default_factory=dict)
    #: The input's order (the order of the caller's mapping, which `decide` walks in): its
    #: names, and name → rank.
    names: list[str] = field(default_factory=list)
    in_rank: dict[str, int] = field(default_factory=dict)
    #: The engine's order (stage index, cluster id): name → rank; and members by stage index,
    #: the very objects of `seen` (`_keep`: no older copy outlives a status change, issue 21's
    #: memory), each stage's members a run of ranks starting at `stage_start`.
    rank: dict[str, int] = field(default_factory=dict)
    by_stage: dict[int, list[Upgrade]] = field(default_factory=dict)
    stage_start: dict[int, int] = field(default_factory=dict)
    #: The run's cluster ids (its own floor's members), and cluster id → ClusterUpgrade name.
    members: frozenset[str] = frozenset()
    #: The run's cluster ids in the input's order (what the driver asks the provider about).
    ids: tuple[str, ...] = ()
    name_of: dict[str, str] = field(default_factory=dict)
    phases: Phases = field(default_factory=Phases)
    #: The members by stage index, as sets of names.
    stage_names: dict[int, frozenset[str]] = field(default_factory=dict)
    #: The inventory as last seen (cluster id → observation), the holders (another run's
    #: claims) as last seen, and the clusters that count as up by their observation alone
    #: (`up_by_observation`; holdings are counted apart).
    obs_seen: dict[str, ClusterObs] = field(default_factory=dict)
    holders_seen: dict[str, str] = field(default_factory=dict)
    up: set[str] = field(default_factory=set)
    #: How many of the run's members are in `up` (its own floor's count, kept as `up` changes).
    up_members: int = 0
    #: The memos (see `Waiting` and `Quiet`), by ClusterUpgrade name.
    waiting: dict[str, Waiting] = field(default_factory=dict)
    quiet: dict[str, Quiet] = field(default_factory=dict)
    #: Of the `quiet` memos: request id → name, and (deadline, name) as a heap (an entry whose
    #: memo is gone or changed is dropped when it comes to the top).
    quiet_rid: dict[str, str] = field(default_factory=dict)
    deadlines: list[tuple[datetime, str]] = field(default_factory=list)
    #: The operations by request id as last seen, and the run's step timeouts.
    ops_seen: dict[str, OpObs] = field(default_factory=dict)
    timeouts_seen: api.StepTimeouts | None = None
    #: The token of the snapshot last observed whole or by its changes (None: none, or one
    #: observed without its operations: the next is compared whole).
    world_token: object = None
    #: Whether what the index holds rests on callers saying what changed (a hint, a
    #: snapshot's changes) rather than on a comparison of every object since the last one:
    #: for the upgrades, and for the inventory's side.
    told_upgrades: bool = False
    told_world: bool = False
    #: Names whose object as last seen is the driver's (its health records), not the
    #: caller's: a caller's hint is taken with these added.
    lent: set[str] = field(default_factory=set)
    passes: int = 0
    #: When the driver's full pass last ran (the run's clock; None: not yet).
    full_at: datetime | None = None

    @classmethod
    def build(
        cls,
        uid: str,
        upgrades: Mapping[str, Upgrade],
        clusters: Mapping[str, ClusterObs] | None = None,
        held_by: Mapping[str, str] | None = None,
    ) -> RunIndex:
        """An index made from scratch (the full pass), with the inventory's side if given."""
        index = cls()
        index.rebuild(uid, upgrades)
        if clusters is not None:
            index.observe_world(clusters, held_by or {})
        return index

    def observe(
        self,
        uid: str,
        upgrades: Mapping[str, Upgrade],
        hint: Collection[str] | None = None,
        *,
        said: bool = True,
    ) -> None:
        """Bring the index up to date with this pass's upgrades: only those that are not the
        very objects seen last time are looked into; a change of run, of the set of upgrades
        or of a pinned spec rebuilds the order (and drops the memo).

        hint: the names whose objects may differ from those the index last saw (the caller's
        watch knows); only these are looked at. None: unknown, every object is compared. A
        hint that misses a change leaves the index behind until the driver's full pass
        (FULL_EVERY) finds and repairs it; `decide` takes no service-out on a hinted index
        without comparing every object first (`told`). said: False for a hint the driver
        made of its own substitutions (exact by construction), which leaves `told` as it was."""
        seen = self.seen
        if hint is None:
            self.told_upgrades = False
        elif said:
            self.told_upgrades = True
            hint = self.lent.union(hint)
        if uid != self.uid or len(upgrades) != len(seen):
            self.rebuild(uid, upgrades)
            return
        if hint is not None:
            if any(name not in seen for name in hint):
                self.rebuild(uid, upgrades)  # a new name: the order changes
                return
            names = [n for n in hint if n in upgrades and upgrades[n] is not seen[n]]
        elif list(upgrades) != self.names:
            self.rebuild(uid, upgrades)
            return
        else:
            # The same names in the same order: compared object by object, in C.
            names = list(compress(self.names, map(is_not, upgrades.values(), seen.values())))
        phases = self.phases
        changed = [(name, upgrades[name]) for name in names]
        for name, u in changed:
            old = seen[name]
            if old.spec is not u.spec and old.spec != u.spec:
                self.rebuild(uid, upgrades)
                return
        for name, u in changed:
            old = seen[name]
            self._keep(old, u)
            if old.status is not u.status:
                phases.move(u, old.status, u.status)
                self.waiting.pop(name, None)
                self.drop_quiet(name)

    def observe_world(
        self,
        clusters: Mapping[str, ClusterObs],
        held_by: Mapping[str, str],
        operations: Mapping[str, OpObs] | None = None,
        timeouts: api.StepTimeouts | None = None,
        token: object = None,
        changes: Changes | None = None,
    ) -> None:
        """Bring the inventory's side up to date (only observations that are not the objects
        seen last are looked into), the holders, the operations and the step timeouts; a memo
        of a cluster whose observation, holder or operation changed is dropped (all `quiet`
        memos when the timeouts changed).

        token, changes: the snapshot's (observations.Snapshot): when it says what changed
        since the very snapshot this index observed last, only those clusters and operations
        are looked at; otherwise every one is compared."""
        if changes is not None and token is not None and token is self.world_token:
            changes = Changes(token)  # the very snapshot observed last: nothing changed
        told = (
            changes is not None
            and operations is not None
            and self.world_token is not None
            and changes.since is self.world_token
        )
        self.world_token = token if operations is not None else None
        self.told_world = told
        if operations is not None:
            ops_seen, quiet_rid = self.ops_seen, self.quiet_rid
            if told and changes is not None:
                rids = [r for r in changes.operations if operations.get(r) is not ops_seen.get(r)]
            else:
                values = map(is_not, operations.values(), map(ops_seen.get, operations))
                rids = list(compress(operations, values))
            for rid in rids:
                if rid not in operations:
                    ops_seen.pop(rid, None)
                    if rid in quiet_rid:
                        self.drop_quiet(quiet_rid[rid])
                    continue
                ops_seen[rid] = operations[rid]
                if rid in quiet_rid:
                    self.drop_quiet(quiet_rid[rid])
            if not told and len(ops_seen) != len(operations):
                for rid in ops_seen.keys() - operations.keys():
                    del ops_seen[rid]
                    if rid in quiet_rid:
                        self.drop_quiet(quiet_rid[rid])
        if timeouts is not None and not same(timeouts, self.timeouts_seen):
            self.timeouts_seen = timeouts
            self.quiet, self.quiet_rid, self.deadlines = {}, {}, []
            self.phases.stirred |= self.phases.active
        seen, up, uid = self.obs_seen, self.up, self.uid
        if told and changes is not None:
            touched = [c for c in changes.clusters if clusters.get(c) is not seen.get(c)]
        else:
            values = map(is_not, clusters.values(), map(seen.get, clusters))
            touched = list(compress(clusters, values))
            if len(seen) + sum(1 for cid in touched if cid not in seen) != len(clusters):
                touched += list(seen.keys() - clusters.keys())
        for cid in touched:
            obs = clusters.get(cid)
            if obs is None:
                seen.pop(cid, None)
            else:
                seen[cid] = obs
            was, now = cid in up, up_by_observation(obs, uid)
            if now and not was:
                up.add(cid)
            elif was and not now:
                up.discard(cid)
            if was is not now and cid in self.members:
                self.up_members += 1 if now else -1
            if was is not now and cid in self.phases.held:
                self.phases.held_up += 1 if now else -1
            self._forget(cid)
        if held_by != self.holders_seen:
            for cid, _ in set(held_by.items()) ^ set(self.holders_seen.items()):
                self._forget(cid)
            self.holders_seen = dict(held_by)

    @property
    def told(self) -> bool:
        """Whether the index rests on what callers said changed since it last compared every
        object (a decision that may take a cluster out compares first: decide)."""
        return self.told_upgrades or self.told_world

    def _forget(self, cid: str) -> None:
        name = self.name_of.get(cid)
        if name is not None:
            self.waiting.pop(name, None)
            self.drop_quiet(name)

    def remember_quiet(self, name: str, memo: Quiet) -> None:
        """Keep a `quiet` memo (its operation's request id is on its status)."""
        self.drop_quiet(name)
        self.quiet[name] = memo
        self.quiet_rid[memo.rid or memo.status.request_id or ""] = name
        if memo.deadline is not None:
            heapq.heappush(self.deadlines, (memo.deadline, name))

    def drop_quiet(self, name: str) -> None:
        """Drop a `quiet` memo, if any."""
        memo = self.quiet.pop(name, None)
        if memo is not None:
            self.quiet_rid.pop(memo.rid or memo.status.request_id or "", None)
            self.phases.stirred.add(name)

    def loud(self) -> set[str]:
        """The names in an ACTIVE phase with no `quiet` memo (a new set), from the names
        stirred since the last time (`Phases.stirred`, narrowed here to these)."""
        active, quiet = self.phases.active, self.quiet
        names = {n for n in self.phases.stirred if n in active and n not in quiet}
        self.phases.stirred = set(names)
        return names

    def next_deadline(self) -> tuple[datetime, str] | None:
        """The earliest deadline of the `quiet` memos, and whose."""
        heap, quiet = self.deadlines, self.quiet
        while heap:
            deadline, name = heap[0]
            memo = quiet.get(name)
            if memo is not None and memo.deadline == deadline:
                return deadline, name
            heapq.heappop(heap)
        return None

    def note(self, u: Upgrade) -> None:
        """One upgrade whose status the caller changed (the driver's health records)."""
        old = self.seen.get(u.name)
        if old is None or old is u:
            return
        self._keep(old, u)
        if old.status is not u.status:
            self.phases.move(u, old.status, u.status)
            self.waiting.pop(u.name, None)
            self.drop_quiet(u.name)

    def _keep(self, old: Upgrade, u: Upgrade) -> None:
        """u in old's place (the same name and spec: a status change), in `seen` and in
        `by_stage`, so that the index holds one object per ClusterUpgrade, the newest."""
        stage = old.spec.stage_index
        self.seen[u.name] = u
        self.by_stage[stage][self.rank[u.name] - self.stage_start[stage]] = u

    def names_in(self, *phases: api.UpgradePhase) -> list[str]:
        """The names of the upgrades in these phases as last seen, in the input's order."""
        return sorted(self.phases.names(*phases), key=self.in_rank.__getitem__)

    def by_rank(self, names: set[str]) -> list[Upgrade]:
        """These upgrades (as last seen) in the engine's order."""
        seen = self.seen
        return [seen[n] for n in sorted(names, key=self.rank.__getitem__)]

    def in_order(self, names: set[str]) -> list[Upgrade]:
        """These upgrades (as last seen) in the input's order."""
        seen = self.seen
        return [seen[n] for n in sorted(names, key=self.in_rank.__getitem__)]

    def differences(self, other: RunIndex) -> list[str]:
        """What differs from another index of the same upgrades (empty: they agree)."""
        out = []
        if self.uid != other.uid:
            out.append(f"uid {self.uid!r} != {other.uid!r}")
        if self.rank != other.rank or self.names != other.names:
            out.append("the engine's order")
        if self.members != other.members or self.name_of != other.name_of:
            out.append("the run's members")
        if self.obs_seen and other.obs_seen and self.up != other.up:
            out.append("the clusters up by their observation")
        if other.obs_seen and self.up_members != len(other.up & other.members):
            out.append("the run's members up by their observation")
        if other.obs_seen and self.phases.held_up != len(other.phases.held & other.up):
            out.append("the held clusters up by their observation")
        if {s: [u.name for u in m] for s, m in self.by_stage.items()} != {
            s: [u.name for u in m] for s, m in other.by_stage.items()
        }:
            out.append("members by stage")
        seen = self.seen
        if any(u is not seen.get(u.name) for m in self.by_stage.values() for u in m):
            out.append("members by stage that are not the upgrades seen")
        if not self.phases.stirred >= self.phases.active - self.quiet.keys():
            out.append("in flight with no quiet memo, yet not stirred (`loud` would miss them)")
        mine, theirs = self.phases.comparable(), other.phases.comparable()
        words = (
            "names by phase",
            "per-stage counts",
            "refused",
            "Pending by reason",
            "held",
            "active",
        )
        for what, a, b in zip(words, mine, theirs, strict=True):
            if a != b:
                out.append(what)
        return out

    def rebuild(self, uid: str, upgrades: Mapping[str, Upgrade]) -> None:
        """Make the index from scratch, in place (the full pass), dropping the memo."""
        self.uid = uid
        self.seen = dict(upgrades)
        self.names = list(upgrades)
        self.in_rank = {n: i for i, n in enumerate(self.names)}
        ordered = sorted(upgrades.values(), key=lambda x: (x.spec.stage_index, x.cluster_id))
        self.rank = {u.name: i for i, u in enumerate(ordered)}
        self.by_stage = {}
        for u in ordered:
            self.by_stage.setdefault(u.spec.stage_index, []).append(u)
        self.stage_names = {i: frozenset(u.name for u in m) for i, m in self.by_stage.items()}
        self.stage_start = {i: self.rank[m[0].name] for i, m in self.by_stage.items()}
        self.name_of = {u.cluster_id: u.name for u in upgrades.values()}
        self.members = frozenset(self.name_of)
        self.ids = tuple(self.name_of)
        self.phases = Phases()
        for u in upgrades.values():
            self.phases.move(u, None, u.status)
        self.waiting = {}
        self.quiet = {}
        self.obs_seen, self.holders_seen, self.up, self.up_members = {}, {}, set(), 0
        self.phases.up, self.phases.held_up = self.up, 0  # none is up before it is observed
        self.quiet_rid, self.deadlines, self.ops_seen, self.timeouts_seen = {}, [], {}, None
        self.world_token, self.told_upgrades, self.told_world = None, False, False
