"""Invariant 3 across replicas: a failing evaluation of ours that no write recorded breaks the
passes on record, also when another replica decided a service-in on them (the driver's
unrecorded failures). Simulation seed 137037: a Failed cluster's way back in
(failedClusterPolicy ServiceInIfHealthy) was decided by a replica that never saw the failure;
its call was fenced, and the replica that made the failing evaluation asked the service-in on
record. Before, only a Servicing-in cluster's passes were reset."""

from __future__ import annotations

from dataclasses import replace

import pytest

from orchestrator import api
from orchestrator.engine.decide import RECOVER_STEP, request_id
from orchestrator.engine.observations import OpKind
from tests.engine.model import (
    Harness,
    as_run_spec,
    health_checks,
    make_fleet,
    spec_for,
)

U = api.UpgradePhase
NEW = "1.29.1"


def _service_in_on_record(phase: U) -> tuple[Harness, str]:
    """Cluster c00000 upgraded and out of service; its service-in on record, decided on 2
    passes in a row (another replica's), as a Servicing-in step or a Failed cluster's way back."""
    fleet = make_fleet(3, version=NEW)
    fleet.clusters["c00000"] = replace(fleet.clusters["c00000"], in_service=False)
    spec = spec_for(
        fleet,
        NEW,
        1,
        failedClusterPolicy="ServiceInIfHealthy",
        _healthChecks=health_checks("10s", 2, 2, "5m"),
    )
    h = Harness(fleet, as_run_spec(spec))
    name = next(n for n, u in h.upgrades.items() if u.cluster_id == "c00000")
    step = OpKind.SERVICE_IN.value if phase == U.SERVICING_IN else RECOVER_STEP
    rid = request_id(h.uid, "c00000", step, NEW, 0)
    passed = api.HealthState(
        since="2026-01-01T00:00:00Z", passes=2, last_check_time="2026-01-01T00:00:20Z"
    )
    on_record = api.ClusterUpgradeStatus(
        phase=phase,
        step=step,
        request_id=rid,
        step_start_time="2026-01-01T00:00:21Z",
        health=passed,
        reason="StepTimedOut" if phase == U.FAILED else None,
    )
    h.write_upgrade_status(h.upgrades[name], on_record)
    h.fleet.now = 25.0
    return h, name


@pytest.mark.parametrize("phase", [U.SERVICING_IN, U.FAILED])
def test_a_service_in_on_record_is_not_asked_past_a_failure_of_ours(phase: U) -> None:
    h, name = _service_in_on_record(phase)
    # This replica evaluated the cluster failing since; its write of it was lost.
    h.driver.unrecorded_failures.add(name)
    h.step()
    st = h.upgrades[name].status
    assert st.health is not None and st.health.passes == 0, st
    assert h.steps_of("c00000") == []  # nothing asked
    assert not h.fleet.clusters["c00000"].in_service
    assert name not in h.driver.unrecorded_failures  # the reset is on record
    # The service-in is asked only after successThreshold passes in a row again.
    for _ in range(30):  # stepped by hand: a Failed cluster halts the run (1 < 3 budget)
        h.fleet.now += 5.0
        h.step()
        if h.steps_of("c00000"):
            break
    assert h.steps_of("c00000") == [OpKind.SERVICE_IN]
    ours = [e for e in h.checker.evaluations if e.clusters == ("c00000",)]
    assert len(ours) >= 2 and all(e.passed for e in ours[-2:])


@pytest.mark.parametrize("phase", [U.SERVICING_IN, U.FAILED])
def test_without_a_failure_of_ours_the_service_in_on_record_is_asked(phase: U) -> None:
    h, _ = _service_in_on_record(phase)
    h.step()
    assert h.steps_of("c00000") == [OpKind.SERVICE_IN]
