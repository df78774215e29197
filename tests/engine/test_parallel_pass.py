"""A pass's writes, preflights and calls shared by a few workers (RunDriver._each: one pool
task per worker, each taking the next item, not one Future per item), or its preflights and
calls started from the pass's thread (RunDriver._pipelined, for a provider that starts them:
StartsRequests), or started many as one request (RunDriver._batched, for a provider that
batches them: StartsBatches, BATCH_CALLS at a time, each batch behind the fence), keep each
item's own outcome: one conflicting write or one failing call among many changes only its
cluster."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from orchestrator import api
from orchestrator.engine.decide import Call, Preflight, Upgrade
from orchestrator.engine.observations import OpKind, OpObs, Snapshot
from orchestrator.pipeline import driver as driver_module
from orchestrator.pipeline.driver import (
    CallError,
    Question,
    StartsBatches,
    StartsRequests,
    WriteConflict,
)
from orchestrator.pipeline.simulate import ModelFleet
from tests.engine.model import Harness, U, as_run_spec, make_fleet, spec_for
from tests.support.starting import BatchesAtOnce, StartsAtOnce

NEW = "1.29.1"
CLUSTERS = 40
WORKERS = 8
#: The cluster kept in service (requiredAvailableCount 1).
SPARE = f"c{CLUSTERS:05d}"


@dataclass
class _Store(Harness):
    """A store in which writes to the named ClusterUpgrades conflict (another writer won), or
    fail outright (an error that is not a conflict)."""

    conflicting: set[str] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        if upgrade.name in self.broken:
            raise RuntimeError(f"{upgrade.name}: the apiserver answered 500")
        if upgrade.name in self.conflicting:
            raise WriteConflict(f"{upgrade.name}: the object has been modified")
        super().write_upgrade_status(upgrade, status)


@dataclass
class _Refusing:
    """The fleet as the driver's Provider, whose calls on the named clusters fail."""

    fleet: ModelFleet
    failing: set[str] = field(default_factory=set)
    preflighted: list[str] = field(default_factory=list)

    @property
    def supports_preflight(self) -> bool:
        return True

    def snapshot(self, cluster_ids: Sequence[str]) -> Snapshot:
        return self.fleet.snapshot(cluster_ids)

    def preflight(self, cluster_id: str, version: str, pools: Mapping[str, str]) -> Preflight:
        self.preflighted.append(cluster_id)
        return self.fleet.preflight(cluster_id, version, pools)

    def call(self, call: Call) -> OpObs:
        if call.cluster_id in self.failing:
            raise CallError("UNAVAILABLE", "the provider's API timed out", retryable=True)
        return self.fleet.call(call)


@dataclass
class _Starting(StartsAtOnce, _Refusing):
    """The same provider, which also starts requests without waiting (driver.StartsRequests,
    as the gRPC adapter does): the driver starts them from its thread and takes the answers
    in order. Records how many were started and not yet asked for at most."""


#: Calls per batch in these tests: the pass's 40 calls go as batches of 16, 16 and 8.
BATCH = 16


@dataclass
class _Batching(BatchesAtOnce, _Starting):
    """The same provider, which also starts many calls, or many preflights, as one request
    (driver.StartsBatches, as the gRPC adapter does with StartOperations and
    PreflightUpgrades). Records the size of each batch, and stops holding the Lease after
    `fence_after` batches of calls (None: never)."""

    batches: list[int] = field(default_factory=list)
    preflight_batches: list[int] = field(default_factory=list)
    fence_after: int | None = None
    leader: _Lease | None = None

    def start_preflights(
        self, questions: Sequence[Question]
    ) -> list[Callable[[], Preflight]] | None:
        self.preflight_batches.append(len(questions))
        return super().start_preflights(questions)

    def start_calls(self, calls: Sequence[Call]) -> list[Callable[[], OpObs]] | None:
        self.batches.append(len(calls))
        if self.leader is not None and len(self.batches) == self.fence_after:
            self.leader.holding = False
        return super().start_calls(calls)


@dataclass
class _Lease:
    holding: bool = True

    def held(self) -> bool:
        return self.holding


@pytest.fixture(
    params=["blocking", "started", "batched"],
    ids=["blocking-calls", "started-calls", "batched-calls"],
)
def starts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Whether the provider starts its requests (StartsRequests), batches them too
    (StartsBatches), or each blocks a worker."""
    monkeypatch.setattr(driver_module, "BATCH_CALLS", BATCH)
    return str(request.param)


def _parallel(
    fleet: ModelFleet, starts: str, store: type[_Store] = _Store, at_once: int = CLUSTERS
) -> tuple[_Store, _Refusing, ThreadPoolExecutor]:
    """The fleet plus one spare cluster (c00040, the one kept in service), `at_once` admitted
    at once (all of them by default) on WORKERS workers."""
    spec = spec_for(fleet, NEW, required=1, maxConcurrency=at_once)
    h = store(fleet, as_run_spec(spec))
    provider = {"blocking": _Refusing, "started": _Starting, "batched": _Batching}[starts](fleet)
    assert isinstance(provider, StartsRequests) == (starts != "blocking")
    assert isinstance(provider, StartsBatches) == (starts == "batched")
    pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="test-write")
    h.driver.provider = provider
    h.driver.parallelism = WORKERS
    h.driver.executor = pool
    return h, provider, pool


def _bounded(provider: _Refusing) -> None:
    """Started requests were never more than WORKERS at once (batched: never more than a
    batch each), and each answer was taken."""
    if isinstance(provider, _Batching):
        # Every preflight went in a batch, as every call did.
        assert provider.preflight_batches and max(provider.preflight_batches) <= BATCH
        assert sum(provider.preflight_batches) == len(provider.preflighted)
        assert provider.batches and max(provider.batches) <= BATCH
        # All of a pass's calls (or preflights) started before the first answer is taken.
        assert provider.most_outstanding == max(
            sum(provider.batches), sum(provider.preflight_batches)
        )
        assert provider.outstanding == 0
    elif isinstance(provider, _Starting):
        assert 1 < provider.most_outstanding <= WORKERS
        assert provider.outstanding == 0


def _name(h: Harness, cid: str) -> str:
    return next(n for n, u in h.upgrades.items() if u.cluster_id == cid)


def test_one_conflicting_write_among_many_changes_only_its_cluster(starts: str) -> None:
    fleet = make_fleet(CLUSTERS + 1)
    h, provider, pool = _parallel(fleet, starts)
    with pool:
        lost = _name(h, "c00017")
        h.conflicting.add(lost)
        before = dict(h.upgrades)
        result = h.step()
    assert result.conflicts == 1
    others = {f"c{i:05d}" for i in range(CLUSTERS)} - {"c00017"}
    # Every cluster admitted was asked about once (the preflights share the workers too).
    assert sorted(provider.preflighted) == sorted(others | {"c00017"})
    assert h.steps_of(SPARE) == []
    # The world: every other cluster's intent is on record and its service-out was made,
    # exactly once; the conflicting one kept its status and its cluster was never called.
    for cid in others:
        assert h.upgrades[_name(h, cid)].status.phase == U.SERVICING_OUT, cid
        assert h.steps_of(cid) == [OpKind.SERVICE_OUT], cid
    assert h.upgrades[lost].status == before[lost].status
    assert h.steps_of("c00017") == []
    assert result.calls_made == len(others)
    # What the pass returns is what took effect, each change once, as stored now.
    assert sorted(c.cluster_id for c in result.changes) == sorted(others)
    for change in result.changes:
        assert change.new == h.upgrades[change.name].status
    _bounded(provider)


def test_one_failing_call_among_many_is_recorded_on_its_cluster_alone(starts: str) -> None:
    fleet = make_fleet(CLUSTERS + 1)
    h, provider, pool = _parallel(fleet, starts)
    with pool:
        provider.failing.add("c00023")
        result = h.step()
    assert result.conflicts == 0
    assert result.calls_made == CLUSTERS - 1
    # The failed call's cluster keeps its intent (the same request id is asked again) with
    # the provider's words, and the pass looks again soon; nothing else carries them.
    failed = h.upgrades[_name(h, "c00023")].status
    assert failed.phase == U.SERVICING_OUT
    assert failed.message.startswith("will ask again: serviceOut")
    assert "the provider's API timed out" in failed.message
    assert result.requeue_after is not None and result.requeue_after <= 2.0
    assert h.steps_of("c00023") == []
    for cid in set(fleet.clusters) - {"c00023", SPARE}:
        status = h.upgrades[_name(h, cid)].status
        assert status.phase == U.SERVICING_OUT and "will ask again" not in (status.message or "")
        assert h.steps_of(cid) == [OpKind.SERVICE_OUT], cid
    # Its failure's write is returned after its intent's: two changes for it, one for each other.
    mine = [c for c in result.changes if c.cluster_id == "c00023"]
    assert ["will ask again" in (c.new.message or "") for c in mine] == [False, True]
    assert len(result.changes) == CLUSTERS + 1
    _bounded(provider)


def test_a_write_that_errors_stops_the_pass_before_any_call(starts: str) -> None:
    fleet = make_fleet(CLUSTERS + 1)
    h, _provider, pool = _parallel(fleet, starts)
    with pool:
        h.broken.add(_name(h, "c00005"))
        with pytest.raises(RuntimeError, match="answered 500"):
            h.step()
    # The error reached the caller once every worker stopped: no call was made (calls only
    # follow a completed intent phase), and no write of the broken one took effect.
    assert fleet.started_steps == []
    assert h.upgrades[_name(h, "c00005")].status.phase == U.PENDING


@dataclass
class _DoneConflicts(_Store):
    """A store in which the first write that records a cluster done (Upgraded) conflicts."""

    done_conflicts: int = 0

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        if status.phase == U.UPGRADED and not self.done_conflicts:
            self.done_conflicts += 1
            raise WriteConflict(f"{upgrade.name}: the object has been modified")
        super().write_upgrade_status(upgrade, status)


def test_an_admission_waits_for_every_write_it_rests_on(starts: str) -> None:
    """20 at a time: the pass that records the first ones done admits the next on the budget
    they free, but one of those completions conflicts. Several writes at once do not stop at
    a conflict, so the admissions (Decision.admissions) would be written and called beside it
    (simulation seeds 819 and 1132 found it so: a stage's completion, a retry); they wait for
    the next pass instead, and the run still finishes within its budget."""
    fleet = make_fleet(CLUSTERS + 1)
    h, _provider, pool = _parallel(fleet, starts, _DoneConflicts, at_once=CLUSTERS // 2)
    assert isinstance(h, _DoneConflicts)
    with pool:
        h.run(until=lambda h: isinstance(h, _DoneConflicts) and h.done_conflicts > 0)
        cut = h.last
        assert cut is not None and cut.conflicts == 1
        admitted = cut.decision.admissions
        assert admitted, "the pass that conflicted decided admissions"
        # None of them was written nor called; every other write of the pass took effect.
        assert not admitted & {c.name for c in cut.changes}
        for name in admitted:
            assert h.upgrades[name].status.phase == U.PENDING, name
            assert h.steps_of(h.upgrades[name].cluster_id) == [], name
        assert len(cut.changes) == len(cut.decision.changed) - len(admitted) - 1
        assert h.run()
    assert h.phase == api.RunPhase.SUCCEEDED
    assert h.max_held() <= CLUSTERS // 2
    assert all(u.status.phase == U.UPGRADED for u in h.upgrades.values() if u.cluster_id != SPARE)


def test_a_lease_lost_between_batches_starts_no_later_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(driver_module, "BATCH_CALLS", BATCH)
    fleet = make_fleet(CLUSTERS + 1)
    h, provider, pool = _parallel(fleet, "batched")
    assert isinstance(provider, _Batching)
    lease = provider.leader = _Lease()
    provider.fence_after = 1
    h.driver.fence = lease
    with pool:
        result = h.step()
    # The first batch was started while the Lease was held, and its answers taken; no batch
    # after it was started.
    assert provider.batches == [BATCH]
    assert result.fenced
    assert result.calls_made == BATCH
    assert len(fleet.started_steps) == BATCH
    assert provider.outstanding == 0
