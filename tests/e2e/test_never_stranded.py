"""Issue 11, failure 5d/5e: forgotten operations, hung operations and waits all have bounds."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from orchestrator.engine.conditions import parse_time
from tests.e2e.conftest import (
    OLD,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import wait_for


def test_forgotten_operation_fails_its_cluster_and_is_never_asked_again(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    # The plugin forgets every control-plane operation of cluster-00 when it would end.
    forget = {"forgetStep": [{"step": "controlPlane", "clusters": ["cluster-00"]}]}
    fleet = sim(fleet_file(3, step=0.3, faults=forget))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(3), 2, strategy={"maxConcurrency": 1})
    )
    run = objects.current_run("fleet")
    wait_for(
        "cluster-00 upgrades its control plane",
        lambda: objects.upgrade_status(run, "cluster-00").get("phase") == "UpgradingControlPlane",
        timeout=60,
    )
    request_id = objects.upgrade_status(run, "cluster-00")["requestId"]
    status = wait_for(
        "cluster-00 fails instead of waiting forever",
        lambda: (s := objects.upgrade_status(run, "cluster-00")).get("phase") == "Failed" and s,
        timeout=90,
        interval=0.2,
    )
    assert status["reason"] == "OperationLost", status
    assert status["requestId"] == request_id, status  # the step it failed at
    assert "no longer knows operation" in status["message"], status
    assert "retry-clusters" in status["message"], status
    time.sleep(1.0)  # quiet period: nothing more is asked of the plugin for cluster-00
    m = fleet.monitor()
    # cluster-00: one service-out and one start of the control-plane request (the forgotten
    # operation may have run: it is never started again); the other clusters are not touched
    # (onFailure Halt).
    assert m["mutations_total"] == 1 + 1, m
    assert m["operations_in_flight"] == 0 and m["duplicate_mutations"] == 0, m
    assert fleet.cluster("cluster-00")["controlPlaneVersion"] == OLD
    assert m["min_available_in_service"] == 2, m
    assert objects.cv_phase_is("fleet", "Halted")
    assert not reconcile_errors(orchestrators.logs())


def test_hung_operation_fails_the_cluster_after_its_step_timeout(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    hang = {"hangStep": [{"step": "controlPlane", "clusters": ["cluster-00"]}]}
    fleet = sim(fleet_file(3, step=0.3, faults=hang))
    orchestrators.start()
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(3),
            2,
            strategy={"maxConcurrency": 1},
            timeouts={"controlPlane": "3s"},
        )
    )
    run = objects.current_run("fleet")
    wait_for(
        "cluster-00 upgrades its control plane",
        lambda: objects.upgrade_status(run, "cluster-00").get("phase") == "UpgradingControlPlane",
        timeout=60,
    )
    status = wait_for(
        "the hung step times out",
        lambda: (s := objects.upgrade_status(run, "cluster-00")).get("phase") == "Failed" and s,
        timeout=60,
        interval=0.1,
    )
    took = parse_time(status["endTime"]) - parse_time(status["stepStartTime"])
    # The 3 s bound (stamps have whole seconds), plus a reconcile's slack.
    assert timedelta(seconds=2) <= took <= timedelta(seconds=15), took
    assert status["reason"] == "StepTimedOut", status
    assert "controlPlane" in status["message"] and "0:00:03" in status["message"], status
    m = fleet.monitor()
    assert m["operations_in_flight"] == 1, m  # the provider's operation still hangs
    assert m["mutations_total"] == 2, m  # service-out and the hung control plane; nothing more
    halted = wait_for("the run halts", lambda: objects.cv_phase_is("fleet", "Halted"), timeout=20)
    assert "cluster-00" in halted["message"] and "did not finish" in halted["message"], halted
    assert not reconcile_errors(orchestrators.logs())


def test_waiting_for_availability_is_bounded(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(3, step=0.5))
    orchestrators.start()
    objects.create_cv(
        cluster_version(
            "fleet",
            fleet.address,
            ids(3),
            2,
            strategy={"maxConcurrency": 1},
            timeouts={"ready": "2s"},
        )
    )
    run = objects.current_run("fleet")
    wait_for(
        "cluster-00 upgrades its node pools",
        lambda: objects.upgrade_status(run, "cluster-00").get("phase") == "UpgradingNodePools",
        timeout=60,
        interval=0.05,
    )
    # The cluster goes down during its upgrade and does not come back.
    fleet.fleet.set_health("cluster-00", available=False, unavailable_reason="etcd unhealthy")
    status = wait_for(
        "the wait for availability ends",
        lambda: (s := objects.upgrade_status(run, "cluster-00")).get("phase") == "Failed" and s,
        timeout=60,
        interval=0.1,
    )
    assert status["reason"] == "NotReady", status
    assert "etcd unhealthy" in status["message"] and "2s" in status["message"], status
    m = fleet.monitor()
    assert m["mutations_total"] == 4, m  # never serviced in while unavailable
    assert fleet.cluster("cluster-00")["inService"] is False
    assert not reconcile_errors(orchestrators.logs())
