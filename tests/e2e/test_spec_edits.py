"""Issue 11, failure 5c/5f: spec edits mid-flight supersede the run, no crash, none stranded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.e2e.conftest import (
    NEW,
    OLD,
    Objects,
    Orchestrators,
    Sim,
    cluster_version,
    fleet_file,
    ids,
    metric_checks,
    reconcile_errors,
)
from tests.support.kube import wait_for

QUERY = 'error_ratio{cluster="{{ cluster }}"}'
ACTIVE = {"ServicingOut", "UpgradingControlPlane", "UpgradingNodePools", "Verifying", "ServicingIn"}


def stages(first: str) -> list[dict[str, Any]]:
    return [
        {"name": first, "clusters": ["cluster-00", "cluster-01"]},
        {"name": "rest", "clusters": ["cluster-02", "cluster-03"]},
    ]


def finished(objects: Objects, run: str) -> dict[str, Any] | None:
    status = objects.run(run).get("status") or {}
    return status if status.get("phase") in ("Stopped", "Succeeded", "Failed") else None


def stage_verifies(objects: Objects, run: str) -> bool:
    stages = (objects.run(run).get("status") or {}).get("stages") or []
    return bool(stages) and stages[0]["phase"] == "Verifying"


@pytest.mark.parametrize("during", ["cluster-checks", "stage-checks"])
def test_renaming_a_stage_while_it_verifies_supersedes_the_run(
    during: str, sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    fleet = sim(fleet_file(4, step=0.3, metrics={'error_ratio{cluster="{{cluster}}"}': 0.0}))
    orchestrators.start()
    body = cluster_version(
        "fleet",
        fleet.address,
        ids(4),
        2,
        strategy={"maxConcurrency": 2, "stages": stages("first")},
        healthChecks=metric_checks(QUERY, 0.01, interval="500ms", success=4),
    )
    objects.create_cv(body)
    old = objects.current_run("fleet")
    if during == "cluster-checks":  # cluster-00 is analysed before its service-in
        wait_for(
            "cluster-00 verifies",
            lambda: objects.upgrade_status(old, "cluster-00").get("phase") == "Verifying",
            timeout=60,
            interval=0.05,
        )
    else:  # both clusters are in; the stage is analysed before the next may start
        wait_for("stage first verifies", lambda: stage_verifies(objects, old), timeout=60)
    objects.patch_cv("fleet", {"spec": {"strategy": {"stages": stages("canary")}}})
    new = wait_for(
        "a new run",
        lambda: (r := objects.cv_status("fleet").get("currentRun")) != old and r,
        timeout=30,
    )
    status = wait_for(
        "the new run completes",
        lambda: objects.cv_phase_is("fleet", "Completed"),
        timeout=90,
        interval=0.2,
    )
    old_status = wait_for("the old run ends", lambda: finished(objects, old), timeout=30)
    assert old_status["phase"] == "Stopped", old_status
    for cid, up in objects.upgrades(old).items():
        assert (up.get("status") or {}).get("phase") not in ACTIVE, (cid, up.get("status"))
    ups = objects.upgrades(new)
    assert [s["name"] for s in objects.run(new)["status"]["stages"]] == ["canary", "rest"]
    assert {c: u["status"]["phase"] for c, u in ups.items()} == {
        "cluster-00": "Skipped",  # finished and serviced back in by the stopped run
        "cluster-01": "Skipped",
        "cluster-02": "Upgraded",
        "cluster-03": "Upgraded",
    }
    assert status["runs"][0]["name"] == new and old in [r["name"] for r in status["runs"]]
    m = fleet.monitor()
    assert m["clusters_at_target"] == 4 and m["available_in_service"] == 4, m
    assert m["min_available_in_service"] >= 2, m
    assert m["duplicate_mutations"] == 0 and m["mutations_total"] == 4 * 5, m
    assert not reconcile_errors(orchestrators.logs())


def test_removing_a_cluster_mid_flight_does_not_strand_it(
    sim: Callable[..., Sim], objects: Objects, orchestrators: Orchestrators
) -> None:
    slow = {"cluster-00": {"stepSeconds": {"controlPlane": 2.0}}}
    fleet = sim(fleet_file(4, step=0.3, per_cluster=slow))
    orchestrators.start()
    objects.create_cv(
        cluster_version("fleet", fleet.address, ids(4), 2, strategy={"maxConcurrency": 1})
    )
    old = objects.current_run("fleet")
    wait_for(
        "cluster-00 upgrades its control plane",
        lambda: objects.upgrade_status(old, "cluster-00").get("phase") == "UpgradingControlPlane",
        timeout=60,
        interval=0.05,
    )
    remaining = ids(4)[1:]
    objects.patch_cv(
        "fleet", {"spec": {"clusters": [{"id": c, "version": NEW} for c in remaining]}}
    )
    wait_for(
        "the new run completes",
        lambda: (s := objects.cv_phase_is("fleet", "Completed")) and s["currentRun"] != old and s,
        timeout=90,
        interval=0.2,
    )
    old_status = wait_for("the old run ends", lambda: finished(objects, old), timeout=30)
    assert old_status["phase"] == "Stopped", old_status
    removed = objects.upgrade_status(old, "cluster-00")
    assert removed["phase"] not in ACTIVE, removed
    # The removed cluster finished the step it was in and is back in service; nothing more.
    state = fleet.cluster("cluster-00")
    assert state["inService"] is True, state
    assert state["controlPlaneVersion"] == NEW, state
    assert {p["version"] for p in state["nodePools"]} == {OLD}, state
    new = objects.cv_status("fleet")["currentRun"]
    ups = objects.upgrades(new)
    assert sorted(ups) == remaining
    assert all(u["status"]["phase"] == "Upgraded" for u in ups.values()), ups
    m = fleet.monitor()
    assert m["available_in_service"] == 4 and m["min_available_in_service"] >= 2, m
    # cluster-00: out, control plane, back in; the three others five steps each.
    assert m["mutations_total"] == 3 + 3 * 5 and m["duplicate_mutations"] == 0, m
    assert not reconcile_errors(orchestrators.logs())
