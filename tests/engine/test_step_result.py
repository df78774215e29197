"""What one pass of the real RunDriver returns is all its caller records (issue 23, one-way
data flow): the ClusterUpgrade writes that took effect, each with the phases the decision took
it through, and the run's status built from the decision (`StepResult.run_status`, which the
UpdateRun controller and the simulation both call)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator import api
from orchestrator.engine.decide import Upgrade
from orchestrator.engine.observations import OpKind
from orchestrator.engine.transitions import transitions
from orchestrator.pipeline.driver import WriteConflict
from tests.engine.model import Harness, U, as_run_spec, harness, make_fleet, spec_for

NEW = "1.29.1"


@dataclass
class _Conflicting(Harness):
    """A store in which writes to the named ClusterUpgrades conflict (another writer won)."""

    conflicting: set[str] = field(default_factory=set)

    def write_upgrade_status(self, upgrade: Upgrade, status: api.ClusterUpgradeStatus) -> None:
        if upgrade.name in self.conflicting:
            raise WriteConflict(f"{upgrade.name}: the object has been modified")
        super().write_upgrade_status(upgrade, status)


def test_a_retry_returns_its_write_with_every_phase_it_went_through() -> None:
    fleet = make_fleet(3)
    fleet.fail.add(("c00000", OpKind.CONTROL_PLANE))
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    assert h.run()
    assert h.phase == api.RunPhase.HALTED
    fleet.fail.clear()
    before = dict(h.upgrades)
    result = h.step(retry=frozenset({"c00000"}))
    # Every write that took effect is returned, and nothing else: each change's new status is
    # the one stored now, its old one the status the pass started from.
    stored_changed = {n for n, u in h.upgrades.items() if u.status != before[n].status}
    assert {c.name for c in result.changes} == stored_changed
    assert result.writes == len(result.changes) >= 1
    for change in result.changes:
        assert change.new == h.upgrades[change.name].status
        assert change.old.phase == before[change.name].status.phase
    retried = next(c for c in result.changes if c.cluster_id == "c00000")
    assert retried.old.phase == U.FAILED
    assert retried.new.attempt == 1
    # Failed → Pending → on, in one write: the phases the decision took it through.
    phases = [p for p, _ in retried.steps]
    assert phases[0] == U.PENDING and phases[-1] == retried.new.phase
    # orchestrator.engine.transitions reads them as they are: one cluster transition per phase.
    found = transitions("uid-1", api.UpdateRunStatus(), api.UpdateRunStatus(), result.changes)
    assert [t.reason for t in found if t.cluster == "c00000"] == [p.value for p in phases]


def test_a_write_that_conflicts_is_not_returned_and_its_call_is_not_made() -> None:
    fleet = make_fleet(3)
    h = _Conflicting(fleet, as_run_spec(spec_for(fleet, NEW, required=1, maxConcurrency=2)))
    lost = next(n for n, u in h.upgrades.items() if u.cluster_id == "c00001")
    h.conflicting.add(lost)
    before = dict(h.upgrades)
    result = h.step()
    assert result.conflicts == 1
    # c00000's service-out took effect and is returned; c00001's did not and is not.
    assert [(c.cluster_id, c.old.phase, c.new.phase) for c in result.changes] == [
        ("c00000", U.PENDING, U.SERVICING_OUT)
    ]
    assert result.changes[0].new == h.upgrades[result.changes[0].name].status
    # The world: the conflicting ClusterUpgrade kept what it had and its cluster was never
    # called; the one on record was.
    assert h.upgrades[lost].status == before[lost].status
    assert h.steps_of("c00001") == []
    assert h.steps_of("c00000") == [OpKind.SERVICE_OUT]
    assert result.run_status(api.UpdateRunStatus(), h.now).end_time is None


def test_the_run_status_comes_from_the_decision_and_its_end_time_is_stamped_once() -> None:
    fleet = make_fleet(4)
    h = harness(spec_for(fleet, NEW, required=2), fleet)
    first = h.step()
    progressing = first.run_status(api.UpdateRunStatus(start_time="2026-01-01T00:00:00Z"), h.now)
    d = first.decision
    assert progressing.phase == d.phase == api.RunPhase.PROGRESSING
    assert (progressing.message, progressing.counts, progressing.stages) == (
        d.message,
        d.counts,
        d.stages,
    )
    assert progressing.start_time == "2026-01-01T00:00:00Z"  # what the pass does not decide
    assert progressing.end_time is None
    assert h.run()
    assert h.last is not None
    done = h.last.run_status(progressing, h.now)
    assert done.phase == api.RunPhase.SUCCEEDED and done.end_time is not None
    assert done.counts == api.RunCounts(total=4, upgraded=4)
    fleet.now += 600  # looked at again later: the end it recorded stands
    assert h.last.run_status(done, h.now).end_time == done.end_time
