"""A pass looks again at the ended attempts that linger (index.lingers: they keep their
cluster, or a person's retry waits for it to be at rest), not at every Failed, Skipped and
Blocked cluster of the run (issue 21: a pass costs what changed)."""

from __future__ import annotations

from orchestrator import api
from orchestrator.engine.index import RETRY_WAITS, Phases, lingers
from tests.engine.model import make_fleet, pinned, spec_for

U = api.UpgradePhase


def test_only_the_ended_attempts_that_keep_or_wait_are_kept_apart() -> None:
    fleet = make_fleet(4)
    by_id = pinned(fleet, spec_for(fleet, "1.29.1", required=1))
    u = by_id["c00000"]
    phases = Phases()
    at_target = api.ClusterUpgradeStatus(phase=U.SKIPPED, reason="AtTarget")
    failed = api.ClusterUpgradeStatus(
        phase=U.FAILED, reason="StepTimedOut", step="controlPlane", request_id="r"
    )
    released = failed.model_copy(update={"step": None, "request_id": None})
    waiting = released.model_copy(update={"message": f"retry requested by x{RETRY_WAITS}y"})
    phases.move(u, None, at_target)
    assert not phases.lingering and not lingers(at_target)
    phases.move(u, at_target, failed)
    assert phases.lingering == {u.name}
    phases.journal = []
    # Same phase and reason, the step let go: no longer looked at...
    phases.move(u, failed, released)
    assert not phases.lingering
    # ...unless a person's retry waits for the cluster.
    phases.move(u, released, waiting)
    assert phases.lingering == {u.name}
    phases.undo()
    assert phases.lingering == {u.name} and phases.by_phase[U.FAILED] == {u.name}
    phases.move(u, failed, None)
    assert not phases.lingering
    active = api.ClusterUpgradeStatus(phase=U.UPGRADING_CONTROL_PLANE, step="controlPlane")
    assert not lingers(active)
