"""Issue 11, failure 3: a cluster upgraded past the target by someone else is drift, local."""

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

PAST = "1.29.3"  # what a release channel moved the clusters to, past the target NEW


def test_out_of_band_upgrade_past_target_is_recorded_and_the_rest_completes(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    # cluster-01 takes 2 s to go out of service, so it is caught in flight.
    fleet = sim(
        fleet_file(6, step=0.3, per_cluster={"cluster-01": {"stepSeconds": {"serviceOut": 2.0}}})
    )
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(6), 4, strategy={"maxConcurrency": 1})
    )
    run = objects.current_run("fleet")
    wait_for(
        "cluster-01 is being taken out of service",
        lambda: objects.upgrade_status(run, "cluster-01").get("phase") == "ServicingOut",
        timeout=60,
    )
    # Someone else (a GKE release channel) upgrades one cluster in flight and one still queued.
    pools = {"default-pool": PAST, "workers": PAST}
    fleet.fleet.set_versions("cluster-01", PAST, pools)
    fleet.fleet.set_versions("cluster-04", PAST, pools)
    status = wait_for(
        "the rollout completes",
        lambda: objects.cv_phase_is("fleet", "Completed", "Invalid", "Halted", "Failed"),
        timeout=90,
        interval=0.2,
    )
    assert status["phase"] == "Completed", status
    ups = objects.upgrades(run)
    queued = ups["cluster-04"]["status"]
    assert queued["phase"] == "Skipped" and queued["reason"] == "AtTarget", queued
    assert PAST in queued["message"], queued
    in_flight = ups["cluster-01"]["status"]
    assert in_flight["phase"] in ("Upgraded", "Skipped"), in_flight
    assert PAST in in_flight["message"], in_flight
    for cid in ("cluster-00", "cluster-02", "cluster-03", "cluster-05"):
        assert ups[cid]["status"]["phase"] == "Upgraded", (cid, ups[cid]["status"])
    m = fleet.monitor()
    assert m["available_in_service"] == 6, m  # no cluster left out of service
    assert m["min_available_in_service"] >= 4, m
    assert m["clusters_by_version"] == {NEW: 4, PAST: 2}, m  # nothing pulled back to target
    assert m["duplicate_mutations"] == 0, m
    assert all(fleet.cluster(c)["inService"] for c in ids(6))
    assert not reconcile_errors(orchestrators.logs())
