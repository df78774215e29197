"""What holds the deletion of a run (orchestrator.pipeline.deletion): pure, from its clusters'
records."""

from __future__ import annotations

import pytest

from orchestrator import api
from orchestrator.engine.decide import ACTIVE, RECOVER_GAVE_UP, RECOVER_STEP
from orchestrator.pipeline import deletion

U = api.UpgradePhase
KEEP_OUT = api.FailedClusterPolicy.KEEP_OUT
SERVICE_IN = api.FailedClusterPolicy.SERVICE_IN_IF_HEALTHY


def _st(phase: U, step: str | None = None) -> api.ClusterUpgradeStatus:
    return api.ClusterUpgradeStatus(phase=phase, step=step)


@pytest.mark.parametrize("phase", sorted(ACTIVE))
def test_every_cluster_in_flight_holds_the_deletion(phase: U) -> None:
    held = deletion.holds([("a", _st(phase, "controlPlane")), ("b", _st(U.UPGRADED))], KEEP_OUT)
    assert held == deletion.Holds(waiting=("a",), kept_out=())


def test_a_failed_cluster_being_serviced_back_in_holds_it() -> None:
    held = deletion.holds([("a", _st(U.FAILED, RECOVER_STEP))], SERVICE_IN)
    assert held == deletion.Holds(waiting=("a",), kept_out=())


@pytest.mark.parametrize("step", ["serviceIn", "controlPlane", "nodePool/workers"])
def test_a_failed_cluster_the_policy_will_still_bring_back_holds_it(step: str) -> None:
    """Simulation seed 86310: a service-in refused while the run was being deleted left the
    cluster Failed with its step; ServiceInIfHealthy services it back in on the next pass (or
    once its provider answers), so the run waits for it instead of letting it go out of
    service. Under KeepOut the same record is kept out, as the policy says."""
    failed = [("a", _st(U.FAILED, step)), ("b", _st(U.UPGRADED))]
    assert deletion.holds(failed, SERVICE_IN) == deletion.Holds(waiting=("a",), kept_out=())
    assert deletion.holds(failed, KEEP_OUT) == deletion.Holds(waiting=(), kept_out=("a",))


@pytest.mark.parametrize(
    ("phase", "step", "policy"),
    [
        (U.FAILED, "controlPlane", KEEP_OUT),
        (U.FAILED, RECOVER_GAVE_UP, SERVICE_IN),  # ServiceInIfHealthy gave up
        (U.SKIPPED, "nodePool/workers", SERVICE_IN),  # left the inventory mid-upgrade
        (U.SKIPPED, "nodePool/workers", KEEP_OUT),
    ],
)
def test_an_ended_attempt_that_may_keep_its_cluster_out_is_kept_out(
    phase: U, step: str, policy: api.FailedClusterPolicy
) -> None:
    held = deletion.holds([("a", _st(phase, step)), ("b", _st(U.PENDING))], policy)
    assert held == deletion.Holds(waiting=(), kept_out=("a",))


@pytest.mark.parametrize(
    "status",
    [
        _st(U.PENDING),
        _st(U.UPGRADED, "serviceIn"),  # the step of a done cluster is history
        _st(U.FAILED),  # its step cleared: seen back in service
        _st(U.BLOCKED),
        _st(U.SKIPPED),
    ],
)
def test_clusters_in_service_hold_nothing(status: api.ClusterUpgradeStatus) -> None:
    for policy in api.FailedClusterPolicy:
        assert deletion.holds([("a", status)], policy) == deletion.Holds(waiting=(), kept_out=())


def test_a_run_being_deleted_is_driven_as_stopped() -> None:
    spec = api.UpdateRunSpec.model_validate(
        {"requiredAvailableCount": 1, "opsEndpoint": {"endpoint": "x:1"}, "clusters": []}
    )
    assert spec.state == api.RunState.RUN
    assert deletion.stopping(spec).state == api.RunState.STOP
    assert deletion.stopping(spec).model_copy(update={"state": spec.state}) == spec


def test_deleting_and_finalizer_read_metadata() -> None:
    obj = {"metadata": {"finalizers": [api.FINALIZER, "orphan"], "deletionTimestamp": "t"}}
    assert deletion.deleting(obj) and deletion.has_finalizer(obj) and deletion.orphaning(obj)
    assert not (deletion.deleting({"metadata": {}}) or deletion.has_finalizer({"metadata": {}}))


def test_an_object_deleted_with_no_finalizer_left_is_released() -> None:
    """A cache records the answer of the last finalizer's removal as gone, not as an object."""
    assert deletion.released({"metadata": {"deletionTimestamp": "t", "finalizers": []}})
    assert not deletion.released({"metadata": {"deletionTimestamp": "t", "finalizers": ["x"]}})
    assert not deletion.released({"metadata": {"finalizers": []}})


def test_owned_by_reads_owner_references() -> None:
    run = {"metadata": {"ownerReferences": [{"uid": "cv-1", "kind": "ClusterVersion"}]}}
    assert deletion.owned_by(run, "cv-1")
    assert not deletion.owned_by(run, "cv-2")
    assert not deletion.owned_by({"metadata": {}}, "cv-1")  # orphaned: no longer its
