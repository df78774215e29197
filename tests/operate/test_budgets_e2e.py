"""Issue 12: failure budgets on the real stack (apiserver, orchestrator process, sim plugin).

Failed clusters within spec.strategy.maxFailures let the rollout go on (they stay out of
service and count against the availability budget); one failure past it halts the run with the
count, the budget and the clusters in status.failures and the message.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.e2e.conftest import (
    NEW,
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


def _fail_control_plane(*clusters: str) -> dict[str, object]:
    return {"failStep": [{"step": "controlPlane", "clusters": list(clusters)}]}


def test_failures_within_the_budget_let_the_rollout_finish(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(6, step=0.2, faults=_fail_control_plane("cluster-01", "cluster-03")))
    orchestrators.start()
    # Two failed clusters stay out of service: a floor of 3 over 6 leaves room for one more.
    objects.create_cv(
        cluster_version(
            "fleet", fleet.address, ids(6), 3, strategy={"maxConcurrency": 1, "maxFailures": 2}
        )
    )
    run = objects.current_run("fleet")
    status = wait_for(
        "the run finishes",
        lambda: objects.run_phase_is(run, "Failed"),
        timeout=90,
        interval=0.2,
    )
    assert status["failures"] == {
        "count": 2,
        "maxFailures": 2,
        "clusters": ["cluster-01", "cluster-03"],
    }, status
    ups = objects.upgrades(run)
    for cid in ("cluster-01", "cluster-03"):
        st = ups[cid]["status"]
        assert st["phase"] == "Failed" and st["reason"] == "OperationFailed", st
        assert fleet.cluster(cid)["inService"] is False  # KeepOut: left out for a person
    for cid in ("cluster-00", "cluster-02", "cluster-04", "cluster-05"):
        assert ups[cid]["status"]["phase"] == "Upgraded", ups[cid]["status"]
        assert fleet.cluster(cid)["controlPlaneVersion"] == NEW
        assert fleet.cluster(cid)["inService"] is True
    m = fleet.monitor()
    assert m["min_available_in_service"] >= 3, m
    assert m["duplicate_mutations"] == 0, m
    assert not reconcile_errors(orchestrators.logs())


def test_one_failure_past_the_budget_halts_and_starts_nothing_more(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    failing = ("cluster-00", "cluster-01", "cluster-02")
    fleet = sim(fleet_file(8, step=0.2, faults=_fail_control_plane(*failing)))
    orchestrators.start()
    objects.create_cv(
        cluster_version(
            "fleet", fleet.address, ids(8), 4, strategy={"maxConcurrency": 1, "maxFailures": 1}
        )
    )
    run = objects.current_run("fleet")
    status = wait_for(
        "the run halts",
        lambda: objects.run_phase_is(run, "Halted"),
        timeout=90,
        interval=0.2,
    )
    assert status["failures"] == {
        "count": 2,
        "maxFailures": 1,
        "clusters": ["cluster-00", "cluster-01"],
    }, status
    message = status["message"]
    assert "2 failure(s) past the budget (run maxFailures 1)" in message, message
    assert "cluster-00 (OperationFailed)" in message and "cluster-01 (OperationFailed)" in message
    assert status["waitingReason"] == "Halted", status
    time.sleep(2.0)  # a quiet period in which a wrong controller would admit the next cluster
    before = fleet.monitor()["mutations_total"]
    time.sleep(1.0)
    assert fleet.monitor()["mutations_total"] == before
    ups = objects.upgrades(run)
    for i in range(2, 8):
        cid = f"cluster-{i:02d}"
        st = ups[cid].get("status") or {}  # never touched: no status written at all
        assert st.get("phase", "Pending") == "Pending", st
        assert fleet.cluster(cid)["controlPlaneVersion"] == OLD
        assert fleet.cluster(cid)["inService"] is True
    assert objects.cv_status("fleet")["phase"] == "Halted"
    assert not reconcile_errors(orchestrators.logs())
