"""Issue 19: a release channel upgrades one cluster's control plane past the run's target while its
node pools stay behind. Drift is local (invariant 7): the control plane is done and left where
it is, only the pools are preflighted and upgraded, and nothing of it is a failure."""

from __future__ import annotations

from collections.abc import Callable

from tests.e2e.conftest import (
    NEW,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    reconcile_errors,
)
from tests.support.kube import wait_for

PAST = "1.29.6"  # where the release channel moved cluster-04's control plane (target NEW)
ACTIVE = ("ServicingOut", "UpgradingControlPlane", "UpgradingNodePools", "Verifying")


def test_control_plane_upgraded_past_target_mid_run_only_its_pools_are_upgraded(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(6, step=0.3))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(6), 4, strategy={"maxConcurrency": 1})
    )
    run = objects.current_run("fleet")
    wait_for(
        "cluster-01 is under way",
        lambda: objects.upgrade_status(run, "cluster-01").get("phase") in ACTIVE,
        timeout=60,
        interval=0.1,
    )
    assert objects.upgrade_status(run, "cluster-04").get("phase", "Pending") == "Pending"
    # Someone else upgrades cluster-04's control plane only; its pools stay at OLD.
    fleet.fleet.set_versions("cluster-04", PAST)
    status = wait_for(
        "the rollout ends",
        lambda: objects.cv_phase_is("fleet", "Completed", "Invalid", "Halted", "Failed"),
        timeout=120,
        interval=0.2,
    )
    assert status["phase"] == "Completed", status
    run_status = objects.run(run)["status"]
    assert run_status["phase"] == "Succeeded", run_status
    counts = run_status["counts"]
    assert counts["upgraded"] == 6 and not counts.get("failed") and not counts.get("blocked")
    assert not (run_status.get("failures") or {}).get("count"), run_status
    # The world: the control plane left where the channel put it, the pools at target.
    drifted = fleet.cluster("cluster-04")
    assert drifted["controlPlaneVersion"] == PAST, drifted
    assert {p["version"] for p in drifted["nodePools"]} == {NEW}, drifted
    for cid in ids(6):
        c = fleet.cluster(cid)
        assert c["inService"] and c["available"], c
        if cid != "cluster-04":
            assert c["controlPlaneVersion"] == NEW, c
            assert {p["version"] for p in c["nodePools"]} == {NEW}, c
    m = fleet.monitor()
    assert m["available_in_service"] == 6, m
    assert m["min_available_in_service"] >= 4, m  # the floor held
    assert m["clusters_by_version"] == {NEW: 5, PAST: 1}, m  # nothing pulled back to NEW
    assert m["clusters_at_target"] == 5, m
    assert m["duplicate_mutations"] == 0 and m["operations_failed"] == 0, m
    # Recorded on cluster-04's own ClusterUpgrade.
    up = objects.upgrades(run)["cluster-04"]["status"]
    assert up["phase"] == "Upgraded" and PAST in up["message"], up
    cond = next(c for c in up["conditions"] if c["type"] == "ControlPlanePastTarget")
    assert cond["status"] == "True" and cond["reason"] == "UpgradedOutsideRun", cond
    assert PAST in cond["message"] and NEW in cond["message"], cond
    assert not reconcile_errors(orchestrators.logs())
